"""Screenshot observations (``prompt.observation: compact+screenshot``, ``screenshot``; issue 59 item 5): a real
rollout on the embedded sites in a real Chromium, acted by ``OpenAIPolicy`` against a scripted OpenAI-compatible
chat endpoint (an HTTP server of this test on 127.0.0.1) that checks it received a PNG of the page; ``final.png``
with ``env.screenshots``; the policies that cannot read an image are refused before anything starts."""

from __future__ import annotations

import asyncio
import base64
import io
from pathlib import Path
from types import SimpleNamespace

import pytest
from PIL import Image, ImageChops
from starlette.testclient import TestClient

from chat_endpoint import ChatHandler, serve
from webrl_core.agent.policy import HFPolicy, OpenAIPolicy, openai_app
from webrl_core.agent.rollout_policy import make_policy, rollout_identity
from webrl_core.artifacts import ArtifactRef
from webrl_core.compact_page import compact_page
from webrl_core.config import EnvConfig, PolicyConfig
from webrl_core.config_loader import load_config
from webrl_core.env.browser import BrowserPool
from webrl_core.env.rollout import FINAL_SCREENSHOT, rollout
from webrl_core.prompts import PromptFormat, build_chat_messages, build_prompt
from webrl_core.sites.oracle import OraclePolicy
from webrl_core.sites.server import EmbeddedSites
from webrl_core.sites.tasks import train_tasks

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
WIDTH, HEIGHT = 900, 640  # not the default viewport: the image's size must come from env.viewport_*
MODEL = "scripted-vlm"


def env_cfg(**kw) -> EnvConfig:
    return EnvConfig(**{"n_envs": 1, "viewport_width": WIDTH, "viewport_height": HEIGHT, "action_timeout_ms": 3000,
                        "settle_timeout_ms": 2000, **kw})


class ScriptedEndpoint(ChatHandler):
    """``POST /v1/chat/completions`` answers the ``script``'s action for the step (the number of assistant turns in
    the request) and records every request; a request whose last user turn has no PNG image part gets a 400, so
    the rollout fails. ``GET /v1/models`` lists the model with a ``root`` (what ``served_model_digest`` reads)."""

    script: list[str] = []
    models = {MODEL: "/m/qwen-vl"}

    def answer(self, body):
        parts = body["messages"][-1]["content"]
        images = [p for p in parts if p.get("type") == "image_url"] if isinstance(parts, list) else []
        if len(images) != 1 or \
                not base64.b64decode(images[0]["image_url"]["url"].split(",", 1)[1]).startswith(PNG_SIGNATURE):
            return 400, {"error": {"message": "expected one PNG image part in the last turn"}}
        return type(self).script[sum(m["role"] == "assistant" for m in body["messages"])]

    @classmethod
    def reset(cls, script: list[str]) -> None:
        cls.script = script
        cls.requests.clear()


@pytest.fixture(scope="module")
def sites():
    s = EmbeddedSites(data_seed=0).start()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def endpoint():
    with serve(ScriptedEndpoint):
        yield ScriptedEndpoint


@pytest.fixture(scope="module")
def demo(sites):
    """A navigation task (search, open a result, open its merge requests, exit) and the oracle's responses: the
    script the endpoint answers with, so the episode acts on real pages and succeeds."""
    [task] = train_tasks(1, seed=0, families=["gitlab.mr_nav"])
    [ep] = asyncio.run(rollout([task], OraclePolicy(), 1, cfg=env_cfg(), hooks=sites, progress=False))
    assert ep["env_score"] == 1.0 and ep["n_steps"] >= 3, ep["error"]
    return task, [s["response"] for s in ep["steps"]]


def image_of(request: dict) -> bytes:
    [part] = [p for p in request["messages"][-1]["content"] if p["type"] == "image_url"]
    head, data = part["image_url"]["url"].split(",", 1)
    assert head == "data:image/png;base64"
    return base64.b64decode(data)


def check_pngs(images: list[bytes], steps: list[dict]) -> list[Image.Image]:
    """Each is a PNG of the viewport; steps on different pages got different images."""
    out = []
    for png in images:
        assert png.startswith(PNG_SIGNATURE)
        img = Image.open(io.BytesIO(png))
        assert img.format == "PNG" and img.size == (WIDTH, HEIGHT)
        out.append(img.convert("RGB"))
    for i in range(len(steps) - 1):
        if steps[i]["url"] != steps[i + 1]["url"]:
            assert ImageChops.difference(out[i], out[i + 1]).getbbox() is not None, (i, steps[i]["url"])
    return out


def differing_pixels(a: Image.Image, b: Image.Image) -> int:
    """Pixels whose grey level differs by more than 16 (antialiasing apart)."""
    return sum(ImageChops.difference(a, b).convert("L").histogram()[17:])


async def own_screenshot(sites, task: dict, url: str) -> bytes:
    """A screenshot of ``url`` taken here, in a context of our own with the task's logins."""
    pool = BrowserPool(env_cfg())
    await pool.start()
    try:
        ctx = await pool.new_context(0)
        await sites.prepare_context(ctx, task, "own-screenshot")
        page = await ctx.new_page()
        await page.goto(url, wait_until="load")
        return await page.screenshot()
    finally:
        sites.end_episode("own-screenshot")
        await pool.close()


def test_compact_and_screenshot_reach_the_endpoint(sites, endpoint, demo, tmp_path):
    """``compact+screenshot``: every request's last user turn is the ``compact`` text part and a PNG of the page
    the action is chosen on; ``env.screenshots`` writes the same PNG per step and ``final.png``."""
    task, script = demo
    endpoint.reset(script)
    fmt = PromptFormat(observation="compact+screenshot")
    policy = OpenAIPolicy(endpoint.base_url, MODEL, PolicyConfig(), temperature=0.0, style="chat", compat=fmt)
    cfg = env_cfg(screenshots=True)
    [ep] = asyncio.run(rollout([task], policy, 1, cfg=cfg, hooks=sites, progress=False, prompt_compat=fmt,
                               screenshot_dir=tmp_path))
    assert ep["env_score"] == 1.0 and ep["error"] is None
    steps = ep["steps"]
    assert len(steps) == len(script) == len(endpoint.bodies()) >= 3
    compact = PromptFormat(observation="compact")
    past: list[str] = []
    for s, req in zip(steps, endpoint.bodies()):
        want = build_chat_messages(ep["intent"], past, s["html"], compat=compact)
        assert req["messages"][:-1] == want[:-1]
        text, _ = req["messages"][-1]["content"]
        assert text == {"type": "text", "text": want[-1]["content"]}
        assert compact_page(s["html"]) in text["text"] and "<a " not in text["text"]
        # the stored step keeps its prompt text, the compact one
        assert s["prompt"] == build_prompt(ep["intent"], past, s["html"], cfg.obs_char_budget, compat=compact)
        past.append(s["response"])
    images = [image_of(r) for r in endpoint.bodies()]
    check_pngs(images, steps)
    shots = tmp_path / ep["episode_id"]
    assert [(shots / f"{i}.png").read_bytes() for i in range(len(steps))] == images  # the viewer's PNGs
    final = (shots / FINAL_SCREENSHOT).read_bytes()
    assert final.startswith(PNG_SIGNATURE) and Image.open(io.BytesIO(final)).size == (WIDTH, HEIGHT)
    # the endpoint saw the start page: our own screenshot of it is the same picture
    own = Image.open(io.BytesIO(asyncio.run(own_screenshot(sites, task, steps[0]["url"])))).convert("RGB")
    sent = Image.open(io.BytesIO(images[0])).convert("RGB")
    assert differing_pixels(own, sent) < 0.01 * WIDTH * HEIGHT
    assert differing_pixels(own, Image.open(io.BytesIO(images[1])).convert("RGB")) > 0.01 * WIDTH * HEIGHT


def test_the_screenshot_replaces_the_page(sites, endpoint, demo, tmp_path):
    """``screenshot``: the text part keeps the intent and the history, nothing of the page; without
    ``env.screenshots`` nothing is written."""
    task, script = demo
    endpoint.reset(script)
    fmt = PromptFormat(observation="screenshot")
    policy = OpenAIPolicy(endpoint.base_url, MODEL, PolicyConfig(), temperature=0.0, style="chat", compat=fmt)
    [ep] = asyncio.run(rollout([task], policy, 1, cfg=env_cfg(), hooks=sites, progress=False, prompt_compat=fmt,
                               screenshot_dir=tmp_path))
    assert ep["env_score"] == 1.0 and len(endpoint.bodies()) == len(ep["steps"]) >= 3
    past: list[str] = []
    for s, req in zip(ep["steps"], endpoint.bodies()):
        text = req["messages"][-1]["content"][0]["text"]
        assert text == build_chat_messages(ep["intent"], past, "")[-1]["content"]
        assert (ep["intent"] in text) == (not past)  # round 0 states the task; later ones follow the history
        assert all(m["content"] == w["content"] for m, w in zip(req["messages"][:-1],
                                                                build_chat_messages(ep["intent"], past, "")))
        lines = [ln for ln in compact_page(s["html"]).splitlines() if len(ln.strip()) > 6]
        assert lines and not any(ln.strip() in text for ln in lines)
        assert s["prompt"] == build_prompt(ep["intent"], past, "", env_cfg().obs_char_budget)
        past.append(s["response"])
    check_pngs([image_of(r) for r in endpoint.bodies()], ep["steps"])
    assert not any(tmp_path.iterdir())


def test_the_rollout_identity_tells_the_observations_apart(endpoint):
    ids = {}
    for obs in ("compact", "compact+screenshot", "screenshot"):
        s = load_config(sets=["policy.backend=openai", f"policy.base_url={endpoint.base_url}",
                                      f"policy.model_name={MODEL}", "prompt.style=chat", f"prompt.observation={obs}"])
        ids[obs] = rollout_identity(s, None, 0.0, "eval")
    assert len({i["policy_digest"] for i in ids.values()}) == 1
    assert len({i["settings_digest"] for i in ids.values()}) == 3


@pytest.mark.parametrize("observation", ["compact+screenshot", "screenshot"])
def test_a_policy_without_image_input_is_refused_before_anything_starts(observation, tmp_path):
    fmt = PromptFormat(observation=observation)
    ref = ArtifactRef(path=str(tmp_path / "no-such-actor"), sha256="0" * 64, kind="model")
    pattern = rf"prompt.observation='{observation.replace('+', '[+]')}'.*policy.backend='hf'"
    with pytest.raises(ValueError, match=pattern):  # the config itself, when it loads
        load_config(sets=["policy.backend=hf", f"prompt.observation={observation}"])
    # settings built past the loader (model_copy skips validation) are refused by the stage too
    text = load_config(sets=["policy.backend=hf"])
    hf = text.model_copy(update={"prompt": text.prompt.model_copy(update={"observation": observation})})
    # the HF policy fails before it reads the (missing) checkpoint; the stage before it serves or browses
    with pytest.raises(ValueError, match=pattern):
        HFPolicy(tmp_path / "no-such-actor", style="chat", compat=fmt)
    with pytest.raises(ValueError, match=pattern):
        rollout_identity(hf, ref, 1.0, "rollout")
    with pytest.raises(ValueError, match=pattern):
        make_policy(hf, ref, 1.0, "rollout")
    with pytest.raises(ValueError, match=r"policy.backend='openai' with prompt.style='completion'"):
        OpenAIPolicy("http://127.0.0.1:9/v1", MODEL, style="completion", compat=fmt)
    served = load_config(sets=["policy.backend=openai", "serving.engine=webrl", "prompt.style=chat",
                                       f"prompt.observation={observation}"])
    with pytest.raises(ValueError, match=r"serving.engine='webrl'.*text-only"):
        rollout_identity(served, ref, 1.0, "rollout")
    # the scripted policies read no image: their rollouts go on
    rollout_identity(hf, None, 1.0, "oracle")


def test_the_project_server_refuses_an_image_part():
    """``openai_app`` serves a text-only causal LM: a message with content parts is a 400 naming why."""
    stub = SimpleNamespace(cfg=PolicyConfig(), temperature=0.0)
    with TestClient(openai_app(stub, model_name="webrl-actor")) as client:
        r = client.post("/v1/chat/completions", json={"model": "webrl-actor", "messages": [
            {"role": "user", "content": [{"type": "text", "text": "hi"},
                                         {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}}]}]})
    assert r.status_code == 400 and "reads text only" in r.json()["error"]["message"]

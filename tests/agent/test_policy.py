"""HFPolicy batched generation and OpenAIPolicy against a real local HTTP server serving the embedded model."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
import torch
import uvicorn

from webrl_core.agent_api import Policy, StepContext
from webrl_core.artifacts import sha256_path
from webrl_core.config import EmbeddedModelConfig, ModelsConfig, PolicyConfig
from webrl_core.learn.models import load_tokenizer
from webrl_core.learn.embedded_model import build_embedded_model, train_embedded_tokenizer
from webrl_core.agent.policy import HFPolicy, OpenAIPolicy, openai_app, served_model_digest
from webrl_core.identity import action_seed
from webrl_core.prompts import build_prompt
from webrl_core.hardware import free_port

ACTION = 'do(action="Click", element="3")'


def prompts(n: int) -> list[str]:
    return [build_prompt(f"Open item {i}", [ACTION] * (i % 3), f'<a id="3">item {i}</a>' * (1 + 7 * i))
            for i in range(n)]


@pytest.fixture(scope="module", params=["llama", "gpt_neox"])
def model_dir(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(request.param)
    train_embedded_tokenizer(prompts(6), 350, root / "tok")
    cfg = EmbeddedModelConfig(vocab_size=350, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=2,
                              max_length=256, arch=request.param)
    return build_embedded_model(root / "tok", cfg, root / "model", seed=0)


def test_hf_policy_batch_one_response_each_and_stops(model_dir):
    pol = HFPolicy(model_dir, PolicyConfig(max_new_tokens=12, batch_size=3), ModelsConfig(max_length=256),
                   temperature=0)
    assert isinstance(pol, Policy)
    ps = prompts(5) + ["x" * 3000]  # the last one is far longer than the model: cut at the observation
    out = asyncio.run(pol.act(ps))
    assert len(out) == len(ps) and all(isinstance(o, str) for o in out)
    # greedy: batched == one at a time (left padding + position ids are right)
    assert out[:3] == [pol.generate([p])[0] for p in ps[:3]]
    # stop token: a forward hook on the LM head makes <|eot_id|> win every step -> every response is empty
    eot = load_tokenizer(model_dir).convert_tokens_to_ids("<|eot_id|>")

    def favour_eot(module, inputs, output):
        output = output.clone()
        output[..., eot] += 1e4
        return output

    handle = pol.model.get_output_embeddings().register_forward_hook(favour_eot)
    try:
        assert pol.generate(ps[:2], temperature=0) == ["", ""]
        assert pol.generate(ps[:2], temperature=1.0) == ["", ""]
    finally:
        handle.remove()
    assert pol.generate(ps[:1]) == out[:1]


def test_hf_policy_sampling_varies(model_dir):
    pol = HFPolicy(model_dir, PolicyConfig(max_new_tokens=16, batch_size=4, top_p=1.0), ModelsConfig(max_length=256),
                   temperature=1.0)
    torch.manual_seed(0)
    outs = {pol.generate([prompts(1)[0]])[0] for _ in range(4)}
    assert len(outs) > 1  # random tiny model at T=1 samples different strings


def steps(n: int, episode: str = "rollout-p1-t-a0-0123456789abcdef") -> list[StepContext]:
    return [StepContext(task={"intent": f"Open item {i}"}, html="", url="", step=i, episode_id=episode)
            for i in range(n)]


def test_seeded_sampling_is_the_same_alone_in_any_batch_and_order(model_dir):
    pol = HFPolicy(model_dir, PolicyConfig(max_new_tokens=16, batch_size=3, top_p=0.95),
                   ModelsConfig(max_length=256), temperature=1.0)
    ps = prompts(5)
    seeds = [action_seed("ep", i) for i in range(5)]
    together = pol.generate(ps, seeds=seeds)  # two micro-batches of 3 and 2
    torch.manual_seed(123)  # the global RNG plays no part
    assert [pol.generate([p], seeds=[s])[0] for p, s in zip(ps, seeds)] == together
    assert pol.generate(ps[::-1], seeds=seeds[::-1])[::-1] == together
    # unseeded prompts (their seeds drawn from the global RNG) leave the seeded rows alone
    mixed = pol.generate([ps[4], "x", ps[0], "y"] + ps[1:4], seeds=[seeds[4], None, seeds[0], None] + seeds[1:4])
    assert [mixed[2], *mixed[4:], mixed[0]] == together
    # another seed, other draws: a random tiny model at T=1 differs on some of the prompts
    assert pol.generate(ps, seeds=[s + 1 for s in seeds]) != together
    # top-p keeps the smallest set reaching its mass: a tiny top_p leaves only the most likely token (greedy)
    narrow = HFPolicy(model_dir, PolicyConfig(max_new_tokens=16, batch_size=3, top_p=1e-6),
                      ModelsConfig(max_length=256), temperature=1.0)
    assert narrow.generate(ps, seeds=seeds) == narrow.generate(ps, temperature=0)


def test_act_seeds_each_step_from_its_episode_and_step(model_dir):
    cfg = PolicyConfig(max_new_tokens=16, batch_size=4, top_p=0.95)
    pol = HFPolicy(model_dir, cfg, ModelsConfig(max_length=256), temperature=1.0)
    ps, ctxs = prompts(4), steps(4)
    got = asyncio.run(pol.act(ps, ctxs))
    assert got == pol.generate(ps, seeds=[action_seed(c.episode_id, c.step) for c in ctxs])
    assert asyncio.run(pol.act(ps[2:], ctxs[2:])) == got[2:]
    # greedy ignores seeds; seeded=False samples from the global stream as before
    greedy = HFPolicy(model_dir, cfg, ModelsConfig(max_length=256), temperature=0)
    assert asyncio.run(greedy.act(ps, ctxs)) == greedy.generate(ps)
    unseeded = HFPolicy(model_dir, PolicyConfig(max_new_tokens=16, batch_size=4, top_p=0.95, seeded=False),
                        ModelsConfig(max_length=256), temperature=1.0)
    torch.manual_seed(7)
    first = asyncio.run(unseeded.act(ps, ctxs))
    torch.manual_seed(7)
    assert first == unseeded.generate(ps)


@contextlib.contextmanager
def served(app):
    """``app`` served by uvicorn on a free 127.0.0.1 port for the block; yields its ``/v1`` base URL."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    th = threading.Thread(target=server.run, daemon=True)
    th.start()
    try:
        for _ in range(200):
            if server.started:
                break
            time.sleep(0.05)
        assert server.started
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        server.should_exit = True
        th.join(timeout=10)


def test_openai_policy_against_real_server(model_dir):
    hf = HFPolicy(model_dir, PolicyConfig(max_new_tokens=10, batch_size=8), ModelsConfig(max_length=256),
                  temperature=0)
    with served(openai_app(hf, model_name="tiny")) as url:
        client = OpenAIPolicy(url, "tiny", PolicyConfig(max_new_tokens=10, concurrency=4), temperature=0)
        ps = prompts(6)
        got = asyncio.run(client.act(ps))
        assert got == hf.generate(ps)  # same greedy text over real HTTP
        chat = OpenAIPolicy(url, "tiny", PolicyConfig(max_new_tokens=10), temperature=0, style="chat")
        assert asyncio.run(chat.act(ps[:1])) == hf.generate(ps[:1])  # no chat template: last user turn is the prompt
        bad = OpenAIPolicy(f"{url}/nope", "tiny", PolicyConfig(), retries=1)
        with pytest.raises(RuntimeError, match="failed"):
            asyncio.run(bad.act(ps[:1]))
        # GET /models: the server's extra card field (the checkpoint's digest) is what the endpoint vouches for
        assert served_model_digest(url, "tiny") == sha256_path(model_dir)
        with pytest.raises(RuntimeError, match=r"does not serve policy.model_name='other'; it serves \['tiny'\]"):
            served_model_digest(url, "other")
    with pytest.raises(ValueError, match="base_url"):
        OpenAIPolicy("localhost", "tiny")


def test_served_seed_reaches_the_model_whatever_arrives_with_it(model_dir):
    hf = HFPolicy(model_dir, PolicyConfig(max_new_tokens=12, batch_size=8, top_p=0.95), ModelsConfig(max_length=256),
                  temperature=1.0)
    with served(openai_app(hf, model_name="tiny", batch_wait_s=0.05)) as url:
        client = OpenAIPolicy(url, "tiny", PolicyConfig(max_new_tokens=12, top_p=0.95, concurrency=8),
                              temperature=1.0)
        ps, ctxs = prompts(5), steps(5)
        together = asyncio.run(client.act(ps, ctxs))  # one served batch
        assert [asyncio.run(client.act([p], [c]))[0] for p, c in zip(ps, ctxs)] == together
        assert together == hf.generate(ps, seeds=[action_seed(c.episode_id, c.step) for c in ctxs])
        # the raw API: the same seed, the same text; a seed that is not an integer is refused by name
        body = {"model": "tiny", "prompt": ps[0], "max_tokens": 12, "temperature": 1.0}
        same = {httpx.post(f"{url}/completions", json={**body, "seed": 42}, timeout=30).json()["choices"][0]["text"]
                for _ in range(2)}
        assert len(same) == 1
        for bad in ("42", 1.5, True, 1 << 64):
            r = httpx.post(f"{url}/completions", json={**body, "seed": bad}, timeout=30)
            assert r.status_code == 400 and "'seed'" in r.json()["error"]["message"]
        r = httpx.post(f"{url}/chat/completions", json={"model": "tiny", "seed": "x",
                                                         "messages": [{"role": "user", "content": ps[0]}]}, timeout=30)
        assert r.status_code == 400 and "'seed'" in r.json()["error"]["message"]
        # the request's top_p, not the server's: a tiny nucleus leaves the most likely token, the greedy text
        narrow = httpx.post(f"{url}/completions", json={**body, "seed": 42, "top_p": 1e-6}, timeout=30).json()
        assert narrow["choices"][0]["text"] == hf.generate([ps[0]], temperature=0.0, max_new_tokens=12)[0]
        for bad in (0, 1.5, "0.9", True):
            r = httpx.post(f"{url}/completions", json={**body, "top_p": bad}, timeout=30)
            assert r.status_code == 400 and "'top_p'" in r.json()["error"]["message"]


class _Stub(BaseHTTPRequestHandler):
    """An OpenAI-compatible endpoint that records requests and answers as ``mode`` says."""

    mode = "ok"
    requests: list = []

    def log_message(self, *a):
        pass

    def _send(self, code: int, body: str, ctype: str = "application/json"):
        b = body.encode()
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(b)))
        self.end_headers()
        self.wfile.write(b)

    def do_GET(self):
        self._send(200, json.dumps({"object": "list", "data": [{"id": "m", "object": "model", "root": "/w/m"}]}))

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).requests.append({"path": self.path, "body": body, "auth": self.headers.get("Authorization")})
        if self.mode == "fail":
            self._send(503, '{"error": {"message": "overloaded"}}')
        elif self.mode == "garbage":
            self._send(200, "<html>nginx default page</html>", "text/html")
        else:
            self._send(200, json.dumps({"id": "c", "object": "text_completion", "created": 0, "model": body["model"],
                                        "choices": [{"index": 0, "text": "do()", "finish_reason": "stop"}]}))


@pytest.fixture
def stub():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Stub)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    _Stub.mode, _Stub.requests = "ok", []
    yield f"http://127.0.0.1:{srv.server_address[1]}/v1"
    srv.shutdown()


def test_openai_policy_requests_retries_and_errors(stub):
    cfg = PolicyConfig(max_new_tokens=7, top_p=0.9)
    assert asyncio.run(OpenAIPolicy(stub, "m", cfg, temperature=0, api_key="sk-1").act(["p"])) == ["do()"]
    assert asyncio.run(OpenAIPolicy(stub, "m", cfg, temperature=0.5).act(["q"])) == ["do()"]
    greedy, sampled = _Stub.requests
    assert greedy["path"] == "/v1/completions" and greedy["auth"] == "Bearer sk-1"
    assert greedy["body"] == {"model": "m", "prompt": "p", "max_tokens": 7, "temperature": 0, "stop": ["<|eot_id|>"]}
    assert sampled["body"]["top_p"] == 0.9 and sampled["body"]["temperature"] == 0.5
    assert "seed" not in sampled["body"]  # no step context, nothing to seed from
    # a sampled step sends the OpenAI API's `seed` of its episode and step; greedy or seeded=False sends none
    ctx = steps(3)[2]
    _Stub.requests = []
    for policy in (OpenAIPolicy(stub, "m", cfg, temperature=0.5), OpenAIPolicy(stub, "m", cfg, temperature=0),
                   OpenAIPolicy(stub, "m", PolicyConfig(seeded=False), temperature=0.5)):
        asyncio.run(policy.act(["p"], [ctx]))
    assert [r["body"].get("seed") for r in _Stub.requests] == [action_seed(ctx.episode_id, 2), None, None]
    _Stub.requests = []
    # a failing endpoint: `retries` tries in all (the SDK retries 5xx), then an error naming the URL
    _Stub.mode, _Stub.requests = "fail", []
    with pytest.raises(RuntimeError, match=rf"request to {stub}/completions \(model 'm'\) failed: .*503"):
        asyncio.run(OpenAIPolicy(stub, "m", cfg, retries=2).act(["p"]))
    assert len(_Stub.requests) == 2
    # not an OpenAI answer: no retry, the error shows what came back
    _Stub.mode, _Stub.requests = "garbage", []
    with pytest.raises(RuntimeError, match=rf"{stub}/chat/completions \(model 'm'\) answered "
                                           r"'<html>nginx default page</html>', not a completion"):
        asyncio.run(OpenAIPolicy(stub, "m", cfg, style="chat", retries=3).act(["p"]))
    assert len(_Stub.requests) == 1
    assert served_model_digest(stub, "m") == "/w/m"  # vLLM reports the weights' path as `root`


def test_served_model_digest_names_the_url_of_a_dead_endpoint():
    url = f"http://127.0.0.1:{free_port()}/v1"
    with pytest.raises(RuntimeError, match=rf"policy.base_url='{url}' did not answer GET {url}/models: "
                                           r"APIConnectionError"):
        served_model_digest(url, "m", timeout_s=2)
    with pytest.raises(ValueError, match="policy.model_name is empty"):
        served_model_digest(url, "")


def _dense_nucleus(probs: torch.Tensor, top_p: float) -> tuple[list[int], list[float]]:
    """The nucleus by a sort of the whole vocabulary (what ``nucleus`` must equal)."""
    top, ids = probs.sort(descending=True, stable=True)
    before = top.cumsum(-1) - top
    keep = max(1, int((before < top_p).sum()))
    return ids[:keep].tolist(), top[:keep].tolist()


@pytest.mark.parametrize("top_p", [1e-6, 0.5, 0.9, 0.99])
def test_nucleus_equals_the_full_sort_whether_or_not_the_candidates_hold_it(top_p):
    from webrl_core.agent.policy import nucleus

    gen = torch.Generator().manual_seed(0)
    fell_back = fast = 0
    for sharpness in (0.5, 2.0, 6.0, 12.0):  # flat rows reach past 64 candidates, peaked ones do not
        for _ in range(10):
            probs = torch.softmax(torch.randn(5000, generator=gen) * sharpness, -1)
            ids, kept = nucleus(probs, top_p, candidates=64)
            want_ids, want_p = _dense_nucleus(probs, top_p)
            assert ids.tolist() == want_ids
            torch.testing.assert_close(kept, torch.tensor(want_p))
            held = float(probs.topk(64).values.sum()) >= top_p
            fast, fell_back = fast + held, fell_back + (not held)
    assert fast and (fell_back or top_p < 0.5)  # both paths were exercised
    everything, p = nucleus(torch.tensor([0.2, 0.5, 0.3]), 1.0)
    assert everything.tolist() == [0, 1, 2] and p.tolist() == pytest.approx([0.2, 0.5, 0.3])


def test_the_sampler_draws_in_proportion_to_the_nucleus():
    from webrl_core.agent.policy import SeededRowSampler

    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05] + [1e-9] * 200]))
    sampler = SeededRowSampler([7], temperature=1.0, top_p=0.9)  # keeps 0.5, 0.3, 0.15
    draws = [int(sampler(None, logits.clone()).argmax()) for _ in range(4000)]
    freq = [draws.count(t) / len(draws) for t in range(4)]
    assert freq[3] == 0 and all(abs(f - p / 0.95) < 0.03 for f, p in zip(freq, (0.5, 0.3, 0.15)))

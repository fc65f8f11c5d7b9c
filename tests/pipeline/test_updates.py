"""A phase never hands on a model it did not train, and never evolves tasks from nothing (webrl_core.pipeline)."""

from __future__ import annotations

from pathlib import Path

import pytest

from webrl_core.config_loader import load_config
from webrl_core.pipeline.generation import NoSeedTasks, generate_tasks
from webrl_core.pipeline.updates import NoTrainingData, train_model


def test_no_samples_or_no_trained_sample_fails_and_publishes_nothing(tmp_path):
    out, real = tmp_path / "phase=1" / "actor", tmp_path / "phase=1" / ".versions" / "actor@x"
    out.parent.mkdir(parents=True)
    with pytest.raises(NoTrainingData, match="actor update has 0 samples"):
        train_model("actor", 1, out, real, [], lambda s, d: {"n_train": 1})

    def masked(samples, dst):
        dst.mkdir(parents=True)
        return {"n_samples": len(samples), "n_train": 0}

    with pytest.raises(NoTrainingData, match="kept 0 of 2 samples"):
        train_model("actor", 1, out, real, [{"x": 1}, {"x": 2}], masked)
    assert not out.exists()

    def trains(samples, dst):
        dst.mkdir(parents=True, exist_ok=True)
        (dst / "w").write_text("new")
        return {"n_train": len(samples)}

    ref, metrics = train_model("critic", 1, out, real, [{"x": 1}], trains)
    assert metrics["n_train"] == 1 and (out / "w").read_text() == "new" and Path(ref.path) == real.resolve()


def test_phase1_without_seed_rollouts_fails_with_the_fix(tmp_path):
    s = load_config("smoke", sets=[f"run.root={tmp_path}"])
    run_dir = tmp_path / "run"
    actor = run_dir / "models" / "phase=0" / "actor"
    actor.mkdir(parents=True)
    (actor / "config.json").write_text("{}")
    with pytest.raises(NoSeedTasks, match=r"(?s)phase 1: phase 0 has no labelled 'bootstrap' episodes.*"
                                          r"curriculum.seed_tasks"):
        generate_tasks(s, str(run_dir), 1, "bootstrap")


def test_the_critic_trains_on_the_replay_only_when_asked(tmp_path):
    """``critic.replay``: the official buffer (the phase's transitions + the replayed successes) or the phase's own
    transitions only; the actor's data is not affected by it."""
    from webrl_core.artifacts import ArtifactRef, write_jsonl
    from webrl_core.config import EmbeddedModelConfig
    from webrl_core.learn.embedded_model import build_embedded_model, train_embedded_tokenizer
    from webrl_core.learn.critic_trainer import train_critic
    from webrl_core.learn.transitions import build_transitions
    from webrl_core.pipeline.updates import update_critic
    from webrl_core.prompts import build_prompt

    def episode(e, ok):
        ep = {"episode_id": f"e{e}", "success": ok, "intent": f"open item {e}"}
        return ep, [{"idx": k, "prompt": build_prompt(ep["intent"], [], f"<p>page {e} {k}</p>"), "response": f"r{k}"}
                    for k in range(2)]

    own, replay = build_transitions([episode(0, False), episode(1, True)]), build_transitions([episode(2, True)] * 3)
    train_embedded_tokenizer([s["observation"] + s["action"] for s in own + replay], 300, tmp_path / "tok")
    backbone = build_embedded_model(tmp_path / "tok", EmbeddedModelConfig(
        vocab_size=300, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=2, max_length=256),
        tmp_path / "backbone", seed=1)
    sets = ["models.device=cpu", "models.max_length=256", "critic.batch_size=2", "critic.micro_batch_size=2"]
    s = load_config(sets=sets)
    train_critic(own, backbone, tmp_path / "critic0", s, max_steps=1)
    refs = [ArtifactRef.of(write_jsonl(own, tmp_path / "own.jsonl"), "file"),
            ArtifactRef.of(write_jsonl(replay, tmp_path / "replay.jsonl"), "file"),
            ArtifactRef.of(backbone, "model"), ArtifactRef.of(tmp_path / "critic0", "model")]
    counts = {}
    for flag in ("true", "false"):
        _, metrics = update_critic(load_config(sets=sets + [f"critic.replay={flag}"]), str(tmp_path / flag), 1, *refs)
        counts[flag] = metrics["n_samples"]
    assert counts == {"true": len(own) + len(replay), "false": len(own)}

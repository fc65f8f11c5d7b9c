"""A phase never hands on a model it did not train, and never evolves tasks from nothing (webrl_core.pipeline)."""

from __future__ import annotations

from pathlib import Path

import pytest

from webrl_core.config import load_config
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

"""The ablation's pieces (webrl_core.experiments.ablation): the bootstrap fork, the summary over seeds, the table and Fig. 5's
verdict, the plot."""

from __future__ import annotations

import json
import os

import pytest

from webrl_core.experiments import ablation
from webrl_core.artifacts import ArtifactRef
from webrl_core.runs.rundir import publish
from webrl_core.runs.store import TrajectoryStore


def _bootstrap(root, tag="a"):
    """A run dir with what a bootstrap leaves: published phase-0 models, phase-0 episodes and tasks, its eval."""
    for name in ("actor", "critic"):
        real = root / "models" / "phase=0" / ".versions" / f"{name}@{tag}"
        real.mkdir(parents=True)
        (real / "config.json").write_text(json.dumps({"name": name, "tag": tag}))
        publish(root / "models" / "phase=0" / name, real)
    store = TrajectoryStore(root)
    ep = {"episode_id": "bootstrap-1", "task_id": "t1", "phase": 0, "policy_id": "p", "purpose": "bootstrap",
          "status": "done", "final_answer": None, "env_score": 0.0, "orm_score": None, "success": False, "n_steps": 1,
          "started_at": None, "wall_s": None, "policy_s": None, "env_s": None, "error": None, "intent": "buy",
          "site": "shopping", "seed": 0, "policy_digest": "hf:x", "settings_digest": "s"}
    step = {"episode_id": "bootstrap-1", "idx": 0, "prompt": "p", "html": "<p>", "response": "r", "action": "null",
            "url": None, "reward": 0.0, "done": True, "mc_return": None, "policy_s": None, "action_s": None,
            "obs_s": None, "error": None}
    store.write_episodes([(ep, [step])])
    (root / "eval").mkdir()
    (root / "eval" / "phase=0.json").write_text("{}")
    return root


def test_fork_links_models_copies_phase0_and_is_idempotent(tmp_path):
    boot = _bootstrap(tmp_path / "boot")
    dst = tmp_path / "seed=0" / "webrl"
    mark = ablation.fork_bootstrap(boot, dst)
    for name in ("actor", "critic"):
        assert ArtifactRef.of(dst / "models" / "phase=0" / name).sha256 == mark["models"][f"phase=0/{name}"]
        assert (dst / "models" / "phase=0" / name).resolve() == (boot / "models" / "phase=0" / name).resolve()
    eps = TrajectoryStore(dst).episodes(phase=0)
    assert [e["episode_id"] for e in eps] == ["bootstrap-1"]
    assert [s["response"] for s in TrajectoryStore(dst).steps(phase=0)] == ["r"]
    assert (dst / "eval" / "phase=0.json").is_file()
    assert ablation.fork_bootstrap(boot, dst) == mark  # again: nothing changes
    assert len(TrajectoryStore(dst).episodes(phase=0)) == 1

    # a fork cut short (no mark yet) is completed, not refused
    (dst / ablation.FORK_MARK).unlink()
    os.unlink(dst / "models" / "phase=0" / "critic")
    assert ablation.fork_bootstrap(boot, dst)["models"] == mark["models"]

    # another bootstrap is refused, whichever way the run dir got its models
    other = _bootstrap(tmp_path / "other", tag="b")
    with pytest.raises(ablation.ForkError, match="forked from another phase 0"):
        ablation.fork_bootstrap(other, dst)
    (dst / ablation.FORK_MARK).unlink()
    with pytest.raises(ablation.ForkError, match="already holds a phase=0/actor of its own"):
        ablation.fork_bootstrap(other, dst)
    with pytest.raises(ablation.ForkError, match="no phase-0 actor"):
        ablation.fork_bootstrap(tmp_path / "empty", tmp_path / "x")


def test_summary_table_verdict_and_plot(tmp_path):
    rows = [{"variant": v, "seed": s, "phase": p, "success": base + p * step + 0.01 * s}
            for v, base, step in (("webrl", 0.1, 0.10), ("no-replay", 0.1, 0.05), ("no-kl-no-replay", 0.1, -0.02))
            for s in (0, 1) for p in (0, 1, 2)]
    summary = ablation.summarise(rows)
    assert [s["variant"] for s in summary][:3] == ["webrl"] * 3 and len(summary) == 9
    top = next(s for s in summary if s["variant"] == "webrl" and s["phase"] == 2)
    assert top["seeds"] == 2 and top["min"] == pytest.approx(0.3) and top["max"] == pytest.approx(0.31)
    assert top["mean"] == pytest.approx(0.305)
    table = ablation.markdown(summary)
    assert "| variant | SFT | phase 1 | phase 2 |" in table and "| webrl | 10.5 (10.0-11.0) |" in table
    assert ablation.fig5_order(summary) == ("phase 2: webrl 30.5% > no-replay 20.5% > no-kl-no-replay 6.5%; "
                                            "Fig. 5's order holds")
    tied = [dict(r, success=0.0) for r in rows]
    assert ablation.fig5_order(ablation.summarise(tied)) == (
        "phase 2: webrl 0.0% = no-replay 0.0% = no-kl-no-replay 0.0%; Fig. 5's order does not hold")
    assert ablation.fig5_order(ablation.summarise(rows[:3])).startswith("incomplete")
    # an ablation asked for one variant has no order to check, and does not blame the variants it never ran
    assert ablation.fig5_order(ablation.summarise(rows[:3]), ["webrl"]) == (
        "Fig. 5's order not checked: it needs webrl, no-replay, no-kl-no-replay; this ablation ran webrl")
    # seed 1 of no-kl-no-replay stopped after phase 1: its phase-2 cell has one seed, and says so; the stop is named
    partial = [r for r in rows if not (r["variant"] == "no-kl-no-replay" and r["seed"] == 1 and r["phase"] == 2)]
    table = ablation.markdown(ablation.summarise(partial))
    assert "| no-kl-no-replay | 10.5 (10.0-11.0) | 8.5 (8.0-9.0) | 6.0 (6.0-6.0) [1 of 2 seeds] |" in table
    assert "[1 of" not in table.split("no-kl-no-replay")[0]
    only_two = [r for r in rows if not (r["variant"] == "no-kl-no-replay" and r["phase"] == 2)]
    assert ablation.fig5_order(ablation.summarise(only_two)) == "incomplete: no-kl-no-replay did not reach phase 2"
    stop = {"variant": "no-kl-no-replay", "seed": 1, "phase": 2, "reason": "NoTrainingData: phase 2: kept 0 of 9"}
    assert ablation.stops_markdown([stop]).endswith(
        "- no-kl-no-replay, seed 1: stopped at phase 2 (NoTrainingData: phase 2: kept 0 of 9)\n")
    assert ablation.stops_markdown([]) == ""
    png = ablation.plot(summary, tmp_path / "p" / "ablation.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="unknown ablation variant 'no-kl'"):
        ablation.variant_overrides("no-kl")


def test_an_existing_run_as_the_bootstrap_must_fit_the_ablation(tmp_path):
    from webrl_core.config_loader import load_config
    from webrl_core.pipeline.validate import record_config

    boot = _bootstrap(tmp_path / "boot")
    with pytest.raises(ablation.ForkError, match="no phase-0 actor or no config.yaml"):
        ablation.check_shared_bootstrap(boot, load_config("smoke"), [0])
    record_config(boot, load_config("smoke", sets=["run.seed=3"]))
    ablation.check_shared_bootstrap(boot, load_config("smoke", sets=["replay.low=0.1"]), [3])  # phases may differ
    with pytest.raises(ablation.ForkError, match=r"run.seed is 3.*--seeds 3"):
        ablation.check_shared_bootstrap(boot, load_config("smoke"), [0, 3])
    with pytest.raises(ablation.ForkError, match=r"eval.max_tasks is 6 .* but 3"):
        ablation.check_shared_bootstrap(boot, load_config("smoke", sets=["eval.max_tasks=3"]), [3])
    with pytest.raises(ablation.ForkError, match="no phase-0 actor"):
        ablation.check_shared_bootstrap(tmp_path / "empty", load_config("smoke"), [0])

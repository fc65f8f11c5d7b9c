"""The other recipes end to end on the smoke config, from the session's smoke run's phase 0 (`webrl ablate
--variants grpo,pae --bootstrap`): WebAgent-R1's GRPO (groups of episodes per training-pool task, no critic stage)
and PAE (proposed tasks, a zero-shot judge's labels, filtered BC), the comparison's cost, per-site and paired tables,
and `webrl reproduce` on a GRPO phase."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from shared_prefect import WEBRL, prefect_env, webrl
from webrl_core.artifacts import ArtifactRef
from webrl_core.pretrained import resolve_model_ref
from webrl_core.runs.store import TrajectoryStore

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]


def test_grpo_and_pae_phases_from_one_start(tmp_path, smoke_run):
    if not Path(resolve_model_ref("smollm2-135m-instruct")).is_dir():
        pytest.skip("PAE's judge is SmolLM2-135M-Instruct: run `make setup` to convert it")
    _, _, boot = smoke_run
    root = tmp_path / "recipes"
    r = subprocess.run([WEBRL, "ablate", "--config", "smoke", "--phases", "1", "--seeds", "0", "--variants",
                        "grpo,pae", "--run-dir", str(root), "--bootstrap", str(boot), "--set", f"run.root={tmp_path}",
                        "--set", "curriculum.tasks_per_phase=3"],
                       env=prefect_env(tmp_path), capture_output=True, text=True, timeout=1700)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-5000:]
    start = ArtifactRef.of(boot / "models" / "phase=0" / "actor").sha256
    reports = {}
    for v in ("grpo", "pae"):
        vdir = root / "seed=0" / v
        rep = reports[v] = json.loads((vdir / "reports" / "phase=1.json").read_text())
        assert rep["recipe"] == v and rep["critic_stage"].startswith("none")
        assert not (vdir / "models" / "phase=1" / "critic").exists()  # no critic stage ran
        assert ArtifactRef.of(vdir / "models" / "phase=1" / "actor").sha256 != start
        assert isinstance(rep["phase_wall_s"], float) and rep["phase_wall_s"] > 0

    # GRPO: 4 episodes of each of the 3 training-pool tasks, one group per task
    store = TrajectoryStore(root / "seed=0" / "grpo")
    groups = store.sql("SELECT task_id, count(*) AS n FROM episodes WHERE phase = 1 AND purpose = 'rollout' GROUP BY 1")
    assert sorted(g["n"] for g in groups) == [4, 4, 4]
    grpo = reports["grpo"]
    assert grpo["rollout_episodes"] == 12 and grpo["actor_n_groups"] == 3 and grpo["actor_n_episodes"] == 12
    assert grpo["actor_n_train"] == grpo["actor_n_samples"] > 0  # beta > 0: zero-advantage steps train the KL

    # PAE: the judge labelled the episodes, and its agreement with the sites' evaluators is reported
    pae = reports["pae"]
    assert pae["reward_source"] == "judge" and 0.0 <= pae["judge_accuracy"] <= 1.0
    assert pae["judge_yes"] + pae["judge_unparsed"] <= pae["rollout_episodes"]
    assert pae["proposed_judge_only"] == 0 and pae["generated"] == 3  # the embedded proposer: scoreable tasks
    # filtered BC trains on the judged successes only, the shortest of each task's (one episode a task here)
    assert pae["actor_n_successful_episodes"] == pae["judge_yes"] and pae["actor_n_kept_episodes"] <= pae["judge_yes"]

    report = (root / "ablation.md").read_text()
    for section in ("Cost per phase", "Test success per site", "Tasks lost and gained"):
        assert section in report
    for row in ("| grpo | 1 |", "| pae | 1 |", "| 0 | start -> grpo |", "| 0 | grpo -> pae |"):
        assert row in report, report

    out = webrl(tmp_path, "reproduce", str(root / "seed=0" / "grpo"), "--phase", "1")
    assert "all outputs match" in out.stdout, out.stdout

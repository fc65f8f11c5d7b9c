"""`webrl ablate` on the smoke config: one bootstrap shared by every variant (forked, never re-run), one phase per
variant, the table, the plot and Fig. 5's verdict; a fork onto another bootstrap is refused. The bootstrap is the
session's smoke run (`--bootstrap`, conftest.smoke_run): the per-seed bootstrap of `webrl ablate` is `webrl
bootstrap` itself, which that run covers."""

from __future__ import annotations

import json
import subprocess

import pytest

from shared_prefect import WEBRL, prefect_env
from webrl_core.experiments import ablation
from webrl_core.artifacts import ArtifactRef
from webrl_core.runs.store import TrajectoryStore

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]


def test_ablation_shares_one_bootstrap_and_reports_every_variant(tmp_path, smoke_run):
    _, _, boot = smoke_run
    env = prefect_env(tmp_path)
    root = tmp_path / "abl"
    args = [WEBRL, "ablate", "--config", "smoke", "--phases", "1", "--run-dir", str(root),
            "--set", f"run.root={tmp_path}", "--bootstrap", str(boot)]
    bad = subprocess.run([*args, "--seeds", "0,1"], env=env, capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "its run.seed is 0" in bad.stderr, bad.stdout + bad.stderr  # before any work
    assert not root.exists()
    r = subprocess.run([*args, "--seeds", "0"], env=env, capture_output=True, text=True, timeout=1700)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-5000:]
    seed = root / "seed=0"
    assert not (seed / "bootstrap").exists()  # no bootstrap of its own
    boot_actor = ArtifactRef.of(boot / "models" / "phase=0" / "actor")
    actors, rollouts, replayed = {}, {}, {}
    for v in ablation.VARIANTS:
        vdir = seed / v
        assert ArtifactRef.of(vdir / "models" / "phase=0" / "actor").sha256 == boot_actor.sha256
        assert not (vdir / "models" / "phase=0" / ".versions").exists()  # forked, not trained again
        actors[v] = ArtifactRef.of(vdir / "models" / "phase=1" / "actor").sha256
        store = TrajectoryStore(vdir)
        phase1 = store.sql("SELECT DISTINCT policy_digest FROM episodes WHERE phase = 1 AND purpose = 'rollout'")
        assert [x["policy_digest"] for x in phase1] == [f"hf:{boot_actor.sha256}"]  # all start from the same SFT
        rollouts[v] = store.sql("SELECT s.episode_id, s.idx, s.response FROM steps s JOIN episodes e USING "
                                "(episode_id) WHERE e.phase = 1 AND e.purpose = 'rollout' ORDER BY 1, 2")
        replayed[v] = json.loads((vdir / "reports" / "phase=1.json").read_text()).get("replay_kept", 0)
        cfg = json.loads(json.dumps(__import__("yaml").safe_load((vdir / "config.yaml").read_text())))
        assert cfg["replay"]["enabled"] is (v == "webrl")
        assert cfg["actor"]["kl"] is (v != "no-kl-no-replay")
    # per-action seeds (policy.seeded): the same SFT actor samples the same phase-1 episodes in every variant, so
    # the variants differ only in their update
    assert rollouts["webrl"] and rollouts["webrl"] == rollouts["no-replay"] == rollouts["no-kl-no-replay"]
    assert actors["no-replay"] != actors["no-kl-no-replay"]  # the KL-constrained update vs plain fine-tuning
    assert (actors["webrl"] != actors["no-replay"]) is (replayed["webrl"] > 0)  # replay is all that separates them
    report = (root / "ablation.md").read_text()
    for v in ablation.VARIANTS:
        assert f"| {v} |" in report
    assert "Fig. 5's order" in report
    assert (root / "ablation.png").stat().st_size > 1000
    assert "| webrl |" in r.stdout

    # a variant dir forked from one bootstrap is never re-forked from another
    other = tmp_path / "other"
    (other / "models" / "phase=0" / "actor").mkdir(parents=True)
    (other / "models" / "phase=0" / "actor" / "config.json").write_text("{}")
    with pytest.raises(ablation.ForkError, match="forked from another phase 0"):
        ablation.fork_bootstrap(other, seed / "webrl")

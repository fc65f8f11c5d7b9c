"""The real-model path, end to end, as a GPU user runs it (README, "The real path"), on the embedded sites served as
WebArena: `webrl sites serve`, `webrl webarena login`, `webrl webarena local-setup`, then
`webrl train --config webarena-local --phases 2` with every rollout through the serving stage.

Checks the loop closes: phase k's rollouts are acted by the served actor k-1 (policy identities), each phase's
evaluation by its own output, the actor's weights change in every phase, no update published an untrained model,
and no serving engine is left running."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file

from shared_prefect import WEBRL, prefect_env, webrl
from webrl_core.artifacts import ArtifactRef
from webrl_core.runs.store import TrajectoryStore

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]
# small, and replay open to every earlier success (replay.low=0): a minute of SFT on 24 demonstrations leaves the tiny
# model's 1/PPL on them mostly below the paper's 0.5 (the full webarena-local config replays 77 of 299 with the
# paper's window); this test is about the loop, not the window
SMALL = ["env.n_envs=2", "env.max_steps=4", "curriculum.tasks_per_phase=3", "eval.max_tasks=3",
         "bootstrap.sft_epochs=4", "policy.max_new_tokens=32", "replay.low=0.0"]


@pytest.fixture
def served_sites(tmp_path):
    """`webrl sites serve` in its own process; the env vars a WebArena user sets, pointing at it."""
    env = prefect_env(tmp_path)
    for k in ("SHOPPING", "SHOPPING_ADMIN", "GITLAB", "REDDIT", "MAP"):  # the served sites', not the shell's
        env.pop(k, None)
    proc = subprocess.Popen([WEBRL, "sites", "serve"], cwd=tmp_path, env=env, stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line or line.startswith("Serving"):
                break
            site, url = line.split()[:2]
            env[site.upper()] = url
        assert {"SHOPPING", "SHOPPING_ADMIN", "GITLAB", "REDDIT", "MAP"} <= set(env), "sites did not start"
        yield env
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(timeout=30)


def _engines(folder: Path) -> list[str]:
    """Our engines serving a model from `folder` (other tests may run engines of their own at the same time)."""
    return subprocess.run(["pgrep", "-f", f"webrl_core.agent.serve_hf --model {folder}"], capture_output=True,
                          text=True).stdout.split()


def test_webarena_local_closes_the_phase_loop(tmp_path, served_sites):
    env = served_sites
    webrl(tmp_path, "webarena", "login", env=env, cwd=tmp_path)
    assert (tmp_path / ".auth" / "shopping_state.json").is_file()
    webrl(tmp_path, "webarena", "local-setup", "--demo-tasks", "24", "--seed-tasks", "6", "--n-envs", "2",
          env=env, cwd=tmp_path)
    inputs = tmp_path / "runs" / "webarena-local-inputs"
    demos = json.loads((inputs / "sft_demos.sharegpt.json").read_text())
    assert demos and demos[0]["conversations"][0]["from"] == "human"
    sets = [a for kv in SMALL for a in ("--set", kv)]
    webrl(tmp_path, "train", "--config", "webarena-local", "--phases", "2", *sets, timeout=1700, env=env, cwd=tmp_path)

    run = tmp_path / "runs" / "webarena-local"
    actors = [ArtifactRef.of(run / "models" / f"phase={k}" / "actor", "model") for k in range(3)]
    base = ArtifactRef.of(inputs / "base-model", "model")
    assert len({base.sha256, *(a.sha256 for a in actors)}) == 4, "a phase published an unchanged actor"
    weights = [load_file(str(Path(a.path) / "model.safetensors")) for a in [base, *actors]]
    for before, after in zip(weights, weights[1:]):  # every phase moved the weights
        assert any(not before[n].equal(after[n]) for n in before)

    served = [f"webrl:webrl-actor@hf:{a.sha256}" for a in actors]
    rows = TrajectoryStore(run).sql("SELECT phase, purpose, policy_digest, count(*) AS n FROM episodes "
                                    "WHERE NOT starts_with(policy_digest, 'imported:') GROUP BY ALL")
    by = {(r["phase"], r["purpose"]): r["policy_digest"] for r in rows}
    assert len(rows) == len(by), rows  # one policy per (phase, purpose)
    assert by[(0, "bootstrap")] == served[0]  # the SFT actor on the seed tasks
    assert by[(1, "rollout")] == served[0] and by[(2, "rollout")] == served[1]  # phase k acts with actor k-1
    assert by[(0, "eval")] == served[0] and by[(1, "eval")] == served[1] and by[(2, "eval")] == served[2]
    for k in (1, 2):
        report = json.loads((run / "reports" / f"phase={k}.json").read_text())
        assert report["actor_n_train"] > 0 and report["critic_steps"] > 0 and report["replay_kept"] > 0
    # phase 2's filter is the trained critic: every candidate it scored is listed with its value, per site in the report
    valued = json.loads((run / "tasks" / "phase=2" / "valued.json").read_text())
    assert valued and all(0.0 <= t["critic_value"] <= 1.0 and isinstance(t["kept"], bool) for t in valued)
    report = json.loads((run / "reports" / "phase=2.json").read_text())
    sites = {t["sites"][0] for t in valued}
    assert {f"critic_value_median_{s}" for s in sites} <= set(report)
    assert not (run / "tasks" / "phase=1" / "valued.json").exists()  # phase 1 skips the filter: nothing scored
    logs = sorted(p.name for p in (run / "serving").iterdir())
    assert logs == sorted(f"webrl-{a.sha256[:12]}.log" for a in actors)
    assert not _engines(tmp_path)

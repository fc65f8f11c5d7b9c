"""End-to-end flow tests on the `smoke` config: real Prefect (the session's server from tests/flows/conftest.py, with
a worker of its own for the deployment run), real Chromium against the embedded sites, real DuckDB store,
real MLflow store.

The session's smoke run (conftest.smoke_run: bootstrap and phase 1, once) is what the tests check caching, a knob
change, reproduction, kill-and-resume and a deployment run against.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from shared_prefect import API_ENV, WEBRL, prefect_env, task_states, webrl
from webrl_core.runs import loss_history
from webrl_core.runs.store import TrajectoryStore

pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]


def _target(p: Path) -> str:
    return os.readlink(p)


def test_bootstrap_and_phase_write_store_models_and_mlflow(smoke_run):
    import mlflow

    root, cfg, run = smoke_run
    store = TrajectoryStore(run)
    eps = store.episodes()
    by = {}
    for e in eps:
        by.setdefault((e["phase"], e["purpose"]), []).append(e)
    assert len(by[(0, "eval")]) == 6 and len(by[(1, "eval")]) == 6  # the stratified test subset, twice
    assert all(e["success"] for e in by[(0, "oracle")])  # the oracle demos are labelled by the sites
    early = by[(0, "early-exit")]  # the oracle that quits: the first demonstrated tasks again, judged by the sites
    assert len(early) == 4 and {e["policy_digest"] for e in early} == {"oracle-early-exit:s0:p0.35"}
    assert {e["task_id"] for e in early} <= {e["task_id"] for e in by[(0, "oracle")]}
    assert all(e["env_score"] in (0.0, 1.0) for e in early)
    assert len(by[(1, "rollout")]) >= 1
    assert all(e["orm_score"] is not None for e in by[(1, "rollout")])  # ORM-labelled
    for name in ("actor", "critic"):
        assert (run / "models" / "phase=1" / name).is_symlink()
    assert (run / "models" / "phase=0" / "orm" / "config.json").exists()
    assert json.loads((run / "eval" / "phase=1.json").read_text())["total"]["n"] == 6
    plots = {"success_per_site.png", "losses.png", "curriculum_funnel.png", "orm_agreement.png"}
    assert all((run / "plots" / name).stat().st_size > 1000 for name in plots)
    # each training's loss history lives in its model folder: a point per step, or about 50 for a long one
    trainings = loss_history.run_trainings(run)
    assert [t["label"] for t in trainings] == ["bootstrap SFT", "bootstrap ORM", "phase 1 critic", "phase 1 actor"]
    assert all(len(t["history"]) >= min(t["global_step"], 25) >= 1 for t in trainings), trainings
    report1 = json.loads((run / "reports" / "phase=1.json").read_text())
    assert report1["kept_solve_rate"] == report1["env_successes"] / report1["kept_by_review"]
    assert (run / "viewer" / "index.html").exists()
    client = mlflow.MlflowClient(f"sqlite:///{run / 'mlflow.db'}")
    exp = client.get_experiment_by_name("webrl")
    runs = {r.info.run_name: r for r in client.search_runs([exp.experiment_id])}
    assert {"webrl-bootstrap", "webrl-phase-1"} <= set(runs)
    m = runs["webrl-phase-1"].data.metrics
    assert "test_success_rate" in m and "orm_accuracy" in m and "generated" in m
    assert {"test_solved", "test_failed", "test_errored"} <= set(m)
    assert {"kept_solve_rate", "env_successes", "orm_yes"} <= set(m)
    logged = client.list_artifacts(runs["webrl-phase-1"].info.run_id, "plots")
    assert {Path(a.path).name for a in logged} == plots
    versions = client.search_model_versions("name='webrl-actor'")  # registry failures fail the phase, so it is there
    assert any(v.tags.get("phase") == "1" and v.run_id == runs["webrl-phase-1"].info.run_id for v in versions)
    # every stored episode says what produced it; the phase's rollouts come from the phase-start actor
    from webrl_core.artifacts import sha256_path

    sft = f"hf:{sha256_path(run / 'models' / 'phase=0' / 'actor')}"
    assert {e["policy_digest"] for e in by[(1, "rollout")]} == {sft}
    assert {e["policy_digest"] for e in by[(0, "oracle")]} == {"oracle"}
    assert all(e["task_digest"] and e["settings_digest"] and e["node"] for e in eps)


def test_rerun_is_all_cache_hits_with_identical_artifacts(smoke_run):
    root, cfg, run = smoke_run
    before = {n: _target(run / "models" / "phase=1" / n) for n in ("actor", "critic")}
    t0 = time.perf_counter()
    webrl(root, "phase", "--config", str(cfg), "--phase", "1")
    wall = time.perf_counter() - t0
    states = task_states("webrl-phase")
    assert states and all(s == "Cached" for s in states.values()), states
    assert {n: _target(run / "models" / "phase=1" / n) for n in ("actor", "critic")} == before
    print(f"cached re-run of phase 1: {wall:.1f} s")


def test_a_finished_phase_comes_back_from_the_cache_after_its_code_moves(smoke_run, tmp_path):
    """A refactor (a module renamed, its importers following, comments and docstrings edited) changes no stage's
    identity (webrl_core/runs/code_identity.py): the finished phase re-runs from the cache on the moved code."""
    root, cfg, run = smoke_run
    repo = Path(__file__).resolve().parents[2]
    code = tmp_path / "code"
    for pkg in ("webrl_core", "webrl_cli", "flows", "tasks"):
        shutil.copytree(repo / pkg, code / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    learn = code / "webrl_core" / "learn"
    (learn / "advantage.py").rename(learn / "advantage_estimates.py")
    for f in code.rglob("*.py"):
        text = re.sub(r"\bwebrl_core\.learn\.advantage\b", "webrl_core.learn.advantage_estimates", f.read_text())
        text = text.replace("from webrl_core.learn import advantage as", "from webrl_core.learn import "
                                                                          "advantage_estimates as")
        f.write_text(text + "\n# moved in a refactor\n")
    env = {**prefect_env(root), "PYTHONPATH": str(code)}
    where = subprocess.run([sys.executable, "-c", "import webrl_core.learn.advantage_estimates as m; print(m.__file__)"],
                           env=env, cwd=tmp_path, capture_output=True, text=True, check=True).stdout
    assert where.startswith(str(code))
    webrl(root, "phase", "--config", str(cfg), "--phase", "1", env=env, cwd=tmp_path)
    states = task_states("webrl-phase")
    assert states and all(s == "Cached" for s in states.values()), states


def test_changing_the_replay_window_reruns_only_downstream(smoke_run):
    from webrl_core.artifacts import sha256_path

    root, cfg, run = smoke_run
    samples_before = _target(run / "data" / "phase=1" / "samples.jsonl")
    actor_before = sha256_path(run / "models" / "phase=1" / "actor")
    webrl(root, "phase", "--config", str(cfg), "--phase", "1", "--set", "replay.low=0.05")
    states = task_states("webrl-phase")
    upstream = [n for n in states if n.split("-")[0] in ("generate", "filter", "materialise", "rollout", "orm", "build")]
    assert upstream and all(states[n] == "Cached" for n in upstream), states
    assert [states[n] for n in states if n.startswith("replay-selection")] == ["Completed"], states
    assert _target(run / "data" / "phase=1" / "samples.jsonl") == samples_before
    downstream = [n for n in states if n.startswith(("train-critic", "train-actor", "evaluate"))]
    assert len(downstream) == 3 and all(states[n] in ("Cached", "Completed") for n in downstream), states
    # evaluation re-runs exactly when the actor's content changed (outputs are keyed by content)
    actor_changed = sha256_path(run / "models" / "phase=1" / "actor") != actor_before
    ev = [states[n] for n in downstream if n.startswith("evaluate")][0]
    assert ev == ("Completed" if actor_changed else "Cached"), (actor_changed, states)
    # the default window again: everything comes back from the cache
    webrl(root, "phase", "--config", str(cfg), "--phase", "1")
    assert all(s == "Cached" for s in task_states("webrl-phase").values())


def test_evaluations_of_two_models_in_one_run_dir_never_mix(smoke_run):
    from webrl_core.artifacts import sha256_path

    root, cfg, run = smoke_run
    init = sorted((run / "models" / "phase=0" / ".versions").glob("init@*"))[0]  # the untrained model
    models = {"sft": run / "models" / "phase=0" / "actor", "init": init}
    digests = {k: sha256_path(v) for k, v in models.items()}
    assert digests["sft"] != digests["init"]
    results = {}
    for name in ("sft", "init", "sft"):  # A, then B, then A again (must not read B's episodes)
        out = webrl(root, "eval", "--config", str(cfg), "--model", str(models[name])).stdout
        assert f"policy hf:{digests[name]}" in out, out
        ev = json.loads((run / "eval" / f"model={digests[name][:12]}.json").read_text())
        results.setdefault(name, []).append(ev)
    store = TrajectoryStore(run)
    for name, evs in results.items():
        ev = evs[-1]
        assert ev["policy_digest"] == f"hf:{digests[name]}" and ev["total"]["n"] == 6
        rows = store.sql("SELECT * FROM episodes WHERE episode_id IN (SELECT unnest($ids))", {"ids": ev["episode_ids"]})
        assert len(rows) == 6 and {r["policy_digest"] for r in rows} == {ev["policy_digest"]}
        assert ev["total"]["success"] == sum(1 for r in rows if r["status"] != "error" and r["env_score"] >= 1.0)
        assert all(e["episode_ids"] == ev["episode_ids"] for e in evs)  # the second A run reused A's own episodes
    assert not set(results["sft"][-1]["episode_ids"]) & set(results["init"][-1]["episode_ids"])
    n_eval = store.sql("SELECT policy_digest, count(*) AS n FROM episodes WHERE phase = 100 GROUP BY ALL")
    assert {r["policy_digest"]: r["n"] for r in n_eval} == {f"hf:{d}": 6 for d in digests.values()}


def test_reproduce_matches(smoke_run):
    root, cfg, run = smoke_run
    r = webrl(root, "reproduce", str(run), "--phase", "1")
    assert "all outputs match" in r.stdout, r.stdout


def test_killed_phase_resumes_without_loss_or_duplicates(smoke_run):
    root, cfg, run = smoke_run
    store = TrajectoryStore(run)
    proc = subprocess.Popen([WEBRL, "phase", "--config", str(cfg), "--phase", "2"], env=prefect_env(root),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 900
    while time.time() < deadline and proc.poll() is None:
        if store.sql("SELECT count(*) AS n FROM episodes WHERE phase = 2 AND purpose = 'rollout'")[0]["n"] >= 1:
            break
        time.sleep(0.5)
    assert proc.poll() is None, "phase 2 finished before it could be killed"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    first = {r["episode_id"]: r["_batch"] for r in store.sql(
        "SELECT episode_id, _batch FROM episodes WHERE phase = 2 AND purpose = 'rollout'")}
    assert first
    webrl(root, "phase", "--config", str(cfg), "--phase", "2")
    tasks = json.loads((run / "tasks" / "phase=2" / "tasks.json").read_text())
    rows = store.sql("SELECT episode_id, _batch FROM episodes WHERE phase = 2 AND purpose = 'rollout'")
    assert len(rows) == len(tasks)  # every task exactly once
    assert store.sql("""SELECT count(*) AS n FROM (SELECT episode_id, idx FROM steps WHERE phase = 2
                        GROUP BY ALL HAVING count(*) > 1)""")[0]["n"] == 0
    after = {r["episode_id"]: r["_batch"].split("-u")[0] for r in rows}
    for eid, batch in first.items():  # episodes finished before the kill were not rolled out again
        assert after[eid] == batch.split("-u")[0]
    assert (run / "models" / "phase=2" / "actor").exists()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=lambda s: s.name)
def test_a_stopped_phase_leaves_nothing_running(smoke_run, tmp_path, sig):
    """`webrl phase` (phase 1 again: cached) stopped once its temporary Prefect server runs; the other commands'
    cases and how they are checked: test_process_tree.py, stop_check.py."""
    from stop_check import TEMPORARY_PREFECT_SERVER, Command, without_api

    root, cfg, run = smoke_run
    env = without_api(prefect_env(root), tmp_path / ".prefect")
    cmd = Command(["phase", "--config", str(cfg), "--phase", "1"], env, tmp_path, tmp_path / "out.log")
    cmd.wait_for(TEMPORARY_PREFECT_SERVER, timeout=240)
    cmd.stop(sig)


def _written(run: Path) -> dict:
    """What a re-run must not add to a run dir: episodes, steps and scores, the store's files, the cached task results,
    MLflow runs and model versions."""
    import mlflow

    store = TrajectoryStore(run)
    client = mlflow.MlflowClient(f"sqlite:///{run / 'mlflow.db'}")
    exp = client.get_experiment_by_name("webrl")
    return {**{t: store.sql(f"SELECT count(*) AS n FROM {t}")[0]["n"] for t in ("episodes", "steps", "scores")},
            "store files": sorted(str(p.relative_to(run)) for p in (run / "store").rglob("*.parquet")),
            "cached results": len(list((run / ".prefect-results").iterdir())),
            "mlflow runs": sorted(r.info.run_id for r in client.search_runs([exp.experiment_id])),
            "model versions": len(client.search_model_versions("name='webrl-actor'"))}


def test_a_deployment_run_of_a_finished_phase_comes_from_the_cache(smoke_run, tmp_path):
    """Phase 1 of the smoke run (finished by `webrl phase`) again as the documented `prefect deployment run
    'webrl-phase/default' --param phase=1 ... --watch`, on the worker that `webrl serve prefect` starts
    (PrefectStack, on the session's server) when it was started in another directory than the checkout: its run root
    (`--run-root`, default ./runs there) is not where the CLI kept Prefect's results. Every stage is Cached (the cache
    lives in the run dir), nothing new is written (no episode, score, store file, MLflow run or model version), and it
    takes at most 60 s."""
    from webrl_cli.prefect_stack import PrefectStack

    root, cfg, run = smoke_run
    elsewhere = tmp_path / "elsewhere"
    before = _written(run)
    stack = PrefectStack(elsewhere / "runs" / ".prefect", port=urlsplit(os.environ[API_ENV]).port, worker_poll_s=1,
                         run_root=elsewhere / "runs")
    try:
        stack.deploy()
        stack.start_worker()
        t0 = time.perf_counter()
        r = subprocess.run([str(Path(sys.executable).parent / "prefect"), "deployment", "run", "webrl-phase/default",
                            "--param", "phase=1", "--param", f"config={cfg}", "--watch", "--watch-timeout", "900"],
                           env=stack.env(), capture_output=True, text=True, timeout=960)
        wall = time.perf_counter() - t0
        assert r.returncode == 0 and "Completed" in r.stdout, r.stdout + r.stderr
        ls = subprocess.run([str(Path(sys.executable).parent / "prefect"), "deployment", "ls"], env=stack.env(),
                            capture_output=True, text=True, timeout=120)
        assert "webrl-phase/default" in ls.stdout and "webrl-train/demo" in ls.stdout, ls.stdout
    finally:
        stack.stop()  # the worker only: this stack did not start the server
    states = task_states("webrl-phase")
    print(f"deployment run of the finished phase 1: {wall:.1f} s, {len(states)} tasks {set(states.values())}")
    assert states and all(s == "Cached" for s in states.values()), states
    assert _written(run) == before
    assert not (elsewhere / "runs" / "smoke").exists()
    assert wall <= 60, f"{wall:.0f} s"


def test_an_sft_checkpoint_takes_the_sft_stage_place_on_the_embedded_sites(smoke_run, tmp_path):
    """`bootstrap.sft_actor` without seed tasks on the embedded sites (a checkpoint `webrl bench sft-curve` trained,
    say): no SFT trains, the checkpoint is the phase-0 actor, and the rest of the embedded bootstrap runs from it."""
    from webrl_core.artifacts import sha256_path

    root, cfg, run = smoke_run
    checkpoint = (run / "models" / "phase=1" / "actor").resolve()  # not what this bootstrap's SFT would give
    adopted = tmp_path / "adopted"
    webrl(root, "bootstrap", "--config", str(cfg), "--run-dir", str(adopted), "--set",
          f"bootstrap.sft_actor={checkpoint}")
    states = task_states("webrl-bootstrap")
    assert not [n for n in states if n.startswith("sft-actor")], states
    assert [n for n in states if n.startswith("adopt-actor")] and [n for n in states if n.startswith("train-orm")]
    digest = sha256_path(checkpoint)
    assert sha256_path(adopted / "models" / "phase=0" / "actor") == digest
    by = {}
    for e in TrajectoryStore(adopted).episodes():
        by.setdefault((e["phase"], e["purpose"]), []).append(e)
    assert by[(0, "oracle")] and {e["policy_digest"] for e in by[(0, "bootstrap")]} == {f"hf:{digest}"}
    assert {e["policy_digest"] for e in by[(0, "eval")]} == {f"hf:{digest}"}
    assert (adopted / "models" / "phase=0" / "orm" / "config.json").exists()
    assert (adopted / "models" / "phase=0" / "critic").exists()
    report = json.loads((adopted / "reports" / "phase=0.json").read_text())
    assert "sft_train_s" not in report and "sft_rollout_success_rate" in report

"""Prefect operations on a real server: a worker on "another machine" (a second clone of the repo with its own worker,
pointed at the server by PREFECT_API_URL; both on 127.0.0.1 here), the nightly `webrl-phase/default` schedule
activated through the API, and a phase triggered while the same phase of the run dir is running (refused by the run-dir
lock, webrl_core/runs/runlock.py, never run twice).

One server for the module (infra/prefect.yaml deployed from this checkout, no worker of its own); the worker runs from
`git clone` of this repository, so it runs the committed code.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from webrl_core.hardware import free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
PREFECT, WEBRL = str(BIN / "prefect"), str(BIN / "webrl")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from webrl_cli.prefect_stack import PrefectStack

    root = tmp_path_factory.mktemp("ops")
    mp = pytest.MonkeyPatch()
    # The server's scheduler looks for deployments with active schedules every 60 s by default; the stack's server
    # inherits this process's environment.
    mp.setenv("PREFECT_SERVER_SERVICES_SCHEDULER_LOOP_SECONDS", "2")
    mp.delenv("MLFLOW_TRACKING_URI", raising=False)
    stack = PrefectStack(root / "server-home", port=free_port(), worker_poll_s=1, run_root=root)
    t0 = time.perf_counter()
    try:
        stack.start_server()
        stack.deploy()
        print(f"server + deploy: {time.perf_counter() - t0:.0f} s")
        yield root, stack
    finally:
        stack.stop()  # the clone's worker (stack.worker, see below) first, then the server
        mp.undo()


@pytest.fixture(scope="module")
def gpu_box(server):
    """The worker "on the GPU machine": a second clone of the repository, its own PREFECT_HOME and result storage,
    started there with only PREFECT_API_URL pointing at the server. The deployments' pull step
    `set_working_directory: {{ $WEBRL_REPO }}` is resolved in the flow-run process from the worker's environment, so
    flow runs start in the clone and import its code."""
    root, stack = server
    clone = root / "clone2"
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True, timeout=300)
    home = root / "gpu-box"
    env = dict(os.environ, PREFECT_API_URL=stack.api, PREFECT_HOME=str(home / ".prefect"), WEBRL_REPO=str(clone),
               PREFECT_RESULTS_LOCAL_STORAGE_PATH=str(home / ".prefect-results"), PREFECT_WORKER_QUERY_SECONDS="1",
               PREFECT_SERVER_ANALYTICS_ENABLED="false", TOKENIZERS_PARALLELISM="false")
    home.mkdir()
    log = open(home / "worker.log", "w")
    stack.worker = subprocess.Popen([PREFECT, "worker", "start", "--pool", "webrl-pool", "--name", "gpu-box"],
                                    cwd=clone, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    return clone, home, stack.worker


@contextlib.contextmanager
def _client(stack):
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: stack.api}), get_client(sync_client=True) as c:
        yield c


def _wait_final(client, run_id, timeout: float, on_poll=None):
    t0 = time.time()
    while time.time() - t0 < timeout:
        fr = client.read_flow_run(run_id)
        if on_poll:
            on_poll(fr)
        if fr.state and fr.state.is_final():
            return fr
        time.sleep(0.2)
    raise TimeoutError(f"flow run {run_id} not finished after {timeout}s: {fr.state}")


def _descendants(pid: int) -> set[int]:
    from webrl_cli.prefect_stack import descendants

    return set(descendants(pid))


def test_a_worker_from_a_second_clone_runs_a_deployment(server, gpu_box):
    root, stack = server
    clone, home, worker = gpu_box
    # a config only the clone has, named relative to the flow run's working directory
    (clone / "ops-check.yaml").write_text(yaml.safe_dump({"extends": "smoke", "run": {"name": "from-clone2"}}))
    run_dir = root / "worker-check"
    seen: dict = {}

    def watch(fr):  # while it runs: the process of the flow run is the clone worker's child, working in the clone
        if fr.state.is_running() and fr.infrastructure_pid and "pid" not in seen:
            pid = fr.infrastructure_pid.rsplit(":", 1)[-1]  # "<pid>" (older workers: "<host>:<pid>")
            seen.update(pid=int(pid), under_worker=int(pid) in _descendants(worker.pid))
            with contextlib.suppress(OSError):
                seen["cwd"] = os.readlink(f"/proc/{pid}/cwd")
                environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
                seen["webrl_repo"] = next((e.split(b"=", 1)[1].decode() for e in environ
                                           if e.startswith(b"WEBRL_REPO=")), None)

    t0 = time.perf_counter()
    with _client(stack) as client:
        dep = client.read_deployment_by_name("webrl-eval/oracle")
        fr = client.create_flow_run_from_deployment(dep.id, parameters={
            "config": "ops-check.yaml", "run_dir": str(run_dir),
            "overrides": ["policy.backend=oracle", "eval.max_tasks=2"]})
        fr = _wait_final(client, fr.id, 600, watch)
    print(f"oracle eval on the clone's worker: {time.perf_counter() - t0:.0f} s")
    assert fr.state.is_completed(), (fr.state, (home / "worker.log").read_text()[-4000:])
    assert seen.get("under_worker"), seen
    assert seen.get("cwd") == str(clone) and seen.get("webrl_repo") == str(clone), seen
    assert str(fr.id) in (home / "worker.log").read_text()  # the clone's worker took it
    # it read the clone's config (relative to its working directory) and wrote the run dir it was given
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["run"]["name"] == "from-clone2"
    ev = json.loads((run_dir / "eval" / "model=oracle.json").read_text())
    assert ev["policy_digest"] == "oracle" and ev["total"]["n"] == 2


def test_the_worker_of_serve_prefect_runs_where_the_user_says(tmp_path, monkeypatch):
    """`webrl serve prefect` started in some folder: its worker keeps the user's WEBRL_REPO (the checkout its flow runs
    import and work in; default: the one webrl is installed from) and passes the run root (`--run-root`, default
    ./runs of that folder) as WEBRL_RUN_ROOT, where its flow runs put run dirs that neither a `run_dir` nor the
    config's run.root places. (The deployment run on such a worker: test_flows.py; a worker with its own clone:
    test_a_worker_from_a_second_clone_runs_a_deployment.)"""
    from webrl_cli.prefect_stack import REPO, PrefectStack
    from webrl_core.config_loader import load_config
    from webrl_core.runs.rundir import run_dir_of

    for var in ("WEBRL_REPO", "WEBRL_RUN_ROOT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(tmp_path)
    env = PrefectStack(tmp_path / "home").env()
    assert env["WEBRL_REPO"] == str(REPO) and env["WEBRL_RUN_ROOT"] == str(tmp_path / "runs")
    monkeypatch.setenv("WEBRL_REPO", str(tmp_path / "clone"))
    assert PrefectStack(tmp_path / "home").env()["WEBRL_REPO"] == str(tmp_path / "clone")

    monkeypatch.chdir(REPO)  # a flow run of that worker, in the checkout
    assert run_dir_of(load_config("smoke")) == REPO / "runs" / "smoke"  # no WEBRL_RUN_ROOT: ./runs
    monkeypatch.setenv("WEBRL_RUN_ROOT", env["WEBRL_RUN_ROOT"])
    assert run_dir_of(load_config("smoke")) == tmp_path / "runs" / "smoke"
    assert run_dir_of(load_config("smoke", sets=[f"run.root={tmp_path / 'mine'}"])) == tmp_path / "mine" / "smoke"
    assert run_dir_of(load_config("smoke"), "rd") == REPO / "rd"


def _scheduler_errors(stack) -> str:
    log = (stack.home / "server.log").read_text(errors="replace")
    i = log.rfind("schedule_deployments")
    return "no scheduled runs; the server's scheduler says:\n" + (log[i:i + 3000] if i >= 0 else log[-3000:])


def test_activating_the_nightly_schedule_creates_scheduled_runs(server):
    from prefect.client.schemas.filters import (DeploymentFilter, DeploymentFilterId, FlowRunFilter,
                                                FlowRunFilterState, FlowRunFilterStateType)
    from prefect.client.schemas.objects import StateType

    root, stack = server

    def scheduled(client, dep_id):
        return client.read_flow_runs(
            deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[dep_id])),
            flow_run_filter=FlowRunFilter(state=FlowRunFilterState(type=FlowRunFilterStateType(
                any_=[StateType.SCHEDULED]))))

    with _client(stack) as client:
        dep = client.read_deployment_by_name("webrl-phase/default")
        [sched] = client.read_deployment_schedules(dep.id)
        assert sched.active is False and sched.schedule.cron == "0 3 * * *"  # paused as deployed
        time.sleep(3)  # more than a scheduler loop: a paused schedule makes no runs
        assert scheduled(client, dep.id) == []

        t0 = time.perf_counter()
        client.update_deployment_schedule(dep.id, sched.id, active=True)  # what the UI's toggle does
        runs = []
        while time.perf_counter() - t0 < 60 and len(runs) < 3:
            time.sleep(0.5)
            runs = scheduled(client, dep.id)
        print(f"scheduled runs {len(runs)} after {time.perf_counter() - t0:.1f} s")
        assert len(runs) >= 3, _scheduler_errors(stack)  # the scheduler keeps at least `min_runs` (3) upcoming runs
        starts = sorted(r.expected_start_time for r in runs)
        assert all((s.hour, s.minute) == (3, 0) and s.utcoffset().total_seconds() == 0 for s in starts), starts
        assert all(b - a == datetime.timedelta(days=1) for a, b in zip(starts, starts[1:])), starts
        assert all(r.auto_scheduled and r.parameters == {"config": "demo", "phase": 1} for r in runs)

        # `webrl serve prefect` re-deploys on every start: an activated schedule stays active
        stack.deploy()
        [sched] = client.read_deployment_schedules(dep.id)
        assert sched.active is True
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < 60 and len(runs := scheduled(client, dep.id)) < 3:
            time.sleep(0.5)
        assert len(runs) >= 3, _scheduler_errors(stack)

        # pause it again with the CLI: the upcoming runs it made are deleted
        r = subprocess.run([PREFECT, "deployment", "schedule", "pause", "webrl-phase/default", str(sched.id)],
                           env=stack.env(), capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr
        assert client.read_deployment_schedules(dep.id)[0].active is False
        assert scheduled(client, dep.id) == []


def test_a_flow_started_on_a_busy_run_dir_is_refused_and_the_first_completes(server, gpu_box):
    """While the bootstrap of a run dir runs: the same bootstrap again (CLI) and phase 1 (CLI, and a run of the
    scheduled deployment on the other machine's worker) are refused at once with a message naming the holder; the
    first completes and ran once. (The bootstrap, not a phase k >= 1, is the long first flow: it needs no earlier
    phase, so this costs one tiny bootstrap; tests/runs/test_runlock.py checks the "phase k ... twice" message.)

    Needs flows/webrl.py to hold webrl_core.runs.runlock around each flow, committed (the other worker runs a clone)."""
    from webrl_core.runs import runlock
    from webrl_core.runs.store import TrajectoryStore

    root, stack = server
    clone, home, worker = gpu_box
    cfg = root / "tiny.yaml"
    cfg.write_text(yaml.safe_dump({
        "extends": "smoke", "run": {"name": "tiny", "root": str(root)}, "env": {"max_steps": 5},
        # long enough to outlast the three refusals, the deployment run's on a worker that polls (12 demos, 3 epochs:
        # with 6 and 1 it finished first on an idle 2-core box)
        "bootstrap": {"demo_tasks": 12, "rollout_tasks": 2, "random_tasks": 0, "n_shards": 1, "sft_epochs": 3},
        "eval": {"max_tasks": 2}}))
    rd = root / "tiny"
    env = dict(stack.env(), PREFECT_LOGGING_LEVEL="WARNING")  # the CLI runs flows against the server (no ephemeral API)

    def webrl(*args) -> subprocess.Popen:
        return subprocess.Popen([WEBRL, *args, "--config", str(cfg)], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)

    t0 = time.perf_counter()
    first = webrl("bootstrap")
    procs = [first]
    try:
        while not (runlock.is_held(rd) and runlock.read_note(rd).get("pid") == first.pid):
            assert first.poll() is None, f"the bootstrap ended ({first.returncode}) before it held the lock:\n" \
                                         f"{first.stdout.read()[-5000:]}"
            assert time.perf_counter() - t0 < 300, "the bootstrap never took the run dir's lock"
            time.sleep(0.2)
        holder = f"(pid {first.pid} on host {socket.gethostname()}, flow webrl-bootstrap, since "
        with _client(stack) as client:
            dep = client.read_deployment_by_name("webrl-phase/default")
            fr = client.create_flow_run_from_deployment(dep.id, parameters={
                "config": str(cfg), "phase": 1, "run_dir": str(rd)})
            again, phase1 = webrl("bootstrap"), webrl("phase", "--phase", "1")
            procs += [again, phase1]
            out_again, out_phase1 = again.communicate(timeout=300)[0], phase1.communicate(timeout=300)[0]
            fr = _wait_final(client, fr.id, 300)
        assert first.poll() is None, "the bootstrap finished before the others were refused; make it longer"
        print(f"three refusals within {time.perf_counter() - t0:.0f} s of the start")
        assert again.returncode != 0 and phase1.returncode != 0
        assert f"the bootstrap (phase 0) of {rd} is already running {holder}" in out_again, out_again[-5000:]
        assert "refusing to start it twice" in out_again
        busy = f"{rd} is busy: the bootstrap (phase 0) is running there {holder}"
        assert busy in out_phase1 and "refusing to start phase 1 on it at the same time" in out_phase1, \
            out_phase1[-5000:]
        assert fr.state.is_failed() and busy in fr.state.message, fr.state  # the deployment run, on the other worker
        assert not (rd / "models" / "phase=1").exists()
        assert first.wait(timeout=600) == 0, first.stdout.read()[-5000:]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, 9)
                p.wait()
    print(f"tiny bootstrap with three refused starts: {time.perf_counter() - t0:.0f} s")
    assert not runlock.is_held(rd)

    # the bootstrap ran once: each demo task once, one MLflow run, the models written
    import mlflow

    rows = TrajectoryStore(rd).sql("SELECT task_id FROM episodes WHERE phase = 0 AND purpose = 'oracle'")
    assert len(rows) == 12 == len({r["task_id"] for r in rows})
    client = mlflow.MlflowClient(f"sqlite:///{rd / 'mlflow.db'}")
    exp = client.get_experiment_by_name("webrl")
    assert len(client.search_runs([exp.experiment_id], "attributes.run_name = 'webrl-bootstrap'")) == 1
    assert (rd / "models" / "phase=0" / "actor").exists()

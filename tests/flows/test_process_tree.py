"""No process outlives its command: every command that starts servers leaves none of them running after SIGTERM or
SIGINT, the whole tree gone within 20 s (issue 33; webrl_cli.prefect_stack.stop_tree_on_signals for the commands
that run flows, webrl_cli.serve_cmd for `webrl serve`). How a case is stopped and checked: stop_check.py.

What each case covers (the command runs the `smoke` config in a folder of its own; with no PREFECT_API_URL, so that
it starts Prefect's temporary server as a user's command does, except where it says "session server"):

| command | signal | sent once | covers |
|---|---|---|---|
| demo | SIGTERM | the first rollout's browsers run | the reported case: `webrl demo` stopped by `kill` left its temporary Prefect server running; here also the sites' server, Playwright's driver and Chromium, stopped during a task |
| demo | SIGINT | the temporary Prefect server runs | Ctrl-C (to the command alone) |
| train | SIGTERM, SIGINT | the temporary Prefect server runs | the same decorator on `train` |
| eval | SIGTERM | the temporary Prefect server runs | `eval` (the oracle: no models) |
| eval | SIGINT | the evaluation's browsers run | Ctrl-C during a task, on the session server (a server the command did not start, which stays) |
| serve mlflow | SIGINT | the MLflow server's uvicorn runs | SIGINT to `webrl serve`; its SIGTERM, SIGHUP and SIGKILL cases: tests/agent/test_serve_signals.py |
| serve prefect | SIGINT | the server answers and deploying began | SIGINT during the deploy; its SIGTERM with the worker up: tests/agent/test_serve_signals.py |

`webrl phase` needs a finished phase 0: its two cases run on the session's smoke run (tests/flows/test_flows.py).
"""

from __future__ import annotations

import os
import signal

import pytest
import yaml

from webrl_core.hardware import free_port
from shared_prefect import prefect_env
from stop_check import BROWSER, TEMPORARY_PREFECT_SERVER, UVICORN, Command, without_api

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300),
              pytest.mark.skipif(not os.path.exists("/proc/self/environ"), reason="reads /proc")]

RUN_CASES = [  # command, signal, what runs when it is sent, whether the command starts Prefect's temporary server
    ("demo", signal.SIGTERM, BROWSER, True),
    ("demo", signal.SIGINT, TEMPORARY_PREFECT_SERVER, True),
    ("train", signal.SIGTERM, TEMPORARY_PREFECT_SERVER, True),
    ("train", signal.SIGINT, TEMPORARY_PREFECT_SERVER, True),
    ("eval", signal.SIGTERM, TEMPORARY_PREFECT_SERVER, True),
    ("eval", signal.SIGINT, BROWSER, False),
]


@pytest.mark.parametrize("command,sig,up,temporary", RUN_CASES, ids=[f"{c}-{s.name}" for c, s, *_ in RUN_CASES])
def test_a_command_that_runs_flows_leaves_nothing_running(tmp_path, command, sig, up, temporary):
    cfg = tmp_path / "smoke.yaml"
    cfg.write_text(yaml.safe_dump({"extends": "smoke", "run": {"name": "smoke", "root": str(tmp_path)}}))
    extra = ["--set", "policy.backend=oracle"] if command == "eval" else []
    env = prefect_env(tmp_path)
    if temporary:
        env = without_api(env, tmp_path / ".prefect")
    cmd = Command([command, "--config", str(cfg), *extra], env, tmp_path, tmp_path / "out.log")
    cmd.wait_for(up, timeout=240)
    cmd.stop(sig)


def test_serve_mlflow_stops_on_sigint(tmp_path):
    import mlflow

    (tmp_path / "run").mkdir()
    mlflow.MlflowClient(f"sqlite:///{tmp_path / 'run' / 'mlflow.db'}").search_experiments()  # a run dir's store
    env = without_api(prefect_env(tmp_path), tmp_path / ".prefect")
    cmd = Command(["serve", "mlflow", "--run-dir", str(tmp_path / "run"), "--port", str(free_port())], env,
                  tmp_path, tmp_path / "out.log")
    cmd.wait_for(UVICORN, timeout=180)
    cmd.stop(signal.SIGINT, exit_code=0)  # documented: an orderly stop exits with 0


def test_serve_prefect_stops_on_sigint_while_deploying(tmp_path):
    env = without_api(prefect_env(tmp_path), tmp_path / ".prefect")
    cmd = Command(["serve", "prefect", "--home", str(tmp_path / ".prefect"), "--run-root", str(tmp_path), "--port",
                   str(free_port())], env, tmp_path, tmp_path / "out.log")
    cmd.wait_for(TEMPORARY_PREFECT_SERVER, "server start", printed="deploying", timeout=240)
    cmd.stop(signal.SIGINT, exit_code=0)

"""The flow tests' one Prefect server per session (started by conftest.py): the environment of a `webrl` command
that talks to it, running such a command and the task states it recorded. A module of its own name: test modules
import from it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

API_ENV = "WEBRL_TEST_PREFECT_API_URL"  # set by conftest.prefect_api, read by prefect_env, nothing else
FINAL = {"Completed", "Cached", "Failed", "Crashed", "Cancelled"}
WEBRL = str(Path(sys.executable).parent / "webrl")


def prefect_env(root, **extra: str) -> dict[str, str]:
    """A `webrl` command's environment: the session's Prefect server, Prefect's results under `root`, the MLflow
    store in the run dir (whatever the shell points at is dropped)."""
    env = dict(os.environ, PREFECT_HOME=str(root / ".prefect"), PREFECT_API_URL=os.environ[API_ENV],
               PREFECT_RESULTS_LOCAL_STORAGE_PATH=str(root / ".prefect-results"),
               PREFECT_SERVER_ANALYTICS_ENABLED="false", TOKENIZERS_PARALLELISM="false", **extra)
    env.pop("MLFLOW_TRACKING_URI", None)
    return env


def webrl(root: Path, *args: str, timeout: int = 1200, env: dict[str, str] | None = None,
          cwd: Path | None = None) -> subprocess.CompletedProcess:
    """`webrl *args` in `env` (default `prefect_env(root)`); its output's tail in the assertion when it fails."""
    r = subprocess.run([WEBRL, *args], env=prefect_env(root) if env is None else env, cwd=cwd, capture_output=True,
                       text=True, timeout=timeout)
    if r.returncode != 0:
        raise AssertionError(f"webrl {' '.join(args)} failed ({r.returncode}):\n{r.stdout[-4000:]}\n{r.stderr[-6000:]}")
    return r


def task_states(flow_name: str, timeout: float = 60.0) -> dict[str, str]:
    """State of every task run of the latest run of `flow_name` on the session's server. The server records task
    states from the client's events after the command has exited: wait until every one is final and two reads agree."""
    from prefect import get_client
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName, FlowRunFilter, FlowRunFilterId
    from prefect.client.schemas.sorting import FlowRunSort
    from prefect.settings import PREFECT_API_URL, temporary_settings

    deadline, last = time.monotonic() + timeout, None
    with temporary_settings({PREFECT_API_URL: os.environ[API_ENV]}), get_client(sync_client=True) as client:
        (run,) = client.read_flow_runs(flow_filter=FlowFilter(name=FlowFilterName(any_=[flow_name])),
                                       sort=FlowRunSort.START_TIME_DESC, limit=1)
        while True:
            runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run.id])))
            states = {t.name: t.state.name if t.state else "" for t in runs}
            if states and states == last and set(states.values()) <= FINAL:
                return states
            if time.monotonic() > deadline:
                return states  # the caller's assertion shows what was not final
            last = states
            time.sleep(0.5)

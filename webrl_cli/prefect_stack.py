"""A local Prefect stack: server on 127.0.0.1, process work pool, deployments from infra/prefect.yaml, one worker;
and the process-tree helpers that make `webrl serve ...` leave nothing running behind it.

Stop order matters (stack.md P5): workers first (SIGINT, then a second SIGINT if it hangs), then the server.
Every child is started in its own session (start_new_session=True) so that a Ctrl-C in the terminal reaches only
`webrl serve`, which then stops the children in order; a child is stopped through its whole process group, since the
servers fork workers of their own (MLflow runs uvicorn as a child process).
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
POOL = "webrl-pool"


class PrefectStack:
    def __init__(self, home: str | Path, port: int = 4200, worker_poll_s: float = 10.0, run_root: str | Path = "runs"):
        self.home = Path(home).resolve()
        self.port = port
        self.api = f"http://127.0.0.1:{port}/api"
        self.run_root = Path(run_root).resolve()
        self.worker_poll_s = worker_poll_s
        self.server: subprocess.Popen | None = None
        self.worker: subprocess.Popen | None = None
        self.home.mkdir(parents=True, exist_ok=True)

    def env(self) -> dict[str, str]:
        """The environment of the server, the worker and its flow runs. The flow runs import flows/ from, and work
        in, $WEBRL_REPO (the user's if set, else the checkout webrl is installed from; see set_repo_directory) and put
        run dirs that the config does not place under the run root (WEBRL_RUN_ROOT, webrl_core.runs.rundir.run_root);
        each run dir holds its own task cache, so a deployment run of a finished phase is all cache hits wherever the
        worker was started."""
        return dict(os.environ, PREFECT_HOME=str(self.home), PREFECT_API_URL=self.api,
                    PREFECT_SERVER_ANALYTICS_ENABLED="false", WEBRL_REPO=os.environ.get("WEBRL_REPO") or str(REPO),
                    WEBRL_RUN_ROOT=str(self.run_root),
                    PREFECT_RESULTS_LOCAL_STORAGE_PATH=str(self.run_root / ".prefect-results"),
                    PREFECT_WORKER_QUERY_SECONDS=str(self.worker_poll_s), TOKENIZERS_PARALLELISM="false")

    def _prefect(self, *args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
        exe = str(Path(sys.executable).parent / "prefect")
        return subprocess.run([exe, *args], env=self.env(), cwd=REPO, capture_output=True, text=True, check=check,
                              timeout=timeout)

    def start_server(self, timeout: float = 120) -> None:
        import httpx  # here, not at the top: the watchdog process imports this module and needs only the stdlib

        exe = str(Path(sys.executable).parent / "prefect")
        log = open(self.home / "server.log", "a")
        self.server = subprocess.Popen([exe, "server", "start", "--host", "127.0.0.1", "--port", str(self.port)],
                                       env=self.env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        t0 = time.time()
        while time.time() - t0 < timeout:
            if self.server.poll() is not None:
                raise RuntimeError(f"prefect server exited with {self.server.returncode}; see {self.home / 'server.log'}")
            try:
                if httpx.get(self.api + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise TimeoutError(f"prefect server not healthy after {timeout}s; see {self.home / 'server.log'}")

    def deploy(self) -> None:
        r = self._prefect("work-pool", "create", POOL, "--type", "process", check=False)
        if r.returncode != 0 and "already exists" not in (r.stdout + r.stderr):
            raise RuntimeError(f"work-pool create failed: {r.stdout}{r.stderr}")
        active = self._active_schedules()
        r = self._prefect("--no-prompt", "deploy", "--all", "--prefect-file", str(REPO / "infra" / "prefect.yaml"),
                          check=False, timeout=300)
        if r.returncode != 0:
            raise RuntimeError(f"prefect deploy failed:\n{r.stdout}\n{r.stderr}")
        self._reactivate(active)

    # A re-deploy replaces each deployment's schedules with those of prefect.yaml, where the nightly schedule is
    # paused: without this, every restart of `webrl serve prefect` would pause a schedule activated in the UI.
    def _call(self, method: str, path: str, body: dict):
        """One API call, retried as Prefect's client does: the SQLite server answers 503 while its database is
        locked (a busy box)."""
        import httpx

        for attempt in range(6):
            try:
                r = httpx.request(method, self.api + path, json=body, timeout=30)
                if r.status_code not in (429, 502, 503) or attempt == 5:
                    r.raise_for_status()
                    return r.json() if r.content else None
            except httpx.TransportError:
                if attempt == 5:
                    raise
            time.sleep(0.5 * 2 ** attempt)

    def _deployments(self) -> list[dict]:
        return self._call("POST", "/deployments/filter", {})

    @staticmethod
    def _schedule_key(deployment: dict, sched: dict) -> str:
        return f"{deployment['id']}:{json.dumps(sched['schedule'], sort_keys=True)}"

    def _active_schedules(self) -> set[str]:
        return {self._schedule_key(d, s) for d in self._deployments() for s in d.get("schedules") or [] if s["active"]}

    def _reactivate(self, keys: set[str]) -> None:
        for d in self._deployments() if keys else []:
            for s in d.get("schedules") or []:
                if not s["active"] and self._schedule_key(d, s) in keys:
                    self._call("PATCH", f"/deployments/{d['id']}/schedules/{s['id']}", {"active": True})

    def start_worker(self) -> None:
        exe = str(Path(sys.executable).parent / "prefect")
        log = open(self.home / "worker.log", "a")
        self.worker = subprocess.Popen([exe, "worker", "start", "--pool", POOL], env=self.env(), cwd=REPO, stdout=log,
                                       stderr=subprocess.STDOUT, start_new_session=True)

    def stop(self) -> None:
        # The snapshot comes first: a process that left its group (the process worker starts each flow run in a session
        # of its own) is found only through its parent links, which break once the worker exits.
        tree = {}
        for p in (self.worker, self.server):
            if p is not None:
                tree.update(descendants(p.pid))
        if self.worker and self.worker.poll() is None:
            # SIGINT to the worker alone: it stops taking flow runs and lets the running ones finish
            self.worker.send_signal(signal.SIGINT)
            try:
                self.worker.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.worker.send_signal(signal.SIGINT)  # the second SIGINT makes it kill itself
                try:
                    self.worker.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    pass
        if self.worker:
            stop_group(self.worker, signal.SIGTERM, timeout=10)  # whatever it left in its group
        if self.server:
            stop_group(self.server, signal.SIGTERM, timeout=20)
        terminate(tree, timeout=10)


def set_repo_directory() -> dict[str, str]:
    """Pull step of the deployments (infra/prefect.yaml), run in the flow-run process on the worker's machine: the flow
    run works in, and imports flows/ from, $WEBRL_REPO when the worker's environment sets it, else the checkout this
    package is installed from (on a GPU box: its own clone)."""
    repo = Path(os.environ.get("WEBRL_REPO") or REPO).resolve()
    if not (repo / "flows" / "webrl.py").is_file():
        raise FileNotFoundError(f"{repo} is not a webrl checkout (no flows/webrl.py): set WEBRL_REPO in the worker's "
                                "environment to the checkout its flow runs should use")
    os.chdir(repo)
    return {"directory": str(repo)}


# ---- process trees (Linux: read from /proc; elsewhere only the process groups are stopped) ----

def _stat(pid: int) -> tuple[int, int, str, int] | None:
    """(ppid, process group, state, start time in clock ticks) of `pid`, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            raw = f.read()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2:].split()  # the command name in (...) may contain spaces
    return int(fields[1]), int(fields[2]), fields[0], int(fields[19])


def _processes() -> dict[int, tuple[int, int, str, int]]:
    try:
        names = os.listdir("/proc")
    except OSError:
        return {}
    return {int(n): st for n in names if n.isdigit() and (st := _stat(int(n))) is not None}


def descendants(root: int) -> dict[int, int]:
    """Every live process below `root`, as pid -> start time (the start time tells a reused pid from the original)."""
    children: dict[int, list[int]] = {}
    procs = _processes()
    for pid, st in procs.items():
        children.setdefault(st[0], []).append(pid)
    out, todo = {}, [root]
    while todo:
        for c in children.get(todo.pop(), []):
            if procs[c][2] != "Z":
                out[c] = procs[c][3]
            todo.append(c)
    return out


def _alive(pid: int, start: int) -> bool:
    st = _stat(pid)
    return st is not None and st[3] == start and st[2] != "Z"


def _group_alive(pgid: int) -> bool:
    """Whether any process of the group runs. Zombies do not count: an orphan's zombie is reaped by init, which in some
    containers never happens, and it holds no port or memory."""
    procs = _processes()
    if procs:
        return any(st[1] == pgid and st[2] != "Z" for st in procs.values())
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def _wait_until(cond, timeout: float) -> bool:
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > timeout:
            return False
        time.sleep(0.1)
    return True


def _killpg(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def stop_group(proc: subprocess.Popen | int, sig: int = signal.SIGTERM, timeout: float = 20.0) -> None:
    """Stop the process group that `proc` leads (it was started with start_new_session=True): `sig` to every member,
    up to `timeout` s for all of them to exit, then SIGKILL. The group, not the pid: a server that dies before the
    workers it forked would leave them running, orphaned, on its port."""
    pgid = proc if isinstance(proc, int) else proc.pid
    _killpg(pgid, sig)
    if not _wait_until(lambda: not _group_alive(pgid), timeout):
        _killpg(pgid, signal.SIGKILL)
        _wait_until(lambda: not _group_alive(pgid), 5)
    if not isinstance(proc, int):
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)  # reap it


def terminate(procs: dict[int, int], timeout: float = 10.0) -> None:
    """SIGTERM to each process of `procs` (pid -> start time) that still runs, SIGKILL to those left after `timeout` s."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid, start in procs.items():
            if _alive(pid, start):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, sig)
        if _wait_until(lambda: not any(_alive(p, s) for p, s in procs.items()), timeout if sig == signal.SIGTERM else 5):
            return


@contextlib.contextmanager
def watchdog(poll_s: float = 1.0):
    """Nothing this process starts outlives it, even when it is killed with SIGKILL and cannot clean up.

    A watchdog process records this process's descendants every `poll_s` s. Its stdin is a pipe whose write end only
    this process holds, so the pipe reaches EOF the moment this process exits, however it dies; the watchdog then stops
    what is left (see _watch). PR_SET_PDEATHSIG would reach only the direct children, not the processes they fork
    (MLflow's uvicorn, Prefect's flow runs). On an orderly exit the caller has already stopped everything and the
    watchdog finds nothing to do; it is waited for, so that nothing at all runs once `webrl serve` has exited.
    """
    try:
        dog = subprocess.Popen([sys.executable, "-c", f"from webrl_cli.prefect_stack import _watch; "
                                f"_watch({os.getpid()}, {poll_s})"], stdin=subprocess.PIPE, cwd=REPO,
                               start_new_session=True)
    except OSError as e:
        print(f"no watchdog ({e}): children would outlive a SIGKILL of this process", file=sys.stderr)
        dog = None
    try:
        yield
    finally:
        if dog is not None:
            dog.stdin.close()
            with contextlib.suppress(subprocess.TimeoutExpired):
                dog.wait(timeout=30)


def _watch(parent: int, poll_s: float, timeout: float = 10.0) -> None:
    fd = sys.stdin.fileno()
    me = os.getpid()
    seen: dict[int, int] = {}
    while True:
        ready, _, _ = select.select([fd], [], [], poll_s)
        if ready and not os.read(fd, 4096):
            break  # EOF: the parent has exited
        seen = {p: s for p, s in seen.items() if _alive(p, s)}
        seen.update(descendants(parent))
        seen.pop(me, None)
    # Groups whose leader still runs, newest first (the worker before the server, as on an orderly stop); then the
    # recorded processes that remain, wherever they are.
    leaders = [p for p, s in seen.items() if _alive(p, s) and (_stat(p) or (0, 0))[1] == p]
    for pgid in sorted(leaders, key=seen.get, reverse=True):
        stop_group(pgid, signal.SIGTERM, timeout)
    terminate(seen, timeout)

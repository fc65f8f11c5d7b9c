"""A local Prefect stack: server on 127.0.0.1, process work pool, deployments from infra/prefect.yaml, one worker;
and what makes `webrl serve ...` (watchdog) and the commands that run flows (`webrl demo`, `train`, `phase`, `eval`,
...: stop_tree_on_signals) leave nothing running behind them.

Stop order matters (stack.md P5): workers first (SIGINT, then a second SIGINT if it hangs), then the server.
Every child is started in its own session (start_new_session=True) so that a Ctrl-C in the terminal reaches only
`webrl serve`, which then stops the children in order; a child is stopped through its whole process group, since the
servers fork workers of their own (MLflow runs uvicorn as a child process). The process trees are walked and stopped
by webrl_core.scale.processes (psutil); the server is reached through Prefect's own client.
"""

from __future__ import annotations

import contextlib
import functools
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from webrl_core.scale.processes import Tree, alive, descendants, leads_group, stop_group, stop_tree, terminate

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

    @contextlib.contextmanager
    def client(self):
        """Prefect's own (sync) client on this server. It retries what a busy server answers (the SQLite server says
        503 while its database is locked) and, once it has connected, a refused connection."""
        # here, not at the top: the watchdog process imports this module and needs only psutil
        from prefect.client.orchestration import get_client
        from prefect.settings import PREFECT_API_URL, temporary_settings

        with temporary_settings({PREFECT_API_URL: self.api}), get_client(sync_client=True) as client:
            yield client

    def start_server(self, timeout: float = 120) -> None:
        exe = str(Path(sys.executable).parent / "prefect")
        log = open(self.home / "server.log", "a")
        self.server = subprocess.Popen([exe, "server", "start", "--host", "127.0.0.1", "--port", str(self.port)],
                                       env=self.env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        t0 = time.time()
        with self.client() as client:
            while time.time() - t0 < timeout:
                if self.server.poll() is not None:
                    raise RuntimeError(f"prefect server exited with {self.server.returncode}; see "
                                       f"{self.home / 'server.log'}")
                if client.api_healthcheck() is None:
                    return
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
    @staticmethod
    def _schedule_key(deployment, sched) -> str:
        return f"{deployment.id}:{sched.schedule.model_dump_json()}"

    def _active_schedules(self) -> set[str]:
        with self.client() as client:
            return {self._schedule_key(d, s) for d in client.read_deployments() for s in d.schedules or []
                    if s.active}

    def _reactivate(self, keys: set[str]) -> None:
        if not keys:
            return
        with self.client() as client:
            for d in client.read_deployments():
                for s in d.schedules or []:
                    if not s.active and self._schedule_key(d, s) in keys:
                        client.update_deployment_schedule(d.id, s.id, active=True)

    def start_worker(self) -> None:
        exe = str(Path(sys.executable).parent / "prefect")
        log = open(self.home / "worker.log", "a")
        self.worker = subprocess.Popen([exe, "worker", "start", "--pool", POOL], env=self.env(), cwd=REPO, stdout=log,
                                       stderr=subprocess.STDOUT, start_new_session=True)

    def stop(self) -> None:
        # The snapshot comes first: a process that left its group (the process worker starts each flow run in a session
        # of its own) is found only through its parent links, which break once the worker exits.
        tree: Tree = {}
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


# ---- nothing outlives the command ----

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
    seen: Tree = {}
    while True:
        ready, _, _ = select.select([fd], [], [], poll_s)
        if ready and not os.read(fd, 4096):
            break  # EOF: the parent has exited
        seen = {pid: p for pid, p in seen.items() if alive(p)}
        seen.update(descendants(parent))
        seen.pop(me, None)
    # Groups whose leader still runs, newest first (the worker before the server, as on an orderly stop); then the
    # recorded processes that remain, wherever they are.
    leaders = [p for p in seen.values() if leads_group(p)]
    for p in sorted(leaders, key=lambda p: p.create_time(), reverse=True):
        stop_group(p.pid, signal.SIGTERM, timeout)
    terminate(seen, timeout)


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_guard: dict = {}  # the active stop_tree_on_signals of this process: its pid and the handlers it replaced


def _after_fork_in_child() -> None:
    """A child forked without exec (multiprocessing, data loaders) must not report its signals to the parent's guard
    through the inherited wakeup fd, nor handle them as the parent does."""
    if _guard and _guard["pid"] != os.getpid():
        with contextlib.suppress(ValueError, OSError):
            signal.set_wakeup_fd(-1)
            for s, h in _guard["handlers"].items():
                signal.signal(s, h)
        _guard.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)


@contextlib.contextmanager
def stop_tree_on_signals(grace_s: float = 3.0, stop_s: float = 4.0):
    """Nothing started inside outlives this process when SIGTERM, SIGINT or SIGHUP stops it (`kill`, systemd, docker,
    Ctrl-C, a closed terminal); for the commands that run flows in-process (`webrl demo`, `train`, `phase`, `eval`,
    ...). Their children (Prefect's temporary server, the sites' server, browsers, a policy server, Ray, accelerate)
    mostly run in sessions of their own and receive nothing; a Python process ended by SIGTERM runs no cleanup, so
    without this they were left running, re-parented to init.

    The first stop signal raises KeyboardInterrupt in the main thread (during a flow Prefect first raises its own
    TerminationSignal and re-sends SIGTERM once it has marked the flow run Crashed), so the flow unwinds: its run is
    Crashed, the run dir's lock released. Then every descendant is stopped (`stop_tree`: SIGTERM, SIGKILL after
    `stop_s` s; Playwright's driver ignores SIGTERM) and the process exits at once with 128 + the signal's number;
    threads still running a task (a rollout, a training step) are not waited for. A helper thread, woken by the signal
    itself (signal.set_wakeup_fd, so also while the main thread is busy in C code), records the process tree and, if
    the main thread has not unwound within `grace_s` s, stops the tree and exits itself: a flow that is interrupted
    while tasks run in Prefect's thread pool waits for them as it unwinds. A stop thus takes at most grace_s + stop_s
    + 5 s. Further signals during the stop are ignored. (SIGKILL cannot be caught: see `watchdog` for what `webrl
    serve` does about it.)
    """
    if threading.current_thread() is not threading.main_thread() or _guard:
        yield
        return
    me = os.getpid()
    first: dict[str, int] = {}
    seen: Tree = {}
    unwound = threading.Event()
    stopping = threading.Lock()
    reader, writer = socket.socketpair()
    writer.setblocking(False)
    numbers = {int(s) for s in STOP_SIGNALS}

    def stop_and_exit() -> None:
        with stopping:  # the helper thread or the main thread, whichever comes first, stops the tree and exits
            seen.update(descendants(me))
            stop_tree(seen, stop_s)
            for f in (sys.stdout, sys.stderr):
                with contextlib.suppress(Exception):
                    f.flush()
            os._exit(128 + first["sig"])

    def on_signal(signum, frame):
        if first.get("raised"):
            return  # already stopping
        first["raised"] = 1
        first.setdefault("sig", signum)
        with contextlib.suppress(OSError):
            writer.send(bytes([signum]))  # wakes the helper also if someone else took over the wakeup fd
        raise KeyboardInterrupt

    def helper() -> None:
        while True:
            try:
                data = reader.recv(64)
            except OSError:
                return
            if not data:
                return  # closed: the command ended without a signal
            sig = next((b for b in data if b in numbers), None)
            if sig is not None:
                first.setdefault("sig", sig)
                break
        with contextlib.suppress(OSError, ValueError):
            print(f"{signal.Signals(first['sig']).name}: stopping ...", file=sys.stderr, flush=True)
        deadline = time.monotonic() + grace_s
        while not unwound.wait(0.2):
            seen.update(descendants(me))  # a process that would be re-parented later is known by then
            if time.monotonic() > deadline:
                stop_and_exit()

    handlers = {s: signal.signal(s, on_signal) for s in STOP_SIGNALS}
    old_fd = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
    _guard.update(pid=me, handlers=handlers)
    threading.Thread(target=helper, name="webrl-stop-on-signals", daemon=True).start()
    try:
        yield
    finally:
        if "sig" in first:
            unwound.set()
            stop_and_exit()
        _guard.clear()
        signal.set_wakeup_fd(old_fd)
        for s, h in handlers.items():
            signal.signal(s, h)
        writer.close()  # the helper's recv returns b"" and it ends
        reader.close()


def stops_its_tree(command):
    """Decorator of a CLI command: run it inside stop_tree_on_signals."""
    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        with stop_tree_on_signals():
            return command(*args, **kwargs)
    return wrapper

"""`webrl serve ...` stops its whole process tree on SIGTERM and SIGHUP, as on Ctrl-C.

systemd, docker and `kill` send SIGTERM (a closed terminal sends SIGHUP) to the `webrl serve` process only; its
children live in their own sessions, so nothing else reaches them. Each test starts a real server through the `webrl`
console script, records every descendant process, signals the `webrl serve` process alone, and then checks that no
recorded descendant is left alive and that the port can be bound again.

Linux only: the process tree is read from /proc.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from webrl_core.hardware import free_port

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")]
WEBRL = str(Path(sys.executable).parent / "webrl")


def _stat(pid: int) -> tuple[int, str, int] | None:
    """(ppid, state, start time in clock ticks) of `pid`, or None if it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = raw[raw.rindex(")") + 2:].split()  # the command name in (...) may contain spaces
    return int(fields[1]), fields[0], int(fields[19])


def _descendants(root: int) -> dict[int, int]:
    """Every process below `root` (pid -> start time); the start time tells a reused pid from the original."""
    children: dict[int, list[int]] = {}
    starts: dict[int, int] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and (st := _stat(int(d.name))) is not None:
            children.setdefault(st[0], []).append(int(d.name))
            starts[int(d.name)] = st[2]
    out, todo = {}, [root]
    while todo:
        for c in children.get(todo.pop(), []):
            out[c] = starts[c]
            todo.append(c)
    return out


def _alive(pid: int, start: int) -> bool:
    """Running (not a zombie waiting to be reaped) and still the process that was recorded."""
    st = _stat(pid)
    return st is not None and st[2] == start and st[1] != "Z"


def _describe(pids) -> str:
    out = []
    for pid in pids:
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            out.append(f"{pid}: {cmd[:160]}")
        except OSError:
            out.append(f"{pid}: (gone)")
    return "\n".join(out)


def _port_free(port: int) -> bool:
    # SO_REUSEADDR: the health checks leave connections in TIME_WAIT on the server's port, which would block a plain
    # bind even with no server; with it, Linux still refuses the bind while any socket listens on the port.
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
            s.listen()
        except OSError:
            return False
    return True


def _env(root: Path) -> dict:
    env = dict(os.environ, PREFECT_HOME=str(root / ".prefect"), PREFECT_SERVER_ANALYTICS_ENABLED="false",
               TOKENIZERS_PARALLELISM="false")
    for k in ("PREFECT_API_URL", "MLFLOW_TRACKING_URI"):  # the servers under test, not whatever the shell points at
        env.pop(k, None)
    return env


def _wait_ready(proc: subprocess.Popen, log: Path, url: str, marker: str, timeout: float) -> None:
    """Until `url` answers 200 and `marker` is in the log (the command printed that it has started everything)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if proc.poll() is not None:
            raise AssertionError(f"webrl serve exited with {proc.returncode} while starting:\n{log.read_text()[-4000:]}")
        try:
            if marker in log.read_text() and httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"not ready after {timeout} s:\n{log.read_text()[-4000:]}")


def _stop_and_check(proc: subprocess.Popen, log: Path, port: int, sig: int, min_children: int) -> None:
    """Signal the `webrl serve` process alone; every process recorded below it must be gone and the port free."""
    tree = _descendants(proc.pid)
    assert len(tree) >= min_children, f"expected at least {min_children} descendants:\n{_describe(tree)}"
    try:
        os.kill(proc.pid, sig)  # the `webrl serve` process only, as `kill`, systemd and docker do
        t0 = time.monotonic()
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"webrl serve still running 120 s after {sig.name}:\n{log.read_text()[-4000:]}")
        # After SIGTERM/SIGHUP webrl serve waits for its children before it exits, so the short grace only covers
        # the kernel tearing down processes just SIGKILLed. After SIGKILL it cannot wait: its watchdog process notices
        # the exit and stops the children (SIGTERM, SIGKILL after 10 s), which takes longer.
        deadline = time.monotonic() + (60 if sig == signal.SIGKILL else 5)
        while (left := [p for p, s in tree.items() if _alive(p, s)]) and time.monotonic() < deadline:
            time.sleep(0.2)
        stop_s = time.monotonic() - t0
        assert not left, f"still running after {sig.name} to webrl serve (exit {proc.returncode}):\n{_describe(left)}"
        assert _port_free(port), f"port {port} is still bound after {sig.name}"
        # documented: an orderly stop exits with 0, whichever signal asked for it
        expected = -signal.SIGKILL if sig == signal.SIGKILL else 0
        assert proc.returncode == expected, f"exit code {proc.returncode} after {sig.name}:\n{log.read_text()[-4000:]}"
        print(f"{sig.name}: webrl serve and {len(tree)} descendants gone in {stop_s:.1f} s")
    finally:  # never leave servers behind, whatever failed above
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for p, s in tree.items():
            if _alive(p, s):
                os.kill(p, signal.SIGKILL)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGKILL], ids=lambda s: s.name)
def test_serve_mlflow_stops_its_tree(tmp_path, sig):
    port = free_port()
    log = tmp_path / "serve.log"
    (tmp_path / "run").mkdir()  # a run dir: `webrl serve mlflow` refuses a folder that does not exist
    with open(log, "w") as out:
        proc = subprocess.Popen([WEBRL, "serve", "mlflow", "--run-dir", str(tmp_path / "run"), "--port", str(port)],
                                env=_env(tmp_path), stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait_ready(proc, log, f"http://127.0.0.1:{port}/health", "MLflow UI", timeout=180)
        time.sleep(2)  # the watchdog records the process tree every second; the SIGKILL case relies on that record
    except BaseException:
        _stop_and_kill_all(proc)
        raise
    # the MLflow CLI and the uvicorn server it spawns
    _stop_and_check(proc, log, port, sig, min_children=2)


@pytest.mark.timeout(900)
def test_serve_prefect_stops_its_tree(tmp_path):
    port = free_port()
    log = tmp_path / "serve.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([WEBRL, "serve", "prefect", "--home", str(tmp_path / ".prefect"), "--run-root",
                                 str(tmp_path), "--port", str(port)],
                                env=_env(tmp_path), stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        # "Prefect UI" is printed once the deployments exist and the worker has been started
        _wait_ready(proc, log, f"http://127.0.0.1:{port}/api/health", "Prefect UI", timeout=600)
        time.sleep(3)  # let the worker get going, so that the stop has a live worker to stop
    except BaseException:
        _stop_and_kill_all(proc)
        raise
    # the server and the worker at least
    _stop_and_check(proc, log, port, signal.SIGTERM, min_children=2)


def _stop_and_kill_all(proc: subprocess.Popen) -> None:
    """Start-up failed: SIGKILL the whole tree so that a failing test leaves nothing behind."""
    tree = _descendants(proc.pid)
    proc.kill()
    proc.wait()
    for p, s in tree.items():
        if _alive(p, s):
            os.kill(p, signal.SIGKILL)

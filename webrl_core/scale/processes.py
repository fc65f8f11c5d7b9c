"""Process trees on psutil: finding what a process started and stopping all of it, for the CLI (`webrl serve`, the
commands that run flows: webrl_cli/prefect_stack.py) and the fault harness (benchmarks/faults/procs.py).

A tree is ``{pid: psutil.Process}``. A recorded process is known by its psutil identity (pid and start time since
boot), so a pid that the kernel hands to a new process after the recorded one exited is never taken for it: not
alive, never signalled. A zombie counts as gone (it holds no port or memory, and an orphan's zombie is reaped by init,
which in some containers never happens), but the walk goes through it to what it left running.

Waits poll ``alive`` rather than use ``psutil.wait_procs``: that one counts an unreaped zombie as running until its
timeout and reaps our own children behind their ``subprocess.Popen``.

No stage reaches this module (only webrl_cli and benchmarks import it), so its code is outside every stage's cached
identity; ``ray_cluster.LocalRayCluster`` keeps its own psutil calls for the same reason (it is inside the rollout's).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable

import psutil

Tree = dict[int, psutil.Process]


def descendants(root: int) -> Tree:
    """Every live process below `root`, found through the parent links of all processes right now."""
    children: dict[int, list[int]] = {}
    for p in psutil.process_iter(["ppid"]):
        children.setdefault(p.info["ppid"], []).append(p.pid)
    out: Tree = {}
    walked, todo = {root}, [root]
    while todo:
        for pid in children.get(todo.pop(), []):
            if pid in walked:  # a pid reused while the table was read can make a cycle
                continue
            walked.add(pid)
            todo.append(pid)
            with contextlib.suppress(psutil.Error):
                p = psutil.Process(pid)  # fresh: process_iter's cached objects may carry a reused pid's identity
                if p.status() != psutil.STATUS_ZOMBIE:
                    out[pid] = p
    return out


def alive(proc: psutil.Process) -> bool:
    """Whether the recorded process still runs: the same process (not a reused pid) and not a zombie."""
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def running(pid: int) -> bool:
    """Whether some process that is not a zombie has `pid`."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def command_line(proc: psutil.Process) -> str:
    """Its arguments joined by spaces; "" if it is gone or not readable."""
    try:
        return " ".join(proc.cmdline())
    except psutil.Error:
        return ""


def leads_group(proc: psutil.Process) -> bool:
    """Whether the process still runs and leads a process group (it was started in a session of its own)."""
    try:
        return alive(proc) and os.getpgid(proc.pid) == proc.pid
    except OSError:
        return False


def group_alive(pgid: int) -> bool:
    """Whether any process of the group runs (zombies do not count)."""
    try:
        os.killpg(pgid, 0)  # fails when the group has no member at all
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    unknown = False
    for pid in psutil.pids():
        try:
            if os.getpgid(pid) != pgid:
                continue
        except ProcessLookupError:
            continue
        except PermissionError:  # another session, on systems that hide its group: the kill above said it has members
            unknown = True
            continue
        if running(pid):
            return True
    return unknown


def kill_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def signal_all(procs: Tree, sig: int) -> None:
    """`sig` to each recorded process that still runs."""
    for p in procs.values():
        if alive(p):
            with contextlib.suppress(psutil.Error):
                p.send_signal(sig)


def wait_until(cond: Callable[[], bool], timeout: float) -> bool:
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > timeout:
            return False
        time.sleep(0.1)
    return True


def stop_group(proc: subprocess.Popen | int, sig: int = signal.SIGTERM, timeout: float = 20.0) -> None:
    """Stop the process group that `proc` leads (it was started with start_new_session=True): `sig` to every member,
    up to `timeout` s for all of them to exit, then SIGKILL. The group, not the pid: a server that dies before the
    workers it forked would leave them running, orphaned, on its port."""
    pgid = proc if isinstance(proc, int) else proc.pid
    kill_group(pgid, sig)
    if not wait_until(lambda: not group_alive(pgid), timeout):
        kill_group(pgid, signal.SIGKILL)
        wait_until(lambda: not group_alive(pgid), 5)
    if not isinstance(proc, int):
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)  # reap it


def terminate(procs: Tree, timeout: float = 10.0) -> None:
    """SIGTERM to each recorded process that still runs, SIGKILL to those left after `timeout` s."""
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
        signal_all(procs, sig)
        if wait_until(lambda: not any(alive(p) for p in procs.values()), wait):
            return


def stop_tree(procs: Tree, timeout: float = 8.0) -> None:
    """Stop every recorded process and every process group one of them leads, all at once: SIGTERM, up to `timeout` s
    for all of them to exit, then SIGKILL."""
    groups = {pid for pid, p in procs.items() if leads_group(p)}

    def gone() -> bool:
        return not any(alive(p) for p in procs.values()) and not any(group_alive(g) for g in groups)

    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
        for g in groups:
            kill_group(g, sig)
        signal_all(procs, sig)
        if wait_until(gone, wait):
            return

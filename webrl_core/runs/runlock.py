"""One flow at a time per run directory: an exclusive, non-blocking lock on ``<run_dir>/.lock``.

Every flow that writes a run dir (webrl-bootstrap, webrl-phase, webrl-train, webrl-eval) holds the lock for its whole
body (``with runlock.hold(run_dir, flow="webrl-phase", phase=k): ...``). A second flow started on the same run dir,
from the CLI, a deployment run, a schedule or another worker, fails at once with ``RunDirBusy``, whose message names
the run dir and the holder (pid, host, flow, phase, Prefect flow run, start time); it never waits and never runs the
phase a second time.

The lock is filelock's ``FileLock``, ``flock(2)`` on an open file (its soft-marker fallback off: a marker would outlive
a killed holder), so the kernel releases it when the holder exits, however it exits: a phase killed with ``kill -9``
(or a Prefect flow run cancelled, or a worker machine rebooted) leaves no stale lock behind and the next run, the
resume, starts at once. The JSON note in the file (who holds it) is informational only; it is left behind after a
release and is never what decides.

Re-entrant within one process: webrl-train runs webrl-bootstrap and webrl-phase as sub-flows in its own process, and
their nested ``hold`` of the same run dir succeeds (the note then shows the sub-flow too). A forked child does not
inherit the lock (filelock closes its copy of the descriptor after the fork), so it cannot outlive its parent's hold.

Across machines the lock works where the run dir's filesystem supports ``flock`` between hosts (local disks; NFSv4 and
most cluster filesystems emulate it with POSIX locks); the note's host then says on which machine the holder runs.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import errno
import fcntl
import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from filelock import FileLock, Timeout

LOCK_NAME = ".lock"


class RunDirBusy(RuntimeError):
    """Another flow holds the run dir's lock. ``holder`` is its note (may be empty if it could not be read)."""

    def __init__(self, message: str, run_dir: str, holder: dict):
        super().__init__(message)
        self.run_dir = run_dir
        self.holder = holder


class _Held:
    def __init__(self, lock: FileLock, pid: int, note: dict):
        self.lock = lock
        self.pid = pid
        self.note = note
        self.stack: list[dict] = []  # nested holds (sub-flows) below the outermost one


_held: dict[str, _Held] = {}
_mutex = threading.RLock()


def _after_fork_in_child() -> None:
    # filelock closes the child's copies of the lock's descriptor (a child that outlives the parent holds nothing);
    # the child holds no run dir.
    global _mutex
    _mutex = threading.RLock()
    _held.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _phase(flow: str, phase: int | None) -> int | None:
    return 0 if flow == "webrl-bootstrap" else phase  # the bootstrap is phase 0, whether or not the caller says so


def _what(flow: str, phase: int | None) -> str:
    if flow == "webrl-phase" and phase is not None:
        return f"phase {phase}"
    if flow == "webrl-bootstrap":
        return "the bootstrap (phase 0)"
    return flow + (f" (phase {phase})" if phase is not None else "")


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).astimezone().isoformat(timespec="seconds")


def _write(rd: str, note: dict) -> None:
    with contextlib.suppress(OSError):  # the note is informational: a full disk must not fail the flow
        fd = os.open(Path(rd) / LOCK_NAME, os.O_WRONLY)
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, (json.dumps(note, sort_keys=True) + "\n").encode(), 0)
        finally:
            os.close(fd)


def _write_note(rd: str, h: _Held) -> None:
    note = dict(h.note)
    if h.stack:
        note["now"] = [{"flow": n["flow"], "phase": n["phase"], "since": n["since"]} for n in h.stack]
    _write(rd, note)


def read_note(run_dir: str | Path) -> dict:
    """The note of the current (or, if none holds it, the last) holder of the run dir's lock; {} if none/unreadable."""
    try:
        return json.loads((Path(run_dir) / LOCK_NAME).read_text() or "{}")
    except (OSError, ValueError):
        return {}


def is_held(run_dir: str | Path) -> bool:
    """Whether some process (this one included) holds the lock now."""
    rd = str(Path(run_dir).resolve())
    with _mutex:
        h = _held.get(rd)
        if h is not None and h.pid == os.getpid():
            return True
    try:
        fd = os.open(Path(rd) / LOCK_NAME, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:  # a shared probe (filelock has none): two probes at once do not take each other for a holder
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as e:
        if e.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
            return True
        raise
    finally:
        os.close(fd)
    return False


def _busy(rd: str, flow: str, phase: int | None, note: dict) -> RunDirBusy:
    phase = _phase(flow, phase)
    if not note:
        who = "another process (its note is not written yet)"
    else:
        who = f"pid {note.get('pid', '?')} on host {note.get('host', '?')}, flow {note.get('flow', '?')}"
        if note.get("phase") is not None and note.get("flow") not in ("webrl-phase", "webrl-bootstrap"):
            who += f" phase {note['phase']}"
        for n in note.get("now", []):
            who += f", now in {n['flow']}" + (f" phase {n['phase']}" if n.get("phase") is not None else "")
        if note.get("flow_run_id"):
            who += f", Prefect flow run {note['flow_run_id']}"
        who += f", since {note.get('since', '?')}"
    held_what = _what(note.get("flow", ""), note.get("phase")) if note else None
    mine = _what(flow, phase)
    same = bool(note) and (note.get("flow"), _phase(note.get("flow", ""), note.get("phase"))) == (flow, phase)
    if same:
        msg = f"{mine} of {rd} is already running ({who}); refusing to start it twice"
    elif note:
        msg = f"{rd} is busy: {held_what} is running there ({who}); refusing to start {mine} on it at the same time"
    else:
        msg = f"{rd} is locked by {who}; refusing to start {mine} on it at the same time"
    msg += (". Wait for it to finish, or stop it (a stopped or killed holder releases the lock at once), "
            f"then start this again: finished steps come from the cache. Lock file: {Path(rd) / LOCK_NAME}")
    return RunDirBusy(msg, rd, note)


def _holder_note(rd: str) -> dict:
    note = read_note(rd)
    if not note or "released" in note:  # the holder has just taken it and not yet written its note
        time.sleep(0.2)
        note = read_note(rd)
    return {} if "released" in note else note


def check_free(run_dir: str | Path, flow: str, phase: int | None = None) -> None:
    """Raise ``RunDirBusy`` (the message ``acquire`` would give) if another process holds the run dir's lock now.
    A pre-check, e.g. in the CLI before it starts Prefect and checks the flow's inputs; ``hold`` is what counts."""
    rd = str(Path(run_dir).resolve())
    with _mutex:
        h = _held.get(rd)
        if h is not None and h.pid == os.getpid():
            return
    if is_held(rd):
        raise _busy(rd, flow, phase, _holder_note(rd))


def acquire(run_dir: str | Path, flow: str, phase: int | None = None) -> None:
    """Take the run dir's lock or raise ``RunDirBusy``. Re-entrant within this process; pair with ``release``."""
    rd = str(Path(run_dir).resolve())
    entry = {"flow": flow, "phase": _phase(flow, phase), "since": _now()}
    with _mutex:
        h = _held.get(rd)
        if h is not None and h.pid == os.getpid():
            h.stack.append(entry)
            _write_note(rd, h)
            return
        Path(rd).mkdir(parents=True, exist_ok=True)
        lock = FileLock(Path(rd) / LOCK_NAME, blocking=False, thread_local=False, fallback_to_soft=False,
                        preserve_lock_file=True)
        try:
            lock.acquire()
        except Timeout:
            raise _busy(rd, flow, phase, _holder_note(rd)) from None
        note = {"pid": os.getpid(), "host": socket.gethostname(), "run_dir": rd, **entry}
        if os.environ.get("PREFECT__FLOW_RUN_ID"):  # set by Prefect workers in a deployment's flow-run process
            note["flow_run_id"] = os.environ["PREFECT__FLOW_RUN_ID"]
        h = _Held(lock, os.getpid(), note)
        _held[rd] = h
        _write_note(rd, h)


def release(run_dir: str | Path) -> None:
    """Undo one ``acquire`` of this process; the outermost one unlocks the run dir."""
    rd = str(Path(run_dir).resolve())
    with _mutex:
        h = _held.get(rd)
        if h is None or h.pid != os.getpid():
            raise RuntimeError(f"release of {rd}: this process does not hold its lock")
        if h.stack:
            h.stack.pop()
            _write_note(rd, h)
            return
        del _held[rd]
        _write(rd, {**h.note, "released": _now()})
        h.lock.release()


@contextlib.contextmanager
def hold(run_dir: str | Path, flow: str, phase: int | None = None) -> Iterator[dict]:
    """``with hold(rd, flow="webrl-phase", phase=2):`` -- the run dir is this flow's until the block exits (by return,
    exception or the process's death). Raises ``RunDirBusy`` at once if another process holds it. Yields the note."""
    acquire(run_dir, flow, phase)
    try:
        yield read_note(run_dir)
    finally:
        release(run_dir)

"""webrl_core.runs.runlock: one flow at a time per run dir, across processes; released by the OS when the holder dies;
re-entrant within a process (webrl-train's sub-flows)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from webrl_core.runs import runlock

REPO = Path(__file__).resolve().parents[2]


def _holder(rd: Path, flow: str = "webrl-phase", phase: int | None = 2, fork: bool = False) -> subprocess.Popen:
    """A process that takes the lock, says 'held' (and its forked child's pid, if `fork`), then sleeps."""
    code = textwrap.dedent(f"""
        import os, sys, time
        from webrl_core.runs import runlock
        runlock.acquire({str(rd)!r}, {flow!r}, {phase!r})
        child = 0
        if {fork!r}:
            r, w = os.pipe()
            child = os.fork()
            if child == 0:  # a forked helper (a DataLoader worker, a multiprocessing pool) that outlives its parent
                os.write(w, b"up")  # Python code runs in the child only after its fork hooks have run
                time.sleep(120)
                os._exit(0)
            os.read(r, 2)  # "held" only once the child runs: on a loaded box it may not have been scheduled yet
        print("held", child, flush=True)
        time.sleep(120)
    """)
    p = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stdout=subprocess.PIPE, text=True,
                         start_new_session=True)
    line = p.stdout.readline().split()
    assert line and line[0] == "held", f"holder did not start (exit {p.poll()})"
    p.child = int(line[1])
    return p


def _kill9(p: subprocess.Popen) -> None:
    os.kill(p.pid, signal.SIGKILL)
    p.wait(timeout=10)


def test_a_second_process_is_refused_with_the_holder_named(tmp_path):
    rd = tmp_path / "runs" / "demo"
    p = _holder(rd)
    try:
        assert runlock.is_held(rd)
        t0 = time.monotonic()
        with pytest.raises(runlock.RunDirBusy) as ei:
            runlock.acquire(rd, "webrl-phase", 2)
        assert time.monotonic() - t0 < 2  # refused at once, never waits
        msg = str(ei.value)
        assert msg.startswith(f"phase 2 of {rd.resolve()} is already running (pid {p.pid} on host "
                              f"{socket.gethostname()}, flow webrl-phase, since "), msg
        assert "refusing to start it twice" in msg
        assert ei.value.holder["pid"] == p.pid and ei.value.holder["phase"] == 2
        with pytest.raises(runlock.RunDirBusy) as ei2:  # the CLI's pre-check says the same, without taking it
            runlock.check_free(rd, "webrl-phase", 2)
        assert str(ei2.value) == msg
        # another flow on the same run dir is refused too, and says what holds it
        with pytest.raises(runlock.RunDirBusy, match=r"is busy: phase 2 is running there .*refusing to start "
                                                     r"the bootstrap \(phase 0\) on it"):
            with runlock.hold(rd, "webrl-bootstrap"):
                pytest.fail("the body must not run")
        # a different run dir is independent
        with runlock.hold(tmp_path / "runs" / "other", "webrl-phase", 2):
            pass
    finally:
        _kill9(p)


def test_the_bootstrap_is_phase_0_however_it_is_named(tmp_path):
    p = _holder(tmp_path, "webrl-bootstrap", None)
    try:
        with pytest.raises(runlock.RunDirBusy, match=r"^the bootstrap \(phase 0\) of .* is already running \(pid "
                                                     rf"{p.pid} on host .*, flow webrl-bootstrap, since .*twice"):
            runlock.check_free(tmp_path, "webrl-bootstrap", 0)
        assert runlock.read_note(tmp_path)["phase"] == 0
    finally:
        _kill9(p)


def test_kill_9_of_the_holder_releases_the_lock(tmp_path):
    rd = tmp_path / "run"
    p = _holder(rd, fork=True)
    try:
        _kill9(p)
        assert os.path.exists(f"/proc/{p.child}")  # its forked child still runs, with a copy of the descriptor
        assert not runlock.is_held(rd)
        assert runlock.read_note(rd)["pid"] == p.pid  # the stale note is left behind and does not matter
        runlock.check_free(rd, "webrl-phase", 2)
        with runlock.hold(rd, "webrl-phase", 2) as note:  # the resume starts at once
            runlock.check_free(rd, "webrl-phase", 2)  # held by this process: free for it
            assert note["pid"] == os.getpid() and note["flow"] == "webrl-phase" and note["phase"] == 2
    finally:
        os.kill(p.child, signal.SIGKILL)
    assert not runlock.is_held(rd)


def test_release_on_exception_and_reacquire(tmp_path):
    with pytest.raises(ValueError):
        with runlock.hold(tmp_path, "webrl-phase", 1):
            raise ValueError("boom")
    assert not runlock.is_held(tmp_path)
    assert json.loads((tmp_path / ".lock").read_text())["released"]
    with runlock.hold(tmp_path, "webrl-phase", 1):
        assert runlock.is_held(tmp_path)


def test_reentrant_within_a_process(tmp_path):
    rd = tmp_path / "run"
    probe = ("import sys; from webrl_core.runs import runlock\n"
             "try:\n    runlock.acquire(sys.argv[1], 'webrl-phase', 1)\nexcept runlock.RunDirBusy as e:\n"
             "    print(e); sys.exit(3)\n")

    def other_process() -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", probe, str(rd)], cwd=REPO, capture_output=True, text=True,
                              timeout=60)

    with runlock.hold(rd, "webrl-train"):
        with runlock.hold(rd, "webrl-bootstrap", 0):
            pass
        with runlock.hold(str(rd) + "/", "webrl-phase", 1):  # the same dir, spelled differently
            note = runlock.read_note(rd)
            assert note["flow"] == "webrl-train" and note["now"][0]["flow"] == "webrl-phase"
            r = other_process()
            assert r.returncode == 3 and "flow webrl-train, now in webrl-phase phase 1" in r.stdout, r.stdout + r.stderr
        assert "now" not in runlock.read_note(rd)
        r = other_process()  # the inner release left the outer hold in place
        assert r.returncode == 3 and "is busy: webrl-train is running there" in r.stdout, r.stdout + r.stderr
    r = other_process()
    assert r.returncode == 0, r.stdout + r.stderr
    with pytest.raises(RuntimeError, match="does not hold"):
        runlock.release(rd)

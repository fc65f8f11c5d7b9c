"""`webrl sites serve` stops on Ctrl-C and SIGTERM even when started with SIGINT ignored (a `&` job of a script or a
pytest-xdist worker's child inherits the ignore; before the explicit handlers it served on until killed)."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

WEBRL = Path(sys.executable).parent / "webrl"


def _ignore_sigint():
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_serve_stops_on_its_signal_with_sigint_inherited_as_ignored(sig):
    proc = subprocess.Popen([str(WEBRL), "sites", "serve"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True, preexec_fn=_ignore_sigint)
    try:
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("Serving"):
                break
        assert lines and lines[-1].startswith("Serving"), "".join(lines)
        proc.send_signal(sig)
        assert proc.wait(timeout=60) == 0
        assert "stopping" in proc.stdout.read()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)  # the group: the sites' child process too

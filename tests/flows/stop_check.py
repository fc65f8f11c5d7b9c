"""Stopping a `webrl` command by a signal and checking that nothing it started survives (issue 33: no process
outlives its command). Used by test_process_tree.py and, for `webrl phase` on the session's smoke run, test_flows.py.

A command runs in a session of its own with a marker in its environment. Once the processes a case waits for are up
(`wait_for`), the command alone gets the signal, as from `kill`, systemd or docker (Ctrl-C would also reach the
processes in its foreground group; the command alone is the harder case). Then, within 20 s: the command has exited
with 128 + the signal's number, no process recorded below it runs, and no process anywhere carries the marker (a
child re-parented to init before it was recorded still has it). Read from /proc (Linux).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from pathlib import Path

from shared_prefect import WEBRL

STOP_WITHIN_S = 20.0
# what "its servers are up" means, by a fragment of the command line
TEMPORARY_PREFECT_SERVER = "prefect.server.api.server"  # Prefect's temporary server (no PREFECT_API_URL)
BROWSER = "chromium"  # the rollout's browsers; the sites' server starts before them
UVICORN = "uvicorn"  # the web server of `webrl serve mlflow` and `webrl serve prefect`


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _marked(marker: str) -> dict[int, str]:
    """Every live process (not a zombie) whose environment holds `marker`."""
    from webrl_core.scale.processes import running

    out = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            env = (d / "environ").read_bytes()
        except OSError:
            continue
        if marker.encode() in env and running(int(d.name)):
            out[int(d.name)] = _cmdline(int(d.name))[:160]
    return out


class Command:
    """A `webrl` command started with a marker; `stop` signals it and checks its tree (see the module docstring)."""

    def __init__(self, args: list[str], env: dict[str, str], cwd: Path, log: Path):
        self.marker = f"WEBRL_TREE_TEST={uuid.uuid4().hex}"
        key, value = self.marker.split("=")
        self.log, self.args, self.tree = log, args, {}
        with open(log, "w") as out:
            self.proc = subprocess.Popen([WEBRL, *args], env={**env, key: value}, cwd=cwd, stdout=out,
                                         stderr=subprocess.STDOUT, start_new_session=True)

    def _record(self) -> None:
        from webrl_core.scale.processes import descendants

        self.tree.update(descendants(self.proc.pid))

    def wait_for(self, *fragments: str, printed: str | None = None, timeout: float = 600) -> None:
        """Until a process below the command has one of `fragments` in its command line (and the command has
        `printed` this)."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            self._record()
            if any(f in _cmdline(p) for p in self.tree for f in fragments) and (
                    printed is None or printed in self.log.read_text(errors="replace")):
                time.sleep(1)  # let it get going
                self._record()
                return
            if self.proc.poll() is not None:
                self.kill_all()
                raise AssertionError(f"webrl {' '.join(self.args)} exited with {self.proc.returncode} before "
                                     f"{fragments} started:\n{self.log.read_text()[-4000:]}")
            time.sleep(0.25)
        self.kill_all()
        raise AssertionError(f"no {fragments} below webrl {' '.join(self.args)} after {timeout} s:\n"
                             f"{self.log.read_text()[-4000:]}")

    def stop(self, sig: signal.Signals, exit_code: int | None = None) -> float:
        """`sig` to the command alone; asserts what the module docstring says (the exit code: `exit_code` if given)
        and returns the seconds it took."""
        from webrl_core.scale.processes import alive

        self._record()
        described = {p: _cmdline(p)[:160] for p in self.tree}
        try:
            t0 = time.monotonic()
            os.kill(self.proc.pid, sig)
            while time.monotonic() - t0 < STOP_WITHIN_S:
                left = {p: described[p] for p, proc in self.tree.items() if alive(proc)}
                marked = _marked(self.marker)
                if self.proc.poll() is not None and not left and not marked:
                    break
                time.sleep(0.2)
            took = time.monotonic() - t0
            ran = "\n".join(f"  {p}: {c}" for p, c in described.items())
            assert self.proc.poll() is not None, (f"webrl {self.args[0]} still runs {STOP_WITHIN_S:.0f} s after "
                                                  f"{sig.name}:\n{self.log.read_text()[-3000:]}")
            assert not left and not marked, (f"{sig.name} to webrl {self.args[0]}: still running after {took:.0f} s: "
                                             f"{left or marked}\nits processes were:\n{ran}")
            assert self.proc.returncode == (128 + sig if exit_code is None else exit_code), \
                f"exit code {self.proc.returncode} after {sig.name}:\n{self.log.read_text()[-3000:]}"
            print(f"{sig.name} to webrl {' '.join(self.args[:1])}: it and its {len(self.tree)} processes gone in "
                  f"{took:.1f} s")
            return took
        finally:
            self.kill_all()

    def kill_all(self) -> None:
        """Whatever happened, leave nothing behind: SIGKILL to the command, its recorded tree and the marked."""
        from webrl_core.scale.processes import alive

        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        victims = [p for p, proc in self.tree.items() if alive(proc)] + list(_marked(self.marker))
        for p in victims:
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass


def without_api(env: dict[str, str], home: Path) -> dict[str, str]:
    """`env` without PREFECT_API_URL, so that the command starts Prefect's temporary server (in `home`), as a user's
    `webrl demo` does."""
    env = {k: v for k, v in env.items() if k != "PREFECT_API_URL"}
    env["PREFECT_HOME"] = str(home)
    return env

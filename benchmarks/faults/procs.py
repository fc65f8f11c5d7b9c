"""The processes of a run: its tree, its browsers and the embedded sites' server; killing a tree (on
webrl_core.scale.processes)."""

from __future__ import annotations

import signal
import subprocess

from webrl_core.scale import processes


def descendants(pid: int) -> dict[int, str]:
    """{pid: command line} of every live process below ``pid``."""
    return {p: processes.command_line(proc) for p, proc in processes.descendants(pid).items()}


def kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL a flow and everything below it (its process group, then any descendant in another group)."""
    below = processes.descendants(proc.pid)
    processes.kill_group(proc.pid, signal.SIGKILL)
    processes.signal_all(below, signal.SIGKILL)
    proc.wait()


def browser_pids(pid: int) -> list[int]:
    """Main process of each Chromium browser below ``pid`` (a chromium whose command line has no ``--type=``:
    renderers, GPU and utility processes have one)."""
    return sorted(p for p, cmd in descendants(pid).items()
                  if "chrom" in cmd.split(" ", 1)[0].rsplit("/", 1)[-1] and "--type=" not in cmd)


def browsers_with_pages(pid: int) -> list[int]:
    """The browsers below ``pid`` that render a page right now (a ``--type=renderer`` child): their episodes are in
    flight, where a browser without one is idle or closing."""
    return sorted(b for b in browser_pids(pid) if any("--type=renderer" in c for c in descendants(b).values()))


def sites_pids(pid: int) -> list[int]:
    return sorted(p for p, cmd in descendants(pid).items() if "_serve_child" in cmd)

"""The processes of a run: its tree, its browsers and the embedded sites' server; killing a tree."""

from __future__ import annotations

import os
import signal
import subprocess


def _proc_table() -> dict[int, tuple[int, str]]:
    out = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                stat = f.read()
            with open(f"/proc/{d}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        out[int(d)] = (int(stat[stat.rindex(")") + 2:].split()[1]), cmd)
    return out


def descendants(pid: int) -> dict[int, str]:
    """{pid: command line} of every process below ``pid``."""
    table = _proc_table()
    children: dict[int, list[int]] = {}
    for p, (pp, _) in table.items():
        children.setdefault(pp, []).append(p)
    out, todo = {}, [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out[c] = table[c][1]
            todo.append(c)
    return out


def kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL a flow and everything below it (its process group, then any descendant in another group)."""
    below = descendants(proc.pid)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    for p in below:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass
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

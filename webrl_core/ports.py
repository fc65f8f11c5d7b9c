"""A TCP port for a server that another process will bind (an inference engine, the accelerate job's rendezvous
store, a Ray node, the MLflow or Prefect server of a test): free when probed, and outside the kernel's ephemeral
range.

A probe binds the port and releases it, so the port stays free only until somebody else binds it. A port from the
ephemeral range (Linux: ``/proc/sys/net/ipv4/ip_local_port_range``, 32768-60999 by default) can be taken in that
window by any socket the kernel numbers itself: another probe's bind to port 0, a gloo rank's listener, or the
source port of any outgoing connection, of which a test run or a rollout with browsers opens many a second. A port
below that range is only ever taken by a process that names it, which is why torchrun's default (29500) lies there.
So ``free_port`` draws from ``[LOW, ephemeral start)``: above Ray's default worker ports (10002-19999), below the
ephemeral range, with its own random generator (the global RNG untouched). Where the range cannot be read (not
Linux) or no drawn port is free, it falls back to the kernel's choice (bind to port 0).
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

LOW = 20_000
"""The lowest port drawn: above Ray's worker ports (``--min-worker-port`` 10002 .. ``--max-worker-port`` 19999)."""
TRIES = 64
EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_RNG = random.Random()  # seeded from os.urandom; a run's torch/numpy/random seeds do not pick its ports


def ephemeral_start(path: Path | None = None) -> int | None:
    """The first port the kernel hands out by itself (``path``: the range file), or None where that is not known."""
    try:
        return int((path or EPHEMERAL_RANGE_FILE).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _bindable(host: str, port: int) -> socket.socket | None:
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind((host, port))
        return sock
    except OSError:
        sock.close()
        return None


def _held_ports(n: int, host: str) -> list[socket.socket]:
    """``n`` sockets bound to distinct free ports (module docstring), still open."""
    held: list[socket.socket] = []
    top = ephemeral_start()
    try:
        if top is not None and top - LOW > 4 * n:
            for port in _RNG.sample(range(LOW, top), min(top - LOW, TRIES + n)):
                if len(held) == n:
                    break
                sock = _bindable(host, port)
                if sock is not None:
                    held.append(sock)
        while len(held) < n:  # the kernel's choice
            sock = _bindable(host, 0)
            if sock is None:
                raise OSError(f"no free TCP port on {host}")
            held.append(sock)
        return held
    except BaseException:
        for s in held:
            s.close()
        raise


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """``n`` distinct ports free on ``host`` now, outside the ephemeral range where it is known."""
    held = _held_ports(n, host)
    ports = [s.getsockname()[1] for s in held]
    for s in held:
        s.close()
    return ports


def free_port(host: str = "127.0.0.1") -> int:
    """A port free on ``host`` now, outside the ephemeral range where it is known (module docstring)."""
    return free_ports(1, host)[0]

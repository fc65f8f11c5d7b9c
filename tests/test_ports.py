import random
import socket

import pytest

from webrl_core import ports


def _listen(port: int) -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", port))
    s.listen()
    return s


@pytest.mark.skipif(ports.ephemeral_start() is None, reason="the kernel's ephemeral range is not readable here")
def test_ports_are_free_distinct_and_below_the_ephemeral_range():
    state = random.getstate()
    got = ports.free_ports(5)
    assert random.getstate() == state  # a run's seeded RNG does not pick ports
    assert len(set(got)) == 5
    assert all(ports.LOW <= p < ports.ephemeral_start() for p in got)
    for p in got:  # each can be bound by the server that asked for it
        _listen(p).close()


def test_a_taken_port_is_never_handed_out(monkeypatch, tmp_path):
    taken = _listen(0)  # a listener on some port
    port = taken.getsockname()[1]
    try:
        start = tmp_path / "range"
        start.write_text(f"{port + 1}\t{port + 1000}\n")
        monkeypatch.setattr(ports, "EPHEMERAL_RANGE_FILE", start)
        monkeypatch.setattr(ports, "LOW", port - 200)
        # the draw offers the taken port first
        monkeypatch.setattr(ports._RNG, "sample", lambda pop, k: [port] + [p for p in pop if p != port][:k - 1])
        assert ports.ephemeral_start(start) == port + 1
        got = ports.free_port()
        assert got != port and port - 200 <= got <= port
    finally:
        taken.close()


def test_without_a_known_range_the_kernel_picks(monkeypatch, tmp_path):
    monkeypatch.setattr(ports, "EPHEMERAL_RANGE_FILE", tmp_path / "missing")
    assert ports.ephemeral_start(tmp_path / "missing") is None
    p = ports.free_port()
    assert p > 0
    _listen(p).close()

"""webrl_core/hardware.py: the CPU named in figures and in the keys of the box's kept measurements; the box's rates;
free ports for other processes' servers."""

from __future__ import annotations

import os
import random
import socket

import pytest

from webrl_core import hardware
from webrl_core.hardware import cpu_summary

ZEN4 = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 17
model name\t: AMD EPYC
flags\t\t: fpu avx2 avx512f avx512_bf16

processor\t: 1
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 17
model name\t: AMD EPYC
flags\t\t: fpu avx2 avx512f avx512_bf16
"""


def test_two_cpus_under_one_name_are_told_apart_by_family_and_model():
    zen4 = cpu_summary(ZEN4)
    assert zen4 == f"AMD EPYC (family 25, model 17), {os.cpu_count()} cores, avx512_bf16"
    other = cpu_summary(ZEN4.replace("cpu family\t: 25", "cpu family\t: 26").replace("model\t\t: 17", "model\t\t: 2"))
    assert other.startswith("AMD EPYC (family 26, model 2),") and other != zen4


def test_the_bf16_path_and_a_missing_name_come_from_the_text_given():
    avx2 = cpu_summary("model name\t: AMD EPYC\nflags\t\t: fpu avx2\n")
    assert avx2 == f"AMD EPYC, {os.cpu_count()} cores, AVX2 only (bf16 emulated)"
    assert cpu_summary("") == f"unknown CPU, {os.cpu_count()} cores, no AVX2"
    amx = cpu_summary("model name\t: Intel(R) Xeon(R)\ncpu family\t: 6\nmodel\t\t: 143\n"
                      "flags\t\t: avx2 amx_bf16 avx512_bf16\n")
    assert amx.endswith("cores, amx_bf16, avx512_bf16") and "(family 6, model 143)" in amx


def test_this_box_is_named_as_its_cpuinfo_says():
    assert cpu_summary() == cpu_summary(open("/proc/cpuinfo").read())


def test_the_box_rates_are_measured_without_drawing_from_the_global_rng():
    import torch

    from webrl_core.hardware import copy_bandwidth, matmul_peak_flops

    torch.manual_seed(3)
    expected = torch.rand(4)
    torch.manual_seed(3)
    peak, bandwidth = matmul_peak_flops(n=128, reps=2, rounds=2), copy_bandwidth(mb=4, rounds=2)
    assert torch.equal(torch.rand(4), expected)  # a stage measures them between its draws
    # 2 n^3 FLOPs a product and 2 bytes a copied byte: rates, not seconds (loose: the suite runs beside itself)
    assert peak > 1e7 and bandwidth > 1e7


def _listen(port: int) -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", port))
    s.listen()
    return s


@pytest.mark.skipif(hardware.ephemeral_start() is None, reason="the kernel's ephemeral range is not readable here")
def test_ports_are_free_distinct_and_below_the_ephemeral_range():
    state = random.getstate()
    got = hardware.free_ports(5)
    assert random.getstate() == state  # a run's seeded RNG does not pick ports
    assert len(set(got)) == 5
    assert all(hardware.PORT_LOW <= p < hardware.ephemeral_start() for p in got)
    for p in got:  # each can be bound by the server that asked for it
        _listen(p).close()


def test_a_taken_port_is_never_handed_out(monkeypatch, tmp_path):
    taken = _listen(0)  # a listener on some port
    port = taken.getsockname()[1]
    try:
        start = tmp_path / "range"
        start.write_text(f"{port + 1}\t{port + 1000}\n")
        monkeypatch.setattr(hardware, "EPHEMERAL_RANGE_FILE", start)
        monkeypatch.setattr(hardware, "PORT_LOW", port - 200)
        # the draw offers the taken port first
        monkeypatch.setattr(hardware._PORT_RNG, "sample", lambda pop, k: [port] + [p for p in pop if p != port][:k - 1])
        assert hardware.ephemeral_start(start) == port + 1
        got = hardware.free_port()
        assert got != port and port - 200 <= got <= port
    finally:
        taken.close()


def test_without_a_known_range_the_kernel_picks(monkeypatch, tmp_path):
    monkeypatch.setattr(hardware, "EPHEMERAL_RANGE_FILE", tmp_path / "missing")
    assert hardware.ephemeral_start(tmp_path / "missing") is None
    p = hardware.free_port()
    assert p > 0
    _listen(p).close()

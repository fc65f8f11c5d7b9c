"""webrl_core/hardware.py: the CPU named in figures and in the keys of the box's kept measurements; the box's rates."""

from __future__ import annotations

import os

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

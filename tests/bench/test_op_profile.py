"""bench.op_profile: the kinds a stage's time is split into, on a real profile of real kernels."""

from __future__ import annotations

import torch

from benchmarks import op_profile as P


def test_kinds_of_operators():
    assert P.kind_of("aten::mm") == P.kind_of("aten::addmm") == P.kind_of("aten::bmm") == "matmul"
    assert P.kind_of("aten::_scaled_dot_product_flash_attention_for_cpu") == "attention"
    assert P.kind_of("aten::_softmax") == "attention"
    # the GPU backends sdpa dispatches to (an H200 profile: masked rows ran the memory-efficient kernels)
    assert P.kind_of("aten::_efficient_attention_backward") == "attention"
    assert P.kind_of("aten::_cudnn_attention_forward") == "attention"
    assert P.kind_of("aten::copy_") == P.kind_of("aten::_to_copy") == P.kind_of("aten::embedding") == "convert/copy"
    assert P.kind_of("aten::mul") == P.kind_of("aten::silu") == "elementwise"
    assert P.kind_of("autograd::engine::evaluate_function: MmBackward0") == "python/other"


def test_a_profiled_step_splits_its_time_by_kind():
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(512, 512))
    opt = torch.optim.AdamW([w], lr=1e-3)
    x = torch.randn(256, 512)

    def step():
        for _ in range(5):
            y = (x.to(torch.bfloat16).float() @ w).relu()  # a conversion, a matmul, an elementwise op
            y.sum().backward()
            opt.step()
            opt.zero_grad()
        return "done"

    result, split, wall, top = P.profiled(step)
    assert result == "done" and set(split) == set(P.KINDS)
    assert any(r["name"] == "aten::mm" and r["calls"] >= 5 and r["self_cpu_s"] > 0 for r in top), top
    assert abs(sum(split.values()) - wall) < 0.05 * wall + 1e-3  # python/other makes up the wall time
    for kind in ("matmul", "convert/copy", "elementwise", "optimizer"):
        assert split[kind] > 0, split


def test_limits_and_bytes():
    assert P.unavoidable_bytes(100, 10, 2, steps=3) == 3 * (90 * 2 + 10 * 40)
    lim = P.limit_seconds(flops=2e9, peak_flops=1e9, bytes_=1e9, bandwidth=1e10)
    assert lim == {"compute_s": 2.0, "memory_s": 0.1, "limit_s": 2.0, "bound": "compute"}

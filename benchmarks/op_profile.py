"""Where a training stage's time goes, and how far it is from the box's limit (``webrl bench train --model --profile``).

The stage runs under ``torch.profiler`` (CPU activities; on a GPU the CUDA activity too, and an operator's time is
then the GPU time of the kernels it launched). Every operator's self time goes to one kind:

    optimizer      any operator under ``Optimizer.step`` (AdamW's foreach kernels)
    matmul         aten::mm / addmm / bmm / baddbmm / mv / addmv / dot (and oneDNN linear kernels)
    attention      scaled-dot-product attention (forward and backward), softmax
    convert/copy   aten::copy_ / _to_copy / clone / contiguous / cat / stack, embedding and index lookups, fills:
                   bytes moved, dtype conversions (autocast's weight casts are copy_ into a new dtype) included
    elementwise    every other aten operator (add, mul, silu, rsqrt, reductions, ...)
    python/other   wall time minus the operators' self times: Python, the Trainer, collation, tokenisation (on a
                   GPU: the time the GPU sat idle)

The limit of a stage is the larger of two lower bounds measured on the same box in the same run:

    compute  = model FLOPs / matmul peak in the stage's dtype
    memory   = unavoidable bytes / copy bandwidth, per optimizer step:
               every frozen weight read once in the compute dtype (2 B in bf16, 4 B in float32); every trained
               float32 weight read in the forward and again in the backward, its gradient written, and AdamW
               reading weight, gradient, m, v (4 x 4 B) and writing weight, m, v (3 x 4 B): 40 B; activations are
               not counted

``share of limit = limit / seconds``: 100% means the stage runs at the box's speed for its work.
"""

from __future__ import annotations

import re
import time
from collections import defaultdict

from webrl_core.hardware import synchronize

KINDS = ("matmul", "attention", "convert/copy", "elementwise", "optimizer", "python/other")
_MATMUL = re.compile(r"^aten::(mm|addmm|_addmm_activation|bmm|baddbmm|mv|addmv|dot|matmul|linear)$|mkldnn|onednn|"
                     r"brgemm|gemm")
# sdpa's backends by their operators' names (a GPU run profiles these, not scaled_dot_product_attention alone)
_ATTENTION = re.compile(r"scaled_dot_product|flash_attention|efficient_attention|cudnn_attention|"
                        r"^aten::_?softmax|_softmax_backward")
_COPY = re.compile(r"^aten::(copy_|_to_copy|to|clone|contiguous|cat|stack|embedding|embedding_dense_backward|"
                   r"index|index_select|index_put_|gather|scatter|scatter_add_|fill_|zero_|zeros|zeros_like|"
                   r"new_zeros|empty|empty_strided|empty_like|resize_|_unsafe_view|masked_fill_)$")


def kind_of(name: str) -> str:
    """The kind (``KINDS``) of an operator outside the optimizer, by its name."""
    if _MATMUL.search(name):
        return "matmul"
    if _ATTENTION.search(name):
        return "attention"
    if _COPY.search(name):
        return "convert/copy"
    return "elementwise" if name.startswith("aten::") else "python/other"


def time_split(events, wall_s: float, device_time: bool = False) -> dict[str, float]:
    """Seconds per kind (``KINDS``) from a profiler's ``events()``; ``python/other`` makes up the wall time. With
    ``device_time`` (a GPU run) each operator counts the GPU time of the kernels it launched, so ``python/other``
    is the time the GPU sat idle: launches, Python, the Trainer, waits for the host."""
    from torch.autograd import DeviceType

    out: dict[str, float] = defaultdict(float)
    for e in events:
        if e.cpu_parent is None and e.name.startswith("ProfilerStep"):
            continue
        if device_time and e.device_type != DeviceType.CPU:
            continue  # a kernel's time is in the operator that launched it
        parent, in_optimizer = e, False
        while parent is not None:
            if parent.name.startswith("Optimizer.step"):
                in_optimizer = True
                break
            parent = parent.cpu_parent
        seconds = (e.self_device_time_total if device_time else e.self_cpu_time_total) / 1e6
        out["optimizer" if in_optimizer else kind_of(e.name)] += seconds
    out["python/other"] += max(0.0, wall_s - sum(out.values()))
    return {k: out.get(k, 0.0) for k in KINDS}


def top_ops(prof, n: int = 15) -> list[dict]:
    """The ``n`` operators (and runtime calls) with the most self time, on the GPU where the run used one, else on
    the CPU: name, calls, self CPU seconds, self GPU seconds."""
    rows = [{"name": a.key, "calls": a.count, "self_cpu_s": a.self_cpu_time_total / 1e6,
             "self_gpu_s": a.self_device_time_total / 1e6} for a in prof.key_averages()]
    on_gpu = any(r["self_gpu_s"] > 0 for r in rows)
    return sorted(rows, key=lambda r: r["self_gpu_s" if on_gpu else "self_cpu_s"], reverse=True)[:n]


def profiled(fn, device: str = "cpu"):
    """``fn()`` under the profiler (the GPU's activity too on a GPU run): (its result, seconds per kind, wall
    seconds, ``top_ops``)."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device != "cpu" else [])
    with profile(activities=activities) as prof:
        t0 = time.perf_counter()
        result = fn()
        synchronize(device)
        wall = time.perf_counter() - t0
    return result, time_split(prof.events(), wall, device_time=device != "cpu"), wall, top_ops(prof)


def unavoidable_bytes(total_params: int, trained_params: int, compute_bytes: int, steps: int) -> float:
    """The memory-traffic lower bound of ``steps`` optimizer steps (module docstring)."""
    per_step = (total_params - trained_params) * compute_bytes + trained_params * (3 * 4 + 7 * 4)
    return float(per_step * steps)


def limit_seconds(flops: float, peak_flops: float, bytes_: float, bandwidth: float) -> dict[str, float]:
    """The stage's two lower bounds and the larger, in seconds."""
    compute, memory = flops / peak_flops, bytes_ / bandwidth
    return {"compute_s": compute, "memory_s": memory, "limit_s": max(compute, memory),
            "bound": "compute" if compute >= memory else "memory"}

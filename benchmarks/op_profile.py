"""Where a training stage's time goes, and how far it is from the box's limit (``webrl bench train --model --profile``).

The stage runs under ``torch.profiler`` (CPU activities). Every operator's self time goes to one kind:

    optimizer      any operator under ``Optimizer.step`` (AdamW's foreach kernels)
    matmul         aten::mm / addmm / bmm / baddbmm / mv / addmv / dot (and oneDNN linear kernels)
    attention      scaled-dot-product attention (forward and backward), softmax
    convert/copy   aten::copy_ / _to_copy / clone / contiguous / cat / stack, embedding and index lookups, fills:
                   bytes moved, dtype conversions (autocast's weight casts are copy_ into a new dtype) included
    elementwise    every other aten operator (add, mul, silu, rsqrt, reductions, ...)
    python/other   wall time minus the operators' self times: Python, the Trainer, collation, tokenisation

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

import torch

KINDS = ("matmul", "attention", "convert/copy", "elementwise", "optimizer", "python/other")
_MATMUL = re.compile(r"^aten::(mm|addmm|_addmm_activation|bmm|baddbmm|mv|addmv|dot|matmul|linear)$|mkldnn|onednn|"
                     r"brgemm|gemm")
_ATTENTION = re.compile(r"scaled_dot_product|flash_attention|^aten::_?softmax|_softmax_backward")
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


def time_split(events, wall_s: float) -> dict[str, float]:
    """Seconds per kind (``KINDS``) from a profiler's ``events()``; ``python/other`` makes up the wall time."""
    out: dict[str, float] = defaultdict(float)
    for e in events:
        if e.cpu_parent is None and e.name.startswith("ProfilerStep"):
            continue
        parent, in_optimizer = e, False
        while parent is not None:
            if parent.name.startswith("Optimizer.step"):
                in_optimizer = True
                break
            parent = parent.cpu_parent
        out["optimizer" if in_optimizer else kind_of(e.name)] += e.self_cpu_time_total / 1e6
    out["python/other"] += max(0.0, wall_s - sum(out.values()))
    return {k: out.get(k, 0.0) for k in KINDS}


def profiled(fn):
    """``fn()`` under the CPU profiler: (its result, seconds per kind, wall seconds)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        result = fn()
        wall = time.perf_counter() - t0
    return result, time_split(prof.events(), wall), wall


def copy_bandwidth(mb: int = 64, rounds: int = 5, dtype: torch.dtype = torch.float32, device: str = "cpu") -> float:
    """Best bytes/s (read + written) of a ``dst.copy_(src)`` of ``mb`` MB in ``dtype`` on ``device`` now (on a GPU,
    give ``mb`` several times its L2 cache, or the copy measures the cache)."""
    n = mb * 2 ** 20 // torch.tensor([], dtype=dtype).element_size()
    src, dst = torch.randn(n, device=device).to(dtype), torch.empty(n, dtype=dtype, device=device)
    dst.copy_(src)
    best = 0.0
    for _ in range(rounds):
        _sync(device)
        t = time.perf_counter()
        dst.copy_(src)
        _sync(device)
        best = max(best, 2 * src.numel() * src.element_size() / (time.perf_counter() - t))
    return best


def _sync(device: str) -> None:
    if device != "cpu":
        torch.cuda.synchronize()


def unavoidable_bytes(total_params: int, trained_params: int, compute_bytes: int, steps: int) -> float:
    """The memory-traffic lower bound of ``steps`` optimizer steps (module docstring)."""
    per_step = (total_params - trained_params) * compute_bytes + trained_params * (3 * 4 + 7 * 4)
    return float(per_step * steps)


def limit_seconds(flops: float, peak_flops: float, bytes_: float, bandwidth: float) -> dict[str, float]:
    """The stage's two lower bounds and the larger, in seconds."""
    compute, memory = flops / peak_flops, bytes_ / bandwidth
    return {"compute_s": compute, "memory_s": memory, "limit_s": max(compute, memory),
            "bound": "compute" if compute >= memory else "memory"}

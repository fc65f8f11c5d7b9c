"""A decoding model's linear layers in the matmul form this box runs fastest at a decode step's few rows.

A decode step multiplies every weight W [out, in] by one row per sequence of the batch, x [rows, in]:
y = x W^T. ``torch.nn.functional.linear`` hands BLAS a product with ``rows`` as its M; the same y computed as
(W x^T)^T has ``out`` as its M and ``rows`` as its N. The sums are the same up to rounding; the speed is not, and
which form wins depends on the box's BLAS: on a 2-core AMD EPYC (AVX2, float32, torch 2.13's MKL 2024.2) the
linear form ran SmolLM2-135M's 576 x 576 projection at 4 rows in 125 us and its 49,152 x 576 LM head in 24 ms,
the transposed form in 83 us and 9.3 ms (docs/benchmarks.md, "Decoding on the AVX2 box").

So ``fastest_forms`` times both forms on each distinct weight shape of the model, with that shape's own weight, at
the policy's batch rows and at one row; where the transposed form is faster by more than ``TIE`` at the batch's
rows and no slower at one row, ``apply`` turns those layers into ``WeightsFirstLinear``: the transposed form up
to ``rows`` rows, ``F.linear`` above (a prefill's hundreds of rows), the same parameters and state dict. The
choice is kept per CPU, threads, torch version, dtype, shape and rows in ``~/.cache/webrl/decode-linear.json``, so
a box measures each shape once (about a second for SmolLM2). ``WEBRL_CALIBRATE=0`` keeps ``F.linear``, as for the
micro-batch (learn/micro_batch.py).
"""

from __future__ import annotations

import hashlib
import json
import statistics
import time

import torch
import torch.nn.functional as F

from webrl_core.artifacts import user_cache_dir
from webrl_core.learn import micro_batch

TIE = 0.1  # the transposed form must win by more than this share at the batch's rows
ROUNDS = 5  # timed rounds per shape (after one warm-up), both forms in each; the median counts
ROUND_S = 0.01  # each form's calls in a round last about this long


class WeightsFirstLinear(torch.nn.Linear):
    """``nn.Linear`` computing y = (W x^T)^T for inputs of at most ``max_rows`` rows (all leading dimensions
    together), ``F.linear`` above. Made by ``apply`` from a loaded ``nn.Linear`` (its class is swapped, the
    parameters stay)."""

    max_rows: int = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
        if x.dim() < 2 or not 0 < rows <= self.max_rows:
            return F.linear(x, self.weight, self.bias)
        y = torch.mm(self.weight, x.reshape(rows, x.shape[-1]).t()).t().contiguous()
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], self.out_features)


def _seconds_per_call(fn, calls: int) -> float:
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls


def _time_forms(weight: torch.Tensor, rows: int) -> tuple[float, float]:
    """Median seconds per call of (linear, weights-first) at ``rows`` rows, interleaved rounds."""
    x = torch.randn(rows, weight.shape[1], dtype=weight.dtype, device=weight.device)
    forms = (lambda: F.linear(x, weight), lambda: torch.mm(weight, x.t()).t().contiguous())
    times: list[list[float]] = [[], []]
    with torch.inference_mode():
        first = [_seconds_per_call(f, 2) for f in forms]  # warm-up (kernel choice, allocations) and a call count
        calls = [max(1, min(1000, int(ROUND_S / max(t, 1e-7)))) for t in first]
        for _ in range(ROUNDS):
            for i, f in enumerate(forms):
                times[i].append(_seconds_per_call(f, calls[i]))
    return statistics.median(times[0]), statistics.median(times[1])


def _key(weight: torch.Tensor, rows: int) -> str:
    from webrl_core.hardware import cpu_summary

    blob = json.dumps([cpu_summary(), torch.get_num_threads(), torch.__version__, str(weight.dtype),
                       list(weight.shape), rows])
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def cache_file():
    return user_cache_dir() / "decode-linear.json"


def fastest_forms(model: torch.nn.Module, rows: int) -> dict[tuple[int, int, torch.dtype], bool]:
    """For each distinct (out, in, dtype) of the model's ``nn.Linear`` layers: True where the weights-first form
    wins at ``rows`` rows (and does not lose at one row), by measurement here or as kept for this box."""
    kept = micro_batch.read_kept(cache_file())
    found: dict[tuple[int, int, torch.dtype], bool] = {}
    for mod in model.modules():
        if type(mod) is not torch.nn.Linear:
            continue
        shape = (mod.out_features, mod.in_features, mod.weight.dtype)
        if shape in found:
            continue
        key = _key(mod.weight, rows)
        if key not in kept:
            lin, wf = _time_forms(mod.weight.detach(), rows)
            lin1, wf1 = _time_forms(mod.weight.detach(), 1) if rows > 1 else (lin, wf)
            kept[key] = {"weights_first": wf < (1 - TIE) * lin and wf1 <= (1 + TIE) * lin1,
                         "shape": list(mod.weight.shape), "dtype": str(mod.weight.dtype), "rows": rows,
                         "us": {"linear": round(lin * 1e6, 1), "weights_first": round(wf * 1e6, 1),
                                "linear@1": round(lin1 * 1e6, 1), "weights_first@1": round(wf1 * 1e6, 1)},
                         "measured": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
            micro_batch.keep(cache_file(), key, kept[key])
        found[shape] = kept[key]["weights_first"]
    return found


def apply(model: torch.nn.Module, rows: int) -> int:
    """Turn the model's ``nn.Linear`` layers whose shape runs faster weights-first at ``rows`` rows on this CPU
    into ``WeightsFirstLinear`` (up to ``rows`` rows). Nothing on another device or with calibration off.
    Returns how many layers changed."""
    param = next(model.parameters(), None)
    if param is None or param.device.type != "cpu" or not micro_batch.enabled() or rows < 1:
        return 0
    forms = fastest_forms(model, rows)
    changed = 0
    for mod in model.modules():
        if type(mod) is torch.nn.Linear and forms.get((mod.out_features, mod.in_features, mod.weight.dtype)):
            mod.__class__ = WeightsFirstLinear
            mod.max_rows = rows
            changed += 1
    return changed

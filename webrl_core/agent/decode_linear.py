"""A decoding model's linear layers in the matmul form this box runs fastest at a decode step's few rows.

A decode step multiplies every weight W [out, in] by one row per sequence of the batch, x [rows, in]:
y = x W^T. ``torch.nn.functional.linear`` hands BLAS a product with ``rows`` as its M; the same y computed as
(W x^T)^T has ``out`` as its M and ``rows`` as its N. The sums are the same up to rounding; the speed is not, and
which form wins depends on the box's BLAS: on a 2-core AMD EPYC (AVX2, float32, torch 2.13's MKL 2024.2) the
linear form ran SmolLM2-135M's 576 x 576 projection at 4 rows in 125 us and its 49,152 x 576 LM head in 24 ms,
the transposed form in 83 us and 9.3 ms (docs/benchmarks.md, "Decoding on the AVX2 box").

So ``fastest_forms`` times both forms on each distinct weight shape of the model, with that shape's own weight, at
1, 2, 4, ... rows up to the policy's batch size (a rollout of 4 browsers decodes 4 rows however large the batch
may be); where the transposed form is faster by more than ``TIE`` at a row count, ``apply`` makes those layers
``WeightsFirstLinear`` for the row counts it stands for (those above the next smaller measured count):
(W x^T)^T there, ``F.linear`` at every other count (a prefill's hundreds of rows), the same parameters and state
dict. Each measurement is kept per CPU, threads, torch version, dtype, shape and rows in
``~/.cache/webrl/decode-linear.json``, so a box measures each once (a few seconds for SmolLM2).
``WEBRL_CALIBRATE=0`` keeps ``F.linear``, as for the micro-batch (learn/micro_batch.py).
"""

from __future__ import annotations

import hashlib
import json
import time

import torch
import torch.nn.functional as F

from webrl_core.artifacts import user_cache_dir
from webrl_core.learn import micro_batch

TIE = 0.1  # the transposed form must win by more than this share at a row count
ROUNDS = 5  # timed rounds per shape and row count (after a warm-up), both forms in each; the median counts
ROUND_S = 0.01  # each form's calls in a round last about this long


class WeightsFirstLinear(torch.nn.Linear):
    """``nn.Linear`` computing y = (W x^T)^T for inputs whose row count (all leading dimensions together) is in
    ``weights_first_rows``, ``F.linear`` for any other. Made by ``apply`` from a loaded ``nn.Linear`` (its class is
    swapped, the parameters stay)."""

    weights_first_rows: frozenset[int] = frozenset()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // x.shape[-1] if x.dim() >= 2 and x.shape[-1] else 0
        if rows not in self.weights_first_rows:
            return F.linear(x, self.weight, self.bias)
        y = torch.mm(self.weight, x.reshape(rows, x.shape[-1]).t()).t().contiguous()
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], self.out_features)


def _time_forms(weight: torch.Tensor, rows: int) -> tuple[float, float]:
    """Seconds per call of (linear, weights-first) at ``rows`` rows: the median of ``ROUNDS`` interleaved rounds
    after a warm-up, as the micro-batch is measured (``micro_batch.round_robin``)."""
    x = torch.randn(rows, weight.shape[1], dtype=weight.dtype, device=weight.device)
    forms = {"linear": lambda: F.linear(x, weight), "weights_first": lambda: torch.mm(weight, x.t()).t().contiguous()}

    def run(calls: list, c: tuple[int, str]) -> tuple[float, int]:
        t0 = time.perf_counter()
        for _ in calls:
            forms[c[1]]()
        return max(time.perf_counter() - t0, 1e-9), len(calls)

    with torch.inference_mode():
        once = run([0], (1, "linear"))[0]  # sizes a round: about ROUND_S of the linear form
        calls = list(range(max(1, min(1000, int(ROUND_S / once)))))
        rates = micro_batch.round_robin([(2, "linear"), (2, "weights_first")], [calls] * (ROUNDS + 1), run,
                                        prune=False)  # (2, form): two warm-up calls each
    return 1 / rates[(2, "linear")], 1 / rates[(2, "weights_first")]


def _key(weight: torch.Tensor, rows: int) -> str:
    from webrl_core.hardware import cpu_summary

    blob = json.dumps([cpu_summary(), torch.get_num_threads(), torch.__version__, str(weight.dtype),
                       list(weight.shape), rows])
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def cache_file():
    return user_cache_dir() / "decode-linear.json"


def measured_rows(max_rows: int) -> list[int]:
    """The row counts measured for a batch of up to ``max_rows``: 1, 2, 4, ... and ``max_rows``."""
    return sorted({1 << k for k in range(max_rows.bit_length()) if 1 << k <= max_rows} | {max_rows})


def fastest_forms(model: torch.nn.Module, max_rows: int) -> dict[tuple[int, int, torch.dtype], frozenset[int]]:
    """For each distinct (out, in, dtype) of the model's ``nn.Linear`` layers: the row counts, of 1..``max_rows``,
    at which the weights-first form runs faster here (measured at ``measured_rows``, or as kept for this box; a
    count goes by the measurement at the next measured count up)."""
    kept = micro_batch.read_kept(cache_file())
    counts = measured_rows(max_rows)
    found: dict[tuple[int, int, torch.dtype], frozenset[int]] = {}
    for mod in model.modules():
        if type(mod) is not torch.nn.Linear:
            continue
        shape = (mod.out_features, mod.in_features, mod.weight.dtype)
        if shape in found:
            continue
        wins = set()
        for rows in counts:
            key = _key(mod.weight, rows)
            if key not in kept:
                lin, wf = _time_forms(mod.weight.detach(), rows)
                kept[key] = {"weights_first": wf < (1 - TIE) * lin, "shape": list(mod.weight.shape),
                             "dtype": str(mod.weight.dtype), "rows": rows,
                             "us": {"linear": round(lin * 1e6, 1), "weights_first": round(wf * 1e6, 1)},
                             "measured": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
                micro_batch.keep(cache_file(), key, kept[key])
            if kept[key]["weights_first"]:
                below = max([c for c in counts if c < rows], default=0)
                wins |= set(range(below + 1, rows + 1))
        found[shape] = frozenset(wins)
    return found


def apply(model: torch.nn.Module, max_rows: int) -> int:
    """Make the model's ``nn.Linear`` layers ``WeightsFirstLinear`` at the row counts (up to ``max_rows``) where
    their shape runs faster weights-first on this CPU. Nothing on another device or with calibration off.
    Returns how many layers changed."""
    param = next(model.parameters(), None)
    if param is None or param.device.type != "cpu" or not micro_batch.enabled() or max_rows < 1:
        return 0
    forms = fastest_forms(model, max_rows)
    changed = 0
    for mod in model.modules():
        rows = forms.get((mod.out_features, mod.in_features, mod.weight.dtype)) if type(mod) is torch.nn.Linear \
            else None
        if rows:
            mod.__class__ = WeightsFirstLinear
            mod.weights_first_rows = rows
            changed += 1
    return changed

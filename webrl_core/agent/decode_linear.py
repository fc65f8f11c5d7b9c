"""A decoding model's linear layers in the matmul form this box runs fastest at the row counts a policy sends.

A decode step multiplies every weight W [out, in] by one row per sequence of the batch, x [rows, in]:
y = x W^T. The same y can be computed three ways, with the same sums (bit for bit in bf16 on the boxes measured,
up to float32 rounding otherwise), at speeds that depend on the box's BLAS:

* ``linear``: ``torch.nn.functional.linear``, ``rows`` as the product's M;
* ``weights_first``: (W x^T)^T, ``out`` as M and ``rows`` as N. On a 2-core AMD EPYC (AVX2, float32, torch 2.13's
  MKL 2024.2) SmolLM2-135M's 49,152 x 576 LM head at 4 rows took 24 ms as ``linear``, 9.3 ms this way
  (docs/benchmarks.md, "Decoding on the AVX2 box");
* ``packed``: oneDNN's inner product on a copy of W reordered once into its blocked layout
  (``torch.ops.mkldnn._reorder_linear_weight`` / ``_linear_pointwise``, the kernels inductor's CPU freezing
  pass uses). On a 2-core AMD EPYC with AVX512-BF16 the model's 210 decoder products at 4 rows took 8.1 ms a step
  against 12 ms as ``linear`` (bf16), and float32 ran 2-4x faster at 4 rows and 2x at 1,200 (docs/benchmarks.md).

So ``fastest_forms`` times every available form on each distinct weight shape of the model, with that shape's own
weight, at 1, 2, 4, ... rows up to the policy's batch size (a rollout of 4 browsers decodes 4 rows however large the
batch may be); a form other than ``linear`` is taken where it is faster by more than ``TIE``. ``apply`` makes those
layers ``DecodeLinear``: the chosen form at the row counts it won (a count goes by the measurement at the next
measured count up), ``F.linear`` at every other (a prefill's hundreds of rows: there the forms measured within the
box's drift of each other in bf16, and a choice made on such a measurement slowed the prefill), the same parameters
and state dict; a layer with a ``packed`` win keeps its packed copy beside the weight (not in the state dict; so
``apply`` is for a model that no longer trains). Each measurement is kept per CPU, threads, torch version, dtype,
shape and rows in ``~/.cache/webrl/decode-linear.json``, so a box measures each once (a few seconds for SmolLM2).
``WEBRL_CALIBRATE=0`` keeps ``F.linear``, as for the micro-batch (learn/micro_batch.py).
"""

from __future__ import annotations

import functools
import hashlib
import json
import time

import torch
import torch.nn.functional as F

from webrl_core.artifacts import user_cache_dir
from webrl_core.learn import box_measurements, micro_batch

FORMS = ("linear", "weights_first", "packed")
TIE = 0.1  # another form must beat linear by more than this share at a row count
ROUNDS = 5  # timed rounds per shape and row count (after a warm-up), all forms in each; the median counts
ROUND_S = 0.01  # each form's calls in a round last about this long


def product(form: str, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
            packed: torch.Tensor | None = None) -> torch.Tensor:
    """y = x W^T (+ bias) for a 2-D ``x`` in ``form`` (module docstring); ``packed``: the weight's packed copy."""
    if form == "packed":
        return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")
    if form == "weights_first":
        y = torch.mm(weight, x.t()).t().contiguous()
        return y if bias is None else y + bias
    return F.linear(x, weight, bias)


def packed_weight(weight: torch.Tensor, rows: int) -> torch.Tensor | None:
    """oneDNN's packed copy of ``weight`` for products of about ``rows`` rows, or None where this torch build or
    CPU has no such kernel for its dtype (the ``packed`` form is then not a candidate)."""
    if weight.device.type != "cpu" or weight.dtype not in (torch.float32, torch.bfloat16) \
            or not torch.backends.mkldnn.is_available():
        return None
    try:
        with torch.no_grad():
            packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), max(1, rows))
            product("packed", weight.new_zeros(1, weight.shape[1]), weight, packed=packed)
        return packed
    except (RuntimeError, NotImplementedError):
        return None


class DecodeLinear(torch.nn.Linear):
    """``nn.Linear`` computing y with the form ``row_forms[rows]`` for inputs whose row count (all leading
    dimensions together) is a key there, with ``F.linear`` for any other. Made by ``apply`` from a loaded
    ``nn.Linear`` (its class is swapped, the parameters stay); ``packed``: the weight's packed copy."""

    row_forms: dict[int, str] = {}
    packed: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // x.shape[-1] if x.dim() >= 2 and x.shape[-1] else 0
        form = self.row_forms.get(rows, "linear")
        if form == "linear":
            return F.linear(x, self.weight, self.bias)
        y = product(form, x.reshape(rows, x.shape[-1]), self.weight, self.bias, self.packed)
        return y.reshape(*x.shape[:-1], self.out_features)


def _time_forms(weight: torch.Tensor, rows: int, packed: torch.Tensor | None) -> dict[str, float]:
    """Seconds per call of each form at ``rows`` rows (``packed`` only with a packed copy): the median of
    ``ROUNDS`` interleaved rounds after a warm-up, as the micro-batch is measured (``micro_batch.round_robin``)."""
    x = torch.randn(rows, weight.shape[1], dtype=weight.dtype, device=weight.device)
    forms = {f: functools.partial(product, f, x, weight, packed=packed)
             for f in FORMS if f != "packed" or packed is not None}

    def run(calls: list, c: tuple[int, str]) -> tuple[float, int]:
        t0 = time.perf_counter()
        for _ in calls:
            forms[c[1]]()
        return max(time.perf_counter() - t0, 1e-9), len(calls)

    with torch.inference_mode():
        once = run([0], (1, "linear"))[0]  # sizes a round: about ROUND_S of the linear form
        calls = list(range(max(1, min(1000, int(ROUND_S / once)))))
        rates = micro_batch.round_robin([(2, f) for f in forms], [calls] * (ROUNDS + 1), run,
                                        prune=False)  # (2, form): two warm-up calls each
    return {f: 1 / rates[(2, f)] for f in forms}


def _key(weight: torch.Tensor, rows: int) -> str:
    from webrl_core.hardware import cpu_summary

    blob = json.dumps([cpu_summary(), torch.get_num_threads(), torch.__version__, str(weight.dtype),
                       list(weight.shape), rows, FORMS])
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def cache_file():
    return user_cache_dir() / "decode-linear.json"


def measured_rows(max_rows: int) -> list[int]:
    """The row counts measured for a batch of up to ``max_rows``: 1, 2, 4, ... and ``max_rows``."""
    return sorted({1 << k for k in range(max_rows.bit_length()) if 1 << k <= max_rows} | {max_rows})


def fastest(seconds: dict[str, float]) -> str:
    """The form to run: the fastest, where it beats ``linear`` by more than ``TIE``; else ``linear``."""
    best = min(seconds, key=seconds.get)
    return best if seconds[best] < (1 - TIE) * seconds["linear"] else "linear"


Shape = tuple[int, int, torch.dtype]  # (out, in, dtype) of a linear layer


def fastest_forms(model: torch.nn.Module, max_rows: int) -> dict[Shape, dict[int, str]]:
    """For each distinct (out, in, dtype) of the model's ``nn.Linear`` layers: the form of each row count of
    1..``max_rows`` where it is not ``linear`` (measured at ``measured_rows``, or as kept for this box; a count
    goes by the measurement at the next measured count up)."""
    kept = box_measurements.read_kept(cache_file())
    counts = measured_rows(max_rows)
    found: dict[Shape, dict[int, str]] = {}
    for mod in model.modules():
        if type(mod) is not torch.nn.Linear:
            continue
        shape = (mod.out_features, mod.in_features, mod.weight.dtype)
        if shape in found:
            continue
        packs: list[torch.Tensor | None] = []  # packed once, when a measurement needs it
        chosen = {}
        for rows in counts:
            key = _key(mod.weight, rows)
            if key not in kept:
                if not packs:
                    packs.append(packed_weight(mod.weight, max_rows))
                seconds = _time_forms(mod.weight.detach(), rows, packs[0])
                kept[key] = {"form": fastest(seconds), "shape": list(mod.weight.shape),
                             "dtype": str(mod.weight.dtype), "rows": rows,
                             "us": {f: round(s * 1e6, 1) for f, s in seconds.items()},
                             "measured": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
                box_measurements.keep(cache_file(), key, kept[key])
            chosen[rows] = kept[key]["form"]
        row_forms = {}
        for rows in counts:
            if chosen[rows] != "linear":
                below = max([c for c in counts if c < rows], default=0)
                row_forms |= dict.fromkeys(range(below + 1, rows + 1), chosen[rows])
        found[shape] = row_forms
    return found


def apply(model: torch.nn.Module, max_rows: int) -> int:
    """Make the model's ``nn.Linear`` layers ``DecodeLinear`` where another form than ``linear`` runs their shape
    faster on this CPU at some row count up to ``max_rows`` (module docstring). Nothing on another device or with
    calibration off. Returns how many layers changed."""
    param = next(model.parameters(), None)
    if param is None or param.device.type != "cpu" or not box_measurements.enabled() or max_rows < 1:
        return 0
    forms = fastest_forms(model, max_rows)
    changed = 0
    for mod in model.modules():
        if type(mod) is not torch.nn.Linear:
            continue
        row_forms = forms[(mod.out_features, mod.in_features, mod.weight.dtype)]
        packed = packed_weight(mod.weight, max_rows) if "packed" in row_forms.values() else None
        if packed is None:  # measured packed (kept), cannot pack now: the other forms' choice stands
            row_forms = {r: f for r, f in row_forms.items() if f != "packed"}
        if not row_forms:
            continue
        mod.__class__ = DecodeLinear
        mod.row_forms, mod.packed = row_forms, packed
        changed += 1
    return changed

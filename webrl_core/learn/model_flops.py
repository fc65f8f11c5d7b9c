"""A pass's model FLOPs, and the share of the box's matmul peak at which a stage ran.

For a decoder of L layers of width d, each layer holding P matmul parameters, over rows of T_i tokens with
S1 = sum_i T_i and S2 = sum_i T_i^2 (Kaplan et al. 2020, "Scaling Laws for Neural Language Models", sec. 2.1, with
the attention term of Chowdhery et al. 2022, PaLM, appendix B; the whole T x T score matrix counted, as the kernels
compute it):

    forward through k layers  = 2 P k S1 + 4 k d S2
    backward                  = 2 P k_g S1 + 2 P_t S1 + 8 k_g d S2

where k_g counts the layers the gradient flows through (from the lowest layer with a trained parameter to the top)
and P_t the trained matmul parameters: training the top 12 of 30 layers whole gives 4 P 12 S1 + 8 12 d S2. The
embedding is a lookup and the LM head is left out: the trainers run it at the action positions only.

A row found in ``frozen_prefix``'s cache runs only the layers above the ``n_frozen`` frozen ones forward, so

    a pass's FLOPs = forward(S1, S2, L) - forward(S1_hit, S2_hit, n_frozen) (+ backward(S1, S2) when it trains)

with S1_hit, S2_hit the cache's counts of the rows that hit (``frozen_prefix.tokens_since``). Against the matmul
peak measured on the same box in the same run (``hardware.matmul_peak_flops``, in the pass's dtype):

    share of peak = FLOPs / (seconds x peak FLOP/s)

100% would be every FLOP of the pass at the rate of one large matmul; the attention's extra work on masked and
padded positions, the elementwise work, the optimizer and Python all lower it.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Iterator

from webrl_core.learn import box_measurements, frozen_prefix


@dataclass(frozen=True)
class DecoderShape:
    """What a decoder's FLOPs depend on (module docstring)."""

    layers: int
    hidden: int
    layer_params: int  # P: the matmul parameters of one decoder layer
    grad_layers: int  # k_g: the layers a backward pass runs through
    trained_params: int  # P_t: the trained matmul parameters in the layers
    n_frozen: int = 0  # the bottom layers a row found in frozen_prefix's cache skips

    @classmethod
    def of(cls, model) -> DecoderShape | None:
        """The shape of ``model``'s decoder (a causal LM, a critic's backbone, either under peft); None where it has
        no decoder layers to count."""
        decoder = frozen_prefix.decoder_of(model)
        if decoder is None or not len(decoder.layers):
            return None
        layers = list(decoder.layers)
        trained = [any(p.requires_grad for p in layer.parameters()) for layer in layers]
        lowest = trained.index(True) if any(trained) else len(layers)
        prefix = decoder.__dict__.get(frozen_prefix.ATTR)
        return cls(layers=len(layers), hidden=decoder.config.hidden_size,
                   layer_params=sum(p.numel() for p in layers[0].parameters() if p.dim() == 2),
                   grad_layers=len(layers) - lowest,
                   trained_params=sum(p.numel() for layer in layers for p in layer.parameters()
                                      if p.requires_grad and p.dim() == 2),
                   n_frozen=prefix.n_frozen if prefix is not None else 0)

    def forward(self, tokens: float, tokens_sq: float, layers: int | None = None) -> float:
        """2 P k S1 + 4 k d S2 for k = ``layers`` (all when None)."""
        k = self.layers if layers is None else layers
        return float(2 * self.layer_params * k * tokens + 4 * k * self.hidden * tokens_sq)

    def backward(self, tokens: float, tokens_sq: float) -> float:
        """2 P k_g S1 + 2 P_t S1 + 8 k_g d S2."""
        return float((2 * self.layer_params * self.grad_layers + 2 * self.trained_params) * tokens
                     + 8 * self.grad_layers * self.hidden * tokens_sq)

    def pass_flops(self, tokens: float, tokens_sq: float, cached: dict | None = None, train: bool = False) -> float:
        """The FLOPs of a pass over rows with S1 = ``tokens`` and S2 = ``tokens_sq``; ``cached``: what the pass
        looked up in frozen_prefix's cache (``tokens_since``), whose hits skip the bottom ``n_frozen`` layers."""
        skipped = 0.0
        if cached and self.n_frozen:
            skipped = self.forward(cached.get("hit_tokens", 0), cached.get("hit_tokens_sq", 0), self.n_frozen)
        return self.forward(tokens, tokens_sq) - skipped + (self.backward(tokens, tokens_sq) if train else 0.0)


def lengths_sums(lengths, times: float = 1.0) -> tuple[float, float]:
    """(S1, S2) of rows of these lengths, passed over ``times`` times (a stage's epochs)."""
    lengths = list(lengths)
    return times * sum(lengths), times * sum(n * n for n in lengths)


def share_of_peak(flops: float | None, seconds: float, peak_flops: float | None) -> float | None:
    """FLOPs / (seconds x peak); None where the peak was not measured or the pass took no time."""
    if not flops or not peak_flops or seconds <= 0:
        return None
    return flops / (seconds * peak_flops)


def flop_stats(prefix: str, flops: float | None, seconds: float, peak_flops: float | None) -> dict:
    """``{prefix}flops`` and ``{prefix}share_of_peak`` of a pass, for a stage's stats (MLflow metrics)."""
    share = share_of_peak(flops, seconds, peak_flops)
    return {f"{prefix}flops": flops, **({f"{prefix}share_of_peak": share} if share is not None else {})}


@dataclass
class BoxRates:
    """The box's rates around a pass (``rates_around``): the better of a measurement just before it and one just
    after (a slow moment in either is not the box's rate); None where nothing was measured. ``measure_s``: the
    seconds the measurements took, which a stage leaves out of its pass's seconds."""

    peak_flops: float | None = None
    copy_bytes_per_s: float | None = None
    measure_s: float = 0.0


def box_rates(compute_dtype: str | None, device: str = "cpu") -> tuple[float, float]:
    """The box's matmul peak (FLOP/s) in ``compute_dtype`` (``models.dtype``) and its copy bandwidth (bytes/s) in
    that dtype now, where the box's measurements are on; (0.0, 0.0) otherwise. A second or two, which the test suite
    (``WEBRL_CALIBRATE=0``) does not spend."""
    if not compute_dtype or not box_measurements.enabled():
        return 0.0, 0.0
    from webrl_core.hardware import copy_bandwidth, matmul_peak_flops
    from webrl_core.learn.models import torch_dtype

    dtype = torch_dtype(compute_dtype)
    return matmul_peak_flops(dtype, device), copy_bandwidth(dtype=dtype, device=device)


@contextlib.contextmanager
def rates_around(compute_dtype: str | None, device: str = "cpu", measure: bool = True) -> Iterator[BoxRates]:
    """``box_rates`` just before and just after the block (``measure`` False: neither); the ``BoxRates`` it yields
    is filled when the block ends."""
    rates = BoxRates()
    t0 = time.perf_counter()
    before = box_rates(compute_dtype, device) if measure else (0.0, 0.0)
    rates.measure_s += time.perf_counter() - t0
    yield rates
    t0 = time.perf_counter()
    after = box_rates(compute_dtype, device) if measure else (0.0, 0.0)
    rates.measure_s += time.perf_counter() - t0
    rates.peak_flops = max(before[0], after[0]) or None
    rates.copy_bytes_per_s = max(before[1], after[1]) or None

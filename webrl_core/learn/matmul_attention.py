"""Causal attention as two batched matmuls in the compute dtype, for the short sequences a CPU runs best that way.

For each query head ``h`` of a grouped-query layer (``G = H / H_kv`` query heads share key/value head ``h // G``),

    A_h = softmax(Q_h K_{h//G}^T * s + M) V_{h//G},     M_ij = 0 where query i may see key j, else the dtype's min,

the same function as transformers' ``sdpa`` and ``eager`` kernels (Vaswani et al. 2017, eq. 1; ``s`` the layer's
scaling, 1/sqrt(d) for Llama). It is computed with the G query heads of a key/value head stacked as rows of one
matrix (no copy of K and V per query head), the scores and the softmax in the input's dtype (PyTorch's CPU softmax
accumulates a bfloat16 input in float32) and the mask added in place.

Why: PyTorch's fused CPU kernel (``sdpa``'s flash attention for CPU) ran at about 60 GFLOP/s for SmolLM2's heads
(d = 64) in bfloat16 and in float32 alike, while a bfloat16 batched matmul of the same sizes ran near the box's
matrix peak (2-core AMD EPYC with AVX512-BF16: 700-860 GFLOP/s). At the demo's lengths (about 300 tokens) the fused
kernel took 38% of a forward pass that is 10% attention by FLOPs; this kernel took 1.6-1.8x less time forward and
backward there. Its score matrix grows with T^2 in memory and the fused kernel skips the masked half, so for long
sequences the fused kernel wins (T = 1,000: even forward and backward, 1.5x slower forward). The kernel therefore
hands a call whose score matrix ``T_q x T_k`` is larger than a crossover to transformers' ``sdpa`` unchanged, and the
crossover is measured on the box (``crossover``: both kernels timed at a ladder of lengths, forward without and
with backward, kept per CPU in ``~/.cache/webrl/attention.json``), so "matmul" is never slower than ``sdpa`` by
that measurement. A decode step (one query) on keys and values viewed in a KV cache's reservation goes to sdpa too:
the batched matmul would copy the cache on every token.

In bfloat16 its scores are rounded to bfloat16 before the softmax, as transformers' ``eager`` kernel rounds them
(the fused kernel keeps them in float32): on 6 of the demo's replay items the token log-probs of both matched
eager's, 0.039 nats from a float32 pass on average against sdpa's 0.037, with the largest gaps on a sequence's
first tokens; the replay's 1/PPL of 48 items moved by 0.0016 on average (at most 0.011).

Registered with transformers as ``attn_implementation="matmul"`` (``models.attn_implementation``), with sdpa's mask
(a boolean mask, or none where the causal pattern alone applies). With calibration off (``WEBRL_CALIBRATE=0``) the
crossover is ``DEFAULT_CROSSOVER``.
"""

from __future__ import annotations

import statistics
import threading
import time

import torch

from webrl_core.learn import box_measurements

NAME = "matmul"
LADDER = (128, 256, 512, 1024, 2048)  # square causal calls timed to find the crossover
REPS = 3
DEFAULT_CROSSOVER = 512 * 512  # without a measurement: the score-matrix size up to which this kernel runs
_KNOWN: dict[tuple, int] = {}
_LOCK = threading.Lock()
_CAUSAL: dict[tuple[int, int, str], torch.Tensor] = {}


def register() -> str:
    """Make ``attn_implementation="matmul"`` known to transformers (idempotent); returns the name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(NAME, attention)
    AttentionMaskInterface.register(NAME, sdpa_mask)
    return NAME


def _causal(tq: int, tk: int, device) -> torch.Tensor:
    """[tq, tk] boolean: query i (the last tq of tk positions) sees keys 0..tk-tq+i (kept per shape, except in a
    compiled graph, which builds it in place)."""
    if torch.compiler.is_compiling():
        return torch.ones(tq, tk, dtype=torch.bool, device=device).tril(tk - tq)
    key = (tq, tk, str(device))
    mask = _CAUSAL.get(key)
    if mask is None:
        mask = torch.ones(tq, tk, dtype=torch.bool, device=device).tril(tk - tq)
        if len(_CAUSAL) > 64:
            _CAUSAL.clear()
        _CAUSAL[key] = mask
    return mask


def matmul_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None,
                     scaling: float, dropout: float = 0.0, causal: bool = True) -> torch.Tensor:
    """A [B, T_q, H, D] (the layout transformers' kernels return) from Q [B, H, T_q, D], K and V [B, H_kv, T_k, D]
    and a boolean ``mask`` [B or 1, 1, T_q, T_k] (True: may attend) or None (the causal pattern, when ``causal``)."""
    b, h, tq, d = query.shape
    h_kv, tk = key.shape[1], key.shape[2]
    g = h // h_kv
    scores = torch.matmul((query * scaling).reshape(b, h_kv, g * tq, d), key.transpose(-1, -2))
    if mask is None and causal and tq > 1:
        mask = _causal(tq, tk, query.device)[None, None]
    if mask is not None:
        if mask.dtype != torch.bool:  # an additive mask: masked positions hold a large negative value
            mask = mask >= 0
        grouped = scores.view(b, h_kv, g, tq, tk)
        grouped.masked_fill_(~mask[:, :, None, :, -tk:], torch.finfo(scores.dtype).min)
    probs = torch.softmax(scores, dim=-1)
    if dropout:
        probs = torch.nn.functional.dropout(probs, dropout)
    return torch.matmul(probs, value).view(b, h, tq, d).transpose(1, 2).contiguous()


def attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling: float | None = None,
              is_causal: bool | None = None, **kwargs):
    """transformers' attention-function interface (``AttentionInterface``): this kernel up to the crossover, sdpa
    above it."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    grad = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
    tq, tk = query.shape[2], key.shape[2]
    if (kwargs.get("softcap") is not None or kwargs.get("cache") is not None or query.device.type != "cpu"
            # a decode step on views into a KV cache's reservation: its matmuls would copy the whole cache per
            # token (the policy's decoding ran 1.4x slower, docs/benchmarks.md); a prefill copies it once
            or (tq == 1 and not (key.is_contiguous() and value.is_contiguous()))
            or tq * tk > crossover(query, key, grad)):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    out = matmul_attention(query, key, value, attention_mask, scale, dropout if module.training else 0.0, causal)
    return out, None


def crossover(query: torch.Tensor, key: torch.Tensor, grad: bool) -> int:
    """The largest score matrix (T_q * T_k) this kernel computes for heads shaped like ``query`` / ``key`` in their
    dtype, forward only or with ``grad``; measured once per CPU (module docstring)."""
    shape = (str(query.dtype), query.shape[1], key.shape[1], query.shape[3], grad)
    known = _KNOWN.get(shape)
    if known is not None:
        return known
    if not box_measurements.enabled() or torch.compiler.is_compiling():
        return DEFAULT_CROSSOVER
    return _known(shape)


def _known(shape: tuple) -> int:
    """``shape``'s crossover, from the kept file or measured, filled into ``_KNOWN`` once per process."""
    with _LOCK:
        if shape not in _KNOWN:
            _KNOWN[shape] = _kept_or_measured(shape)
        return _KNOWN[shape]


def crossovers_before_compiling(model) -> None:
    """Look up (or measure) ``model``'s crossovers, forward only and with backward, in each floating dtype of its
    weights, before its layers are compiled. A compiled graph cannot read the kept file, so there ``crossover``
    falls back to ``DEFAULT_CROSSOVER``, and the demo's SFT, whose calibration was kept from an earlier run (no eager
    pass filled the lookup first), then compiled another graph for every sequence above 512 tokens: with the
    layers' other variants that passed dynamo's recompile limit (8), and later variants ran eager."""
    if not box_measurements.enabled():
        return
    cfg = model.config
    heads = cfg.num_attention_heads
    kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    dtypes = sorted({str(p.dtype) for p in model.parameters() if p.is_floating_point()})
    for dtype in dtypes:
        for grad in (False, True):
            _known((dtype, heads, kv_heads, head_dim, grad))


def _cache_key(shape: tuple) -> str:
    from webrl_core.hardware import cpu_summary

    return repr((cpu_summary(), torch.get_num_threads(), *shape))


def _kept_or_measured(shape: tuple) -> int:
    from webrl_core.artifacts import user_cache_dir

    path = user_cache_dir() / "attention.json"
    key = _cache_key(shape)
    entry = box_measurements.read_kept(path).get(key)
    if entry is None:
        entry = measure(*shape)
        box_measurements.keep(path, key, entry)
        print(f"attention: the {NAME} kernel up to {entry['crossover_t']} tokens, sdpa beyond ({shape[0]}, "
              f"{'forward and backward' if shape[4] else 'forward'}; timed here, kept in {path})", flush=True)
    return int(entry["crossover"])


def measure(dtype: str, heads: int, kv_heads: int, head_dim: int, grad: bool) -> dict:
    """Time both kernels on square causal calls of ``LADDER`` lengths (one sequence, interleaved, median of
    ``REPS``); the crossover lies between the longest length up to which this kernel is faster and the next."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    class _Layer(torch.nn.Module):
        is_causal = True
        num_key_value_groups = heads // kv_heads

    layer = _Layer()
    dt = getattr(torch, dtype.removeprefix("torch."))
    best = 0  # the longest length up to which this kernel won
    times: dict[str, list[float]] = {}  # length: [this kernel's ms, sdpa's ms]
    for t in LADDER:
        q = torch.randn(1, heads, t, head_dim, dtype=dt, requires_grad=grad)
        k = torch.randn(1, kv_heads, t, head_dim, dtype=dt, requires_grad=grad)
        v = torch.randn(1, kv_heads, t, head_dim, dtype=dt, requires_grad=grad)
        go = torch.randn(1, t, heads, head_dim, dtype=dt)

        def run(kernel):
            with torch.set_grad_enabled(grad):
                if kernel == NAME:
                    out = matmul_attention(q, k, v, None, head_dim ** -0.5)
                else:
                    out = sdpa_attention_forward(layer, q, k, v, None, scaling=head_dim ** -0.5)[0]
                if grad:
                    out.backward(go)

        seconds: dict[str, list[float]] = {NAME: [], "sdpa": []}
        for rep in range(REPS + 1):
            for kernel in seconds:
                t0 = time.perf_counter()
                run(kernel)
                if rep:
                    seconds[kernel].append(time.perf_counter() - t0)
        mm, sd = statistics.median(seconds[NAME]), statistics.median(seconds["sdpa"])
        times[str(t)] = [round(mm * 1e3, 3), round(sd * 1e3, 3)]
        if mm >= sd:  # the ladder stops at the first length where sdpa is as fast
            break
        best = t
    nxt = next((t for t in LADDER if t > best), None)
    cross = 0 if best == 0 else (best * nxt if nxt else best * best * 4)
    return {"crossover": cross, "crossover_t": best, "ms_matmul_sdpa": times,
            "measured": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}

"""The frozen bottom layers' hidden states, computed once per token sequence and reused by every later pass.

With ``models.train_layers = n`` every model a run trains from one checkpoint -- each phase's actor and its
reference, the critic's backbone, the ORM -- keeps that checkpoint's embedding and its bottom ``L - n`` decoder
layers frozen (``models.train_top_layers``). The hidden state after layer ``m = L - n``,

    h_m(x_1..x_T) = f_m o ... o f_1 (E x)  at positions 1..T,

is then a function of the tokens alone: the same in every such model and every pass (causal attention over the
sequence's own tokens; left padding is masked and positions count from the first real token). A decoder with a
:class:`FrozenPrefix` attached keeps ``h_m`` of each sequence it meets (keyed by a fingerprint of the frozen
weights, the compute dtype and autocast, and the token ids) and, for rows met before, runs only the top ``n``
layers from it. A phase passes over the same sequences several times (the critic's epoch, then its values of the
same prompts for the actor; the reference log-probs, then the actor's epoch over the same prompt + action), so the
later passes cost, per token, ``2 N_top`` FLOPs instead of ``2 N`` forward, ``6 N_top`` instead of ``2 N + 4 N_top``
with a backward (N the decoder's parameters, N_top the top n layers').

A pass over prompt + action rows that knows where each prompt ends (``prompt_lengths``: the replay's 1/PPL) also
keeps each prompt's own key, pointing at the first rows of the same states (causal attention: the prompt's
positions do not see the action), so a later pass over the prompt alone -- the critic's values of the replayed
steps' observations -- finds it.

Every pass that shares states runs in the training forward's autocast (``models.autocast_context``): the
epochs and the reference log-probs do, and so do the replay's 1/PPL and the critic's values, whose rows would
otherwise be kept under another key and never met (in bfloat16 every such lookup missed before; the 1/PPL took the
same time and gave the same scores with and without autocast, measured on the demo's replay items).

The results equal the uncached pass up to floating-point rounding (a row's bottom layers ran in another batch, with
other padding). Kept per process in memory, least recently used first out, up to ``WEBRL_FROZEN_CACHE_MB``
(default 2048; 0 turns it off). Only decoders whose forward takes ``inputs_embeds`` as the first layer's input
unchanged (``SUPPORTED``) are attached, and only single-process passes use it (a sharded model runs through its
root forward).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import threading
from collections import OrderedDict
from dataclasses import dataclass

import torch

ENV = "WEBRL_FROZEN_CACHE_MB"
DEFAULT_MB = 2048
SUPPORTED = ("llama",)  # their forward feeds inputs_embeds to layer 1 as given (Gemma, say, scales it first)
ATTR = "_webrl_frozen_prefix"


def budget_bytes() -> int:
    raw = os.environ.get(ENV, str(DEFAULT_MB))
    try:
        mb = float(raw)
    except ValueError:
        raise ValueError(f"{ENV}={raw!r}: a number of MB (0 turns the cache off)") from None
    return max(0, int(mb * 2 ** 20))


class _Store:
    """Hidden states by key, least recently used first out past the budget."""

    def __init__(self) -> None:
        self.rows: OrderedDict[bytes, torch.Tensor] = OrderedDict()
        self.bytes = self.hits = self.misses = 0
        # real tokens of the rows looked up, and the sum of their squares (a pass's FLOPs: model_flops.py)
        self.tokens = {"hit_tokens": 0, "hit_tokens_sq": 0, "miss_tokens": 0, "miss_tokens_sq": 0}
        self.read_only = 0  # > 0 inside ``no_new_rows``
        self.lock = threading.Lock()

    def get(self, key: bytes) -> torch.Tensor | None:
        with self.lock:
            t = self.rows.get(key)
            if t is None:
                self.misses += 1
                return None
            self.rows.move_to_end(key)
            self.hits += 1
            return t

    def put(self, key: bytes, t: torch.Tensor, budget: int) -> None:
        size = t.numel() * t.element_size()
        if size > budget or self.read_only:
            return
        with self.lock:
            old = self.rows.pop(key, None)
            if old is not None:
                self.bytes -= old.numel() * old.element_size()
            self.rows[key] = t
            self.bytes += size
            while self.bytes > budget:
                _, dropped = self.rows.popitem(last=False)
                self.bytes -= dropped.numel() * dropped.element_size()

    def count(self, hit: bool, n_tokens: int) -> None:
        side = "hit" if hit else "miss"
        with self.lock:
            self.tokens[f"{side}_tokens"] += n_tokens
            self.tokens[f"{side}_tokens_sq"] += n_tokens * n_tokens

    def clear(self) -> None:
        with self.lock:
            self.rows.clear()
            self.bytes = self.hits = self.misses = 0
            self.tokens = dict.fromkeys(self.tokens, 0)


STORE = _Store()


def stats() -> dict[str, int]:
    """Rows kept, their bytes, and the lookups that hit and missed since the process started (or ``clear``), with
    the real tokens of the rows that hit and missed and the sums of their squares (``hit_tokens``,
    ``hit_tokens_sq``, ``miss_tokens``, ``miss_tokens_sq``)."""
    return {"rows": len(STORE.rows), "bytes": STORE.bytes, "hits": STORE.hits, "misses": STORE.misses,
            **STORE.tokens}


def tokens_since(before: dict[str, int]) -> dict[str, int]:
    """The token counts of ``stats()`` gained since ``before`` (an earlier ``stats()``): what a pass looked up."""
    now = stats()
    return {k: now[k] - before.get(k, 0) for k in STORE.tokens}


def clear() -> None:
    STORE.clear()


@contextlib.contextmanager
def no_new_rows():
    """Look rows up but keep none: a calibration's candidates (``micro_batch.round_robin``) pass over the same items
    in turn, and without this the first would keep them and every later one would run the top layers only, so the
    measurement would compare a whole pass with a cached one (the demo's replay measured batch 1 at 5.3k and batch 4
    at 12.7k length units/s that way; measured whole, batches 1-8 are within 15% of each other)."""
    with STORE.lock:
        STORE.read_only += 1
    try:
        yield
    finally:
        with STORE.lock:
            STORE.read_only -= 1


@dataclass(frozen=True)
class FrozenPrefix:
    """The bottom ``n_frozen`` layers of a decoder and the fingerprint of everything they compute with."""

    n_frozen: int
    fingerprint: bytes


def decoder_of(model) -> torch.nn.Module | None:
    """The decoder (embedding + layers + final norm) of a causal LM, a bare decoder, or either under peft."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if hasattr(base, "layers") and hasattr(base, "embed_tokens"):
        return base
    decoder = base.get_decoder() if hasattr(base, "get_decoder") else None
    return decoder if decoder is not None and hasattr(decoder, "layers") else None


def _frozen_tensors(decoder, n_frozen: int) -> list[torch.Tensor]:
    out = [decoder.embed_tokens.weight]
    for layer in decoder.layers[:n_frozen]:
        out += list(layer.parameters()) + list(layer.buffers())
    return out + list(decoder.rotary_emb.buffers())


def attach(model, models_cfg) -> FrozenPrefix | None:
    """Attach the cache to ``model``'s decoder when ``models_cfg`` trains only its top layers (``train_layers``,
    no LoRA), the cache is on, the architecture is ``SUPPORTED`` and the bottom layers are frozen; returns what was
    attached, or None. Attach after loading and freezing: the fingerprint is of the weights as they are then."""
    n_top = getattr(models_cfg, "train_layers", None)
    if budget_bytes() <= 0 or not n_top or models_cfg.lora.enabled:
        return None
    decoder = decoder_of(model)
    cfg = getattr(decoder, "config", None)
    if decoder is None or getattr(cfg, "model_type", None) not in SUPPORTED or not hasattr(decoder, "rotary_emb"):
        return None
    if getattr(cfg, "attention_dropout", 0.0):  # a training pass would draw its own dropout in the bottom layers
        return None
    n_frozen = len(decoder.layers) - n_top
    tensors = _frozen_tensors(decoder, n_frozen) if n_frozen >= 1 else []
    if not tensors or any(t.requires_grad for t in tensors):
        return None
    h = hashlib.blake2b(digest_size=16)
    h.update(repr((cfg.model_type, n_frozen, cfg.hidden_size, cfg.num_attention_heads,
                   getattr(cfg, "num_key_value_heads", None), getattr(cfg, "head_dim", None), cfg.hidden_act,
                   cfg.rms_norm_eps)).encode())
    for t in tensors:
        h.update(f"{t.dtype}{tuple(t.shape)}".encode())
        h.update(t.detach().contiguous().cpu().view(torch.uint8).numpy())  # its buffer, no bytes copy
    prefix = FrozenPrefix(n_frozen, h.digest())
    decoder.__dict__[ATTR] = prefix  # a plain attribute: not a module, not in the state dict
    return prefix


def attached(decoder) -> FrozenPrefix | None:
    """The decoder's prefix when a pass may use it now (still frozen, one process, not turned off)."""
    prefix = decoder.__dict__.get(ATTR)
    if prefix is None or budget_bytes() <= 0:
        return None
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return None
    if any(t.requires_grad for t in _frozen_tensors(decoder, prefix.n_frozen)):
        return None
    return prefix


_SWAP = threading.Lock()


def hidden_states(decoder, prefix: FrozenPrefix, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                  position_ids: torch.Tensor, prompt_lengths: list[int] | None = None) -> torch.Tensor:
    """The decoder's final hidden states [B, T, H] (after its norm), the bottom layers' from the cache where a row
    is kept: rows met before run the top layers only; the others run whole and are kept. ``prompt_lengths``: the
    real tokens of each row's prompt, whose states are then kept under the prompt's own key too (a view of the
    row's: its bytes count against the budget, its memory is the row's)."""
    device_type = input_ids.device.type
    tag = repr((prefix.fingerprint, str(decoder.embed_tokens.weight.dtype), torch.is_autocast_enabled(device_type),
                str(torch.get_autocast_dtype(device_type)))).encode()
    real = attention_mask.bool()
    ids_cpu, real_cpu = input_ids.cpu(), real.cpu()
    def key(ids) -> bytes:
        return hashlib.blake2b(tag + ids.numpy().tobytes(), digest_size=20).digest()

    keys = [key(ids_cpu[b][real_cpu[b]]) for b in range(input_ids.shape[0])]
    budget = budget_bytes()
    kept = [STORE.get(k) for k in keys]
    for b, t in enumerate(kept):
        STORE.count(t is not None, int(real_cpu[b].sum()))
    miss = [b for b, t in enumerate(kept) if t is None]
    hit = [b for b, t in enumerate(kept) if t is not None]
    parts, order = [], []
    if miss:
        rows = torch.tensor(miss, device=input_ids.device)
        out = decoder(input_ids=input_ids[rows], attention_mask=attention_mask[rows], position_ids=position_ids[rows],
                      use_cache=False, output_hidden_states=True)
        middle = out.hidden_states[prefix.n_frozen]  # [0] is the embedding, [i] layer i's output
        for j, b in enumerate(miss):
            kept[b] = middle[j][real[b]].detach().clone()
            STORE.put(keys[b], kept[b], budget)
        parts.append(out.last_hidden_state)
        order += miss
    if hit:
        rows = torch.tensor(hit, device=input_ids.device)
        embeds = decoder.embed_tokens(input_ids[rows]).detach()  # pad positions: any finite value, they are masked
        start = torch.zeros_like(embeds, dtype=kept[hit[0]].dtype)
        start[~real[rows]] = embeds[~real[rows]].to(start.dtype)
        start[real[rows]] = torch.cat([kept[b] for b in hit]).to(start.device)
        with _SWAP:  # the top layers alone, through the decoder's own forward (its mask and rotary positions)
            layers = decoder.layers
            decoder.layers = torch.nn.ModuleList(list(layers)[prefix.n_frozen:])
            try:
                out = decoder(inputs_embeds=start, attention_mask=attention_mask[rows],
                              position_ids=position_ids[rows], use_cache=False)
            finally:
                decoder.layers = layers
        parts.append(out.last_hidden_state)
        order += hit
    for b, n in enumerate(prompt_lengths or []):
        if 0 < n < len(kept[b]):
            STORE.put(key(ids_cpu[b][real_cpu[b]][:n]), kept[b][:n], budget)
    result = torch.cat(parts) if len(parts) > 1 else parts[0]
    if order != sorted(order):
        result = result[torch.argsort(torch.tensor(order, device=result.device))]
    return result

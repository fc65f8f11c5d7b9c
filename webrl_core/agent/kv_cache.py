"""The decoder's key/value cache, written in place: ``generate`` with a cache whose layers reserve room.

Each decoded token appends one position to every layer's keys and values. transformers' ``DynamicLayer`` does it
with ``torch.cat``, which copies the whole cache: for a layer with KV heads h_kv, head size d, batch B and cached
length L, one token moves

    bytes per token = 2 (K, V) x n_layers x B x h_kv x L x d x bytes per element

so the decode's copying grows with the prompt, while the matmuls' bytes (the weights) do not. For SmolLM2-135M
(30 layers, 3 KV heads of 64) at B = 4 and L = 900 in float32 that is 166 MB a token, as many bytes as a third
of the weights. ``ReservedLayer`` allocates [B, h_kv, L + reserve, d] once, writes each new position into it, and
hands attention a view of the filled length: the same keys and values, no copy. Greedy outputs are unchanged
(the attention reads the same numbers; tests/agent/test_kv_cache.py).

A layer whose view was replaced from outside (``crop``, ``batch_select_indices``, beam reordering) is copied into
a fresh reservation on its next update, so those paths keep working, only without the saving.

``prefilled_cache`` is the prefill without padding. A left-padded batch of prompts with T_1..T_B tokens costs, in
its prefill, ``2 n B T_max`` FLOPs in the layers' matmuls and ``B T_max^2`` in attention, where the rows alone cost
``2 n sum_i T_i`` and ``sum_i T_i^2``: the rollouts' prompts of 134-535 tokens, 8 to a call, were 40% padding in a
call's matmuls and 2.4x in its attention. So each row's prompt but its last token runs alone (one sequence, no
mask) into a cache of its own, and the rows' keys and values are laid into one reserved cache, right-aligned as the
left-padded batch holds them (a padded position holds zeros: the attention mask hides it). ``generate`` then finds
``T_max - 1`` positions cached and runs the last column, which every row has, then decodes. The positions agree:
``generate`` numbers a left-padded row's tokens from 0 at its first real token, as the row's own pass did.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import DynamicCache, DynamicLayer


class ReservedLayer(DynamicLayer):
    """A ``DynamicLayer`` whose keys and values are views into a buffer with ``reserve`` free positions: an
    update writes into the buffer, and only an update past its end (or after the view was replaced) copies."""

    def __init__(self, reserve: int = 64):
        super().__init__()
        if reserve < 1:
            raise ValueError(f"ReservedLayer: reserve={reserve}; it must be >= 1")
        self.reserve = int(reserve)
        self._k_buf: torch.Tensor | None = None
        self._v_buf: torch.Tensor | None = None

    def _views_buffer(self) -> bool:
        return (self._k_buf is not None and self.keys.numel() > 0
                and self.keys.data_ptr() == self._k_buf.data_ptr() and self.keys.shape[:2] == self._k_buf.shape[:2]
                and self.values.data_ptr() == self._v_buf.data_ptr())

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
               ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        filled = self.keys.shape[-2] if self.keys.numel() else 0
        need = filled + key_states.shape[-2]
        if not self._views_buffer() or self._k_buf.shape[-2] < need:
            # a new reservation: the filled part moves once, then decoding writes in place
            shape = list(key_states.shape)
            shape[-2] = need + self.reserve
            k_buf = key_states.new_empty(shape)
            v_buf = value_states.new_empty(shape[:-1] + [value_states.shape[-1]])
            if filled:
                k_buf[..., :filled, :] = self.keys
                v_buf[..., :filled, :] = self.values
            self._k_buf, self._v_buf = k_buf, v_buf
        self._k_buf[..., filled:need, :] = key_states
        self._v_buf[..., filled:need, :] = value_states
        self.keys = self._k_buf[..., :need, :]
        self.values = self._v_buf[..., :need, :]
        return self.keys, self.values

    def reset(self) -> None:
        self._k_buf = self._v_buf = None
        super().reset()


def reserved_cache(model, reserve: int) -> DynamicCache:
    """A ``DynamicCache`` for ``model`` whose full-attention layers are ``ReservedLayer``s with room for
    ``reserve`` positions past the prompt (give ``max_new_tokens``). Sliding-window and other special layers, which
    keep a bounded cache of their own, are left as transformers builds them."""
    cache = DynamicCache(config=model.config)
    if not cache.layers:  # no layer list from the config: replicate on demand
        cache.layer_class_to_replicate = lambda: ReservedLayer(reserve)
        return cache
    cache.layers = [ReservedLayer(reserve) if type(layer) is DynamicLayer else layer for layer in cache.layers]
    return cache


@torch.no_grad()
def prefilled_cache(model, rows: list[list[int]], reserve: int) -> DynamicCache | None:
    """A reserved cache (``reserve`` free positions) holding every row's keys and values but for its last token, each
    row run alone and the rows laid out as the left-padded batch of ``rows`` holds them (module docstring); give it to
    ``generate`` with that batch. None where the model's cache has layers other than plain full-attention ones
    (a sliding window keeps its own bounded cache): prefill the padded batch there."""
    cache = reserved_cache(model, reserve + 1)
    if not cache.layers or any(type(layer) is not ReservedLayer for layer in cache.layers):
        return None
    width = max(len(r) for r in rows) - 1
    device = next(model.parameters()).device
    per_row = []
    for r in rows:
        own = DynamicCache(config=model.config)
        if len(r) > 1:
            model(input_ids=torch.tensor([r[:-1]], device=device), past_key_values=own, use_cache=True,
                  logits_to_keep=1)
        per_row.append(own)
    first = next((c for c in per_row if c.get_seq_length() > 0), None)
    if first is None:  # every prompt is one token: nothing to cache
        return cache
    for i, layer in enumerate(cache.layers):
        k0, v0 = first.layers[i].keys, first.layers[i].values
        keys = k0.new_zeros((len(rows), k0.shape[1], width, k0.shape[3]))
        values = v0.new_zeros((len(rows), v0.shape[1], width, v0.shape[3]))
        for b, own in enumerate(per_row):
            n = own.get_seq_length()
            if n:
                keys[b, :, width - n:] = own.layers[i].keys[0]
                values[b, :, width - n:] = own.layers[i].values[0]
        layer.update(keys, values)
    return cache

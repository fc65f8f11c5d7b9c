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

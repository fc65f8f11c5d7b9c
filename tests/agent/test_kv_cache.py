"""The KV cache written in place (webrl_core/agent/kv_cache.py)."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM
from transformers.cache_utils import DynamicLayer

from webrl_core.agent import kv_cache
from webrl_core.agent.kv_cache import ReservedLayer, reserved_cache
from webrl_core.config import EmbeddedModelConfig
from webrl_core.learn.models import left_pad
from webrl_core.learn.embedded_model import build_embedded_model, train_embedded_tokenizer
from webrl_core.prompts import build_prompt


def test_a_reserved_layer_holds_what_concatenation_holds_and_copies_only_past_its_room():
    torch.manual_seed(0)
    plain, reserved = DynamicLayer(), ReservedLayer(reserve=3)
    steps = [torch.randn(2, 3, n, 4) for n in (5, 1, 1, 1, 1, 2, 1)]
    buffers = []
    for k in steps:
        want = plain.update(k, -k)
        got = reserved.update(k, -k)
        for w, g in zip(want, got):
            torch.testing.assert_close(g, w, rtol=0, atol=0)
        assert reserved.get_seq_length() == plain.get_seq_length()
        buffers.append(reserved._k_buf.data_ptr())
    # 5 positions + room for 3: the next three tokens land in place; the 9th position needs a new reservation
    assert buffers[0] == buffers[1] == buffers[2] == buffers[3]
    assert buffers[4] != buffers[3] and buffers[4] == buffers[5]
    with pytest.raises(ValueError, match="reserve=0"):
        ReservedLayer(reserve=0)


def test_a_view_replaced_from_outside_is_copied_not_written_over():
    torch.manual_seed(1)
    plain, reserved = DynamicLayer(), ReservedLayer(reserve=8)
    for layer in (plain, reserved):
        layer.update(torch.ones(3, 1, 4, 2), torch.ones(3, 1, 4, 2))
        layer.batch_select_indices(torch.tensor([0, 2]))  # a beam / finished-row reorder
        layer.crop(-1)
    k = torch.randn(2, 1, 1, 2)
    want, got = plain.update(k, k), reserved.update(k, k)
    torch.testing.assert_close(got[0], want[0], rtol=0, atol=0)
    assert got[0].shape == (2, 1, 4, 2)


def test_reserved_cache_swaps_only_plain_layers(tmp_path):
    model = _tiny_model(tmp_path)
    cache = reserved_cache(model, 12)
    assert len(cache.layers) == model.config.num_hidden_layers
    assert all(type(layer) is ReservedLayer and layer.reserve == 12 for layer in cache.layers)


def test_generate_writes_the_same_tokens_with_the_reserved_cache(tmp_path, monkeypatch):
    """Greedy decoding of a left-padded batch: the reserved cache changes no token."""
    model = _tiny_model(tmp_path)
    tok_ids = [[5 + (i * j) % 300 for j in range(n)] for i, n in enumerate((9, 23, 40))]
    x, mask = left_pad(tok_ids, 0)
    kw = dict(input_ids=x, attention_mask=mask, do_sample=False, max_new_tokens=20, min_new_tokens=20,
              pad_token_id=0)
    want = model.generate(**kw)
    updates = []
    real = ReservedLayer.update
    monkeypatch.setattr(ReservedLayer, "update", lambda self, *a, **k: updates.append(1) or real(self, *a, **k))
    got = model.generate(**kw, past_key_values=reserved_cache(model, 20))
    assert torch.equal(got, want)
    assert len(updates) == 20 * model.config.num_hidden_layers  # the reserved layers did the caching
    # a reservation too small for the run still decodes the same (it grows once)
    assert torch.equal(model.generate(**kw, past_key_values=reserved_cache(model, 4)), want)


def test_the_policy_decodes_through_a_reserved_cache(tmp_path, monkeypatch):
    from webrl_core.agent.policy import HFPolicy
    from webrl_core.config import ModelsConfig, PolicyConfig

    _tiny_model(tmp_path)
    made = []
    real = kv_cache.reserved_cache
    monkeypatch.setattr("webrl_core.agent.policy.reserved_cache",
                        lambda model, reserve: made.append(reserve) or real(model, reserve))
    pol = HFPolicy(tmp_path / "model", PolicyConfig(max_new_tokens=7, batch_size=2, decode_matmul="linear",
                                                    prefill="padded"),
                   ModelsConfig(max_length=256), temperature=0)
    prompts = [build_prompt(f"Open item {i}", [], f'<a id="3">item {i}</a>' * (1 + 3 * i)) for i in range(3)]
    assert len(pol.generate(prompts)) == 3
    assert made == [7, 7]  # one cache per micro-batch, room for the new tokens


def test_a_cache_prefilled_row_by_row_decodes_what_the_padded_batch_decodes(tmp_path):
    """Each row's prompt but its last token run alone and laid out left-padded: the same scores at every step as
    the padded batch's own prefill (float32, up to rounding), and the same tokens."""
    model = _tiny_model(tmp_path)
    rows = [[5 + (i * j) % 300 for j in range(n)] for i, n in enumerate((9, 1, 40, 23))]  # one a single token
    x, mask = left_pad(rows, 0)
    kw = dict(input_ids=x, attention_mask=mask, do_sample=False, max_new_tokens=12, min_new_tokens=12,
              pad_token_id=0, output_scores=True, return_dict_in_generate=True)
    want = model.generate(**kw, past_key_values=reserved_cache(model, 12))
    cache = kv_cache.prefilled_cache(model, rows, 12)
    assert cache.get_seq_length() == 39  # the longest prompt but its last token
    layer = cache.layers[0]
    assert torch.count_nonzero(layer.keys[0, :, :31]) == 0 and torch.count_nonzero(layer.keys[0, :, 31:]) > 0
    assert torch.count_nonzero(layer.keys[1]) == 0  # the one-token prompt: nothing cached before its last token
    got = model.generate(**kw, past_key_values=cache)
    assert torch.equal(got.sequences, want.sequences)
    for g, w in zip(got.scores, want.scores):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)


def test_the_policy_prefills_row_by_row_on_a_cpu_and_writes_the_same_actions(tmp_path, monkeypatch):
    from webrl_core.agent.policy import HFPolicy
    from webrl_core.config import ModelsConfig, PolicyConfig

    _tiny_model(tmp_path)
    calls = []
    real = kv_cache.prefilled_cache
    monkeypatch.setattr("webrl_core.agent.policy.prefilled_cache",
                        lambda model, rows, reserve: calls.append(len(rows)) or real(model, rows, reserve))
    prompts = [build_prompt(f"Open item {i}", [], f'<a id="3">item {i}</a>' * (1 + 3 * i)) for i in range(3)]
    out = {}
    for mode in ("padded", "auto", "rows"):
        pol = HFPolicy(tmp_path / "model", PolicyConfig(max_new_tokens=7, batch_size=2, decode_matmul="linear",
                                                        prefill=mode), ModelsConfig(max_length=256), temperature=0)
        out[mode] = pol.generate(prompts)
    assert calls == [2, 2]  # auto and rows, each for its 2-row call only (a call of one row has no padding)
    assert out["auto"] == out["rows"] == out["padded"]


def _tiny_model(tmp_path):
    if not (tmp_path / "model").exists():
        prompts = [build_prompt(f"Open item {i}", [], f'<a id="3">item {i}</a>' * (1 + 5 * i)) for i in range(4)]
        train_embedded_tokenizer(prompts, 350, tmp_path / "tok")
        cfg = EmbeddedModelConfig(vocab_size=350, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=2,
                                  max_length=256)
        build_embedded_model(tmp_path / "tok", cfg, tmp_path / "model", seed=0)
    return AutoModelForCausalLM.from_pretrained(tmp_path / "model").eval()

"""learn.matmul_attention: the "matmul" kernel computes sdpa's attention (padding, grouped-query heads, a KV cache,
gradients), hands score matrices above its crossover to sdpa, and its crossover follows its own timings."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from webrl_core.learn import matmul_attention
from webrl_core.learn.models import attention_of, set_attention


@pytest.fixture(scope="module")
def gqa_model():
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=256)
    return LlamaForCausalLM(cfg).eval()


def _padded_batch():
    g = torch.Generator().manual_seed(1)
    lengths = (37, 12, 25)
    ids = torch.zeros(len(lengths), max(lengths), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, n in enumerate(lengths):  # left padded, as every scoring and training pass pads
        ids[i, -n:] = torch.randint(1, 97, (n,), generator=g)
        mask[i, -n:] = 1
    return ids, mask, (mask.cumsum(-1) - 1).clamp(min=0)


def test_matmul_attention_equals_sdpa_on_a_padded_grouped_query_batch_with_gradients(gqa_model, monkeypatch):
    monkeypatch.setitem(matmul_attention._KNOWN, ("torch.float32", 4, 2, 16, True), 10 ** 9)
    monkeypatch.setitem(matmul_attention._KNOWN, ("torch.float32", 4, 2, 16, False), 10 ** 9)
    ids, mask, pos = _padded_batch()
    real = mask.bool()
    out, grads = {}, {}
    computed = []
    kernel_fn = matmul_attention.matmul_attention
    monkeypatch.setattr(matmul_attention, "matmul_attention", lambda *a, **kw: computed.append(1) or kernel_fn(*a, **kw))
    for kernel in ("sdpa", "matmul"):
        set_attention(gqa_model, kernel)
        assert attention_of(gqa_model) == kernel
        gqa_model.zero_grad()
        logits = gqa_model(input_ids=ids, attention_mask=mask, position_ids=pos).logits
        logits[real].logsumexp(-1).sum().backward()
        out[kernel] = logits.detach()[real]
        grads[kernel] = {n: p.grad.clone() for n, p in gqa_model.named_parameters() if p.grad is not None}
    # the kernel itself ran in both layers, not sdpa in its place
    assert len(computed) == gqa_model.config.num_hidden_layers
    assert torch.allclose(out["sdpa"], out["matmul"], atol=1e-5), (out["sdpa"] - out["matmul"]).abs().max()
    assert grads["sdpa"].keys() == grads["matmul"].keys() and grads["sdpa"]
    for n, g in grads["sdpa"].items():
        assert torch.allclose(g, grads["matmul"][n], atol=1e-5, rtol=1e-4), n
    set_attention(gqa_model, "sdpa")


def test_generation_with_a_kv_cache_is_the_same_under_both_kernels(gqa_model, monkeypatch):
    monkeypatch.setitem(matmul_attention._KNOWN, ("torch.float32", 4, 2, 16, False), 10 ** 9)
    ids, mask, _ = _padded_batch()
    runs = {}
    for kernel in ("sdpa", "matmul"):
        set_attention(gqa_model, kernel)
        with torch.no_grad():
            runs[kernel] = gqa_model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=8, do_sample=False,
                                              pad_token_id=0)
    assert torch.equal(runs["sdpa"], runs["matmul"])
    set_attention(gqa_model, "sdpa")


def test_calls_above_the_crossover_go_to_sdpa(gqa_model, monkeypatch):
    from transformers.integrations import sdpa_attention

    seen = []
    real_sdpa = sdpa_attention.sdpa_attention_forward

    def counting(module, query, key, *a, **kw):
        seen.append(query.shape[2] * key.shape[2])
        return real_sdpa(module, query, key, *a, **kw)

    monkeypatch.setattr(sdpa_attention, "sdpa_attention_forward", counting)
    monkeypatch.setitem(matmul_attention._KNOWN, ("torch.float32", 4, 2, 16, False), 20 * 20)
    set_attention(gqa_model, "matmul")
    with torch.no_grad():
        gqa_model(input_ids=torch.arange(1, 11).unsqueeze(0))  # 10 x 10: this kernel
        assert seen == []
        gqa_model(input_ids=torch.arange(1, 31).unsqueeze(0))  # 30 x 30 > 400: sdpa, in each of the 2 layers
        assert seen == [900, 900]
    set_attention(gqa_model, "sdpa")


def test_a_decode_step_on_keys_viewed_in_a_kv_cache_reservation_goes_to_sdpa(monkeypatch):
    from transformers.integrations import sdpa_attention

    real = sdpa_attention.sdpa_attention_forward
    seen = []
    monkeypatch.setattr(sdpa_attention, "sdpa_attention_forward",
                        lambda *a, **kw: seen.append(a[1].shape[2]) or real(*a, **kw))
    monkeypatch.setitem(matmul_attention._KNOWN, ("torch.float32", 4, 2, 16, False), 10 ** 9)
    layer = torch.nn.Module()
    layer.num_key_value_groups = 2
    reserved = torch.randn(1, 2, 40, 16)  # room for 40 positions, 30 filled: a strided view, as kv_cache keeps it
    k, v = reserved[:, :, :30], reserved.flip(2)[:, :, :30]
    with torch.no_grad():
        matmul_attention.attention(layer, torch.randn(1, 4, 1, 16), k, v, None, scaling=0.25)
        assert seen == [1]  # one query (a decode step): sdpa reads the view as it is
        out, _ = matmul_attention.attention(layer, torch.randn(1, 4, 1, 16), k.contiguous(), v.contiguous(), None,
                                            scaling=0.25)
        assert seen == [1] and out.shape == (1, 1, 4, 16)
        q = torch.randn(1, 4, 30, 16)  # a prefill into the reservation: this kernel, the same attention as sdpa's
        got, _ = matmul_attention.attention(layer, q, k, v, None, scaling=0.25)
        assert seen == [1]
        want, _ = real(layer, q, k, v, None, scaling=0.25, is_causal=True)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_the_crossover_lies_where_its_own_timings_say():
    got = matmul_attention.measure("torch.float32", 2, 1, 16, grad=False)
    times = {int(t): ms for t, ms in got["ms_matmul_sdpa"].items()}
    wins = [t for t in sorted(times) if times[t][0] < times[t][1]]
    best = got["crossover_t"]
    assert best == 0 or (best in wins and all(t in wins for t in sorted(times) if t <= best))
    later = [t for t in matmul_attention.LADDER if t > best]
    assert best == 0 or not later or later[0] not in wins  # the ladder stopped at the first loss
    assert got["crossover"] == (0 if best == 0 else best * later[0] if later else 4 * best * best)


def test_a_kept_crossover_is_read_back_not_measured_again(tmp_path, monkeypatch):
    monkeypatch.setenv("WEBRL_CALIBRATE", "1")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    shape = ("torch.float32", 2, 1, 8, False)
    monkeypatch.delitem(matmul_attention._KNOWN, shape, raising=False)
    q, k = torch.zeros(1, 2, 4, 8), torch.zeros(1, 1, 4, 8)
    first = matmul_attention.crossover(q, k, grad=False)
    assert (tmp_path / "webrl" / "attention.json").exists()
    matmul_attention._KNOWN.pop(shape)
    monkeypatch.setattr(matmul_attention, "measure", lambda *a: pytest.fail("measured again"))
    assert matmul_attention.crossover(q, k, grad=False) == first
    matmul_attention._KNOWN.pop(shape)


def test_compiled_layers_find_their_crossovers_known_before_they_compile(tmp_path, monkeypatch):
    """A compiled graph cannot read the kept file; compile_layers looks the model's crossovers up first, so the
    compiled kernel uses the box's crossover, not the default."""
    from webrl_core.learn.models import compile_layers

    monkeypatch.setenv("WEBRL_CALIBRATE", "1")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    cfg = LlamaConfig(vocab_size=97, hidden_size=48, intermediate_size=64, num_hidden_layers=1, num_attention_heads=6,
                      num_key_value_heads=2, max_position_embeddings=64)
    model = LlamaForCausalLM(cfg)
    set_attention(model, "matmul")
    shapes = [("torch.float32", 6, 2, 8, grad) for grad in (False, True)]
    for shape in shapes:
        monkeypatch.delitem(matmul_attention._KNOWN, shape, raising=False)
    measured = []
    monkeypatch.setattr(matmul_attention, "measure",
                        lambda *shape: measured.append(shape) or {"crossover": 4096 + len(measured), "crossover_t": 64})
    monkeypatch.setattr(torch.nn.Module, "compile", lambda self, **kw: None)  # the lookup is what is tested here
    monkeypatch.setenv("CXX", "sh")  # compile_layers asks for a C++ compiler on the PATH; nothing compiles here
    assert compile_layers(model, "on", passes=0)
    assert sorted(measured) == sorted(shapes)
    assert [matmul_attention._KNOWN[s] for s in shapes] == [4096 + 1 + shapes.index(s) for s in shapes]
    for shape in shapes:
        matmul_attention._KNOWN.pop(shape)

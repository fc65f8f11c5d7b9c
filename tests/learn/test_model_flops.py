"""learn.model_flops: a pass's model FLOPs by hand, the rows the frozen-layer cache served, and the stages' shares of
the peak they measured."""

from __future__ import annotations

import pytest
from actor_samples import four_layer_model, two_click_transitions
from transformers import LlamaConfig, LlamaForCausalLM

from webrl_core.config_loader import load_config
from webrl_core.learn import frozen_prefix as FP
from webrl_core.learn.model_flops import DecoderShape, lengths_sums, share_of_peak
from webrl_core.learn.models import encode_prompt, encode_prompt_action, load_causal_lm, load_tokenizer


def _llama(layers=4, trained=2):
    m = LlamaForCausalLM(LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                                     num_attention_heads=4, num_key_value_heads=2, vocab_size=100))
    m.requires_grad_(False)
    for layer in m.model.layers[layers - trained:]:
        layer.requires_grad_(True)
    return m


def test_forward_and_backward_by_hand():
    shape = DecoderShape.of(_llama())
    # q 64x64, k and v 64x32 (2 of 4 heads), o 64x64; gate, up 64x128, down 128x64
    p = 64 * 64 + 2 * 64 * 32 + 64 * 64 + 3 * 64 * 128
    assert (shape.layers, shape.hidden, shape.layer_params, shape.grad_layers) == (4, 64, p, 2)
    assert shape.trained_params == 2 * p and shape.n_frozen == 0
    s1, s2 = lengths_sums([3, 5], times=2)
    assert (s1, s2) == (16, 68)
    assert shape.forward(s1, s2) == 2 * p * 4 * 16 + 4 * 4 * 64 * 68
    # training the top 2 layers whole: 4 P k S1 + 8 k d S2 on top of the forward
    assert shape.pass_flops(s1, s2, train=True) == shape.forward(s1, s2) + 4 * p * 2 * 16 + 8 * 2 * 64 * 68
    # no cache attached: a hit count changes nothing
    assert shape.pass_flops(s1, s2, {"hit_tokens": 8, "hit_tokens_sq": 34}) == shape.forward(s1, s2)


def test_a_backward_through_frozen_layers_to_an_adapter_counts_their_activations_only():
    m = _llama(trained=0)
    m.model.layers[1].mlp.down_proj.weight.requires_grad_(True)  # one trained matrix two layers down
    shape = DecoderShape.of(m)
    assert shape.grad_layers == 3 and shape.trained_params == 128 * 64
    assert shape.backward(10, 100) == (2 * shape.layer_params * 3 + 2 * 128 * 64) * 10 + 8 * 3 * 64 * 100


def test_share_of_peak_is_absent_without_a_peak_or_seconds():
    assert share_of_peak(8e9, 2.0, 1e10) == pytest.approx(0.4)
    assert share_of_peak(8e9, 2.0, None) is None and share_of_peak(8e9, 0.0, 1e10) is None


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return four_layer_model(tmp_path_factory.mktemp("model_flops"))


def test_a_phase_counts_the_bottom_layers_the_cache_spared(folder, tmp_path, monkeypatch):
    """The critic's epoch misses the cache and runs whole; the actor stage's critic values then find every prompt
    and run the top 2 layers only; the reference pass runs whole and its rows serve the epoch's forward."""
    from webrl_core.learn.critic_trainer import train_critic
    from webrl_core.learn.webrl_trainer import train_actor

    monkeypatch.setenv(FP.ENV, "64")
    FP.clear()
    samples = two_click_transitions()
    settings = load_config(sets=["models.device=cpu", "models.dtype=float32", "models.train_layers=2",
                                 "models.max_length=256", "actor.batch_size=2", "critic.batch_size=2"])
    critic = train_critic(samples, folder, tmp_path / "critic", settings)
    actor = train_actor(samples, folder, tmp_path / "actor", settings, critic_dir=tmp_path / "critic",
                        progress=False)
    FP.clear()
    model = load_causal_lm(folder, settings.models, trainable=True)
    FP.attach(model, settings.models)
    shape = DecoderShape.of(model)
    assert shape.n_frozen == 2 and shape.grad_layers == 2
    tok, max_len = load_tokenizer(folder), settings.models.max_length

    assert critic["flops"] == pytest.approx(shape.pass_flops(critic["tokens"], critic["tokens_sq"], train=True))
    prompts = sorted({s["observation"] for s in samples} | {s["next_observation"] for s in samples})
    p1, p2 = lengths_sums(len(encode_prompt(tok, p, max_len)) for p in prompts)
    # the critic adds its value heads to the backbone's layers: their FLOPs are not counted
    assert actor["critic_values_flops"] == pytest.approx(shape.forward(p1, p2, layers=2))
    # the reference pass and the epoch: the trained rows (prompt + action), sum T and sum T^2 as the stage counts them
    r1, r2 = actor["tokens"], actor["tokens_sq"]
    assert r1 > 0 and r2 > r1
    assert actor["ref_flops"] == pytest.approx(shape.forward(r1, r2))
    assert actor["flops"] == pytest.approx(shape.forward(r1, r2, layers=2) + shape.backward(r1, r2))
    assert "share_of_peak" not in actor  # no peak measured with the box's measurements off (the test suite's)
    assert "copy_bytes_per_s" not in actor


def test_a_stage_reports_its_share_of_the_peak_it_measured(folder, tmp_path, monkeypatch):
    from webrl_core.learn.sft_trainer import sft_train

    monkeypatch.setenv("WEBRL_CALIBRATE", "1")  # the peak is measured with the box's measurements on
    settings = load_config(sets=["models.device=cpu", "models.dtype=float32", "models.max_length=256",
                                 "actor.batch_size=2", "actor.micro_batch_size=2", "models.attn_implementation=sdpa"])
    pairs = [(s["observation"], s["action"]) for s in two_click_transitions()]
    stats = sft_train(pairs, folder, tmp_path / "sft", settings, epochs=1)
    tok = load_tokenizer(folder)
    lengths = [len(encode_prompt_action(tok, p, a, 256)["input_ids"]) for p, a in pairs]
    model = load_causal_lm(folder, settings.models, trainable=True)
    assert stats["flops"] == pytest.approx(DecoderShape.of(model).pass_flops(*lengths_sums(lengths), train=True))
    assert stats["peak_flops"] > 1e8 and stats["copy_bytes_per_s"] > 1e8  # the box's two rates beside the stage
    assert stats["share_of_peak"] == pytest.approx(stats["flops"] / stats["train_s"] / stats["peak_flops"], rel=1e-3)


def test_a_stage_cut_by_max_steps_counts_the_rows_it_passed_over(folder, tmp_path):
    from webrl_core.learn.sft_trainer import sft_train

    settings = load_config(sets=["models.device=cpu", "models.dtype=float32", "models.max_length=256",
                                 "actor.batch_size=2", "actor.micro_batch_size=2", "models.attn_implementation=sdpa"])
    pairs = [(s["observation"], s["action"]) for s in two_click_transitions()]
    assert len(pairs) > 2  # one step of 2 rows is a part of one epoch
    stats = sft_train(pairs, folder, tmp_path / "sft", settings, max_steps=1, epochs=3)
    tok = load_tokenizer(folder)
    lengths = [len(encode_prompt_action(tok, p, a, 256)["input_ids"]) for p, a in pairs]
    model = load_causal_lm(folder, settings.models, trainable=True)
    assert stats["steps"] == 1
    assert stats["flops"] == pytest.approx(DecoderShape.of(model).pass_flops(*lengths_sums(lengths, 2 / len(pairs)),
                                                                              train=True))

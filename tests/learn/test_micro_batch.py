"""learn.micro_batch: the micro-batch and attention kernel of a CPU training stage are measured on the box, kept per
shape, and change how a step is computed, never the step: a calibrated SFT ends with the weights of an SFT run at
the chosen micro-batch and kernel set by hand."""

from __future__ import annotations

import json
import random

import pytest
import torch

from webrl_core.config import EmbeddedModelConfig
from webrl_core.config_loader import load_config
from webrl_core.learn import box_measurements, micro_batch
from webrl_core.learn.models import attention_of, load_causal_lm, set_attention, load_tokenizer
from webrl_core.learn.embedded_model import build_embedded_model, train_embedded_tokenizer
from webrl_core.learn.replay import score_replay
from webrl_core.learn.sft_trainer import sft_train
from webrl_core.prompts import build_prompt


def _pairs():
    return [(build_prompt(f"open item {i}", [], f"<button id={i}>Open {i}</button>" * (1 + i % 3)),
             f'do(action="Click", element="{i}")') for i in range(16)]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("micro")
    train_embedded_tokenizer([p + a for p, a in _pairs()], 400, root / "tok")
    cfg = EmbeddedModelConfig(vocab_size=400, hidden_size=48, intermediate_size=96, num_layers=2, num_heads=2,
                              max_length=512, arch="llama")
    return build_embedded_model(root / "tok", cfg, root / "llama", seed=3)


def _settings(*extra):
    return load_config(sets=["models.device=cpu", "models.max_length=256", "actor.batch_size=4",
                             "bootstrap.sft_lr=0.003", "bootstrap.sft_epochs=1", *extra])


def test_candidates_are_divisors_with_enough_items():
    assert micro_batch.candidates(8, 100) == [1, 2, 4, 8]
    assert micro_batch.candidates(8, 3) == [1, 2]  # 4 would need 4 items in each round
    assert micro_batch.candidates(6, 100) == [1, 2, 3, 6]
    assert micro_batch.candidates(1, 1) == [1]


def test_a_round_passes_over_one_length_grouped_steps_items():
    rows = [{"input_ids": [0] * n} for n in random.Random(0).sample(range(10, 2010), 1000)]
    draws = [[len(r["input_ids"]) for r in micro_batch.sampler_draw(rows, 4, 8, seed)] for seed in range(6)]
    for lengths in draws:  # one step of the length-grouped sampler: about one length (a random 4: ~1,000 apart)
        assert len(lengths) == 4 and lengths == sorted(lengths) and lengths[-1] - lengths[0] <= 100, draws
    assert len({tuple(d) for d in draws}) == len(draws)  # each round its own step
    assert micro_batch.sampler_draw(rows, 4, 8, 3) == micro_batch.sampler_draw(rows, 4, 8, 3)  # seeded


def test_auto_measures_both_kernels_and_a_named_kernel_is_loaded_and_kept(tiny, monkeypatch):
    auto = load_causal_lm(tiny, _settings().models, trainable=True)  # calibration off (the suite): as loaded
    assert attention_of(auto) == "sdpa" and micro_batch.kernels(auto, "auto") == ["sdpa", "matmul"]
    monkeypatch.setenv(box_measurements.CALIBRATE_ENV, "1")
    on = load_causal_lm(tiny, _settings().models, trainable=True)  # on a CPU with calibration on: matmul first
    assert attention_of(on) == "matmul" and micro_batch.kernels(on, "auto") == ["matmul", "sdpa"]
    named = load_causal_lm(tiny, _settings("models.attn_implementation=eager").models, trainable=True)
    assert attention_of(named) == "eager" and micro_batch.kernels(named, "eager") == ["eager"]
    ids = torch.arange(5, 40).unsqueeze(0)
    with torch.no_grad():
        a, b = auto(input_ids=ids).logits, named(input_ids=ids).logits
        assert torch.allclose(a, b, atol=1e-5)  # the same attention up to rounding
        set_attention(auto, "eager")
        assert attention_of(auto) == "eager" and torch.allclose(auto(input_ids=ids).logits, b, atol=1e-6)


def test_a_stage_too_short_to_pay_for_measuring_trains_at_the_default_shape(tiny, tmp_path, monkeypatch, capfd):
    monkeypatch.setenv(box_measurements.CALIBRATE_ENV, "1")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    # 2 steps of 4 items; measuring micro-batches 1, 2, 4 under two kernels passes over 86 items
    assert micro_batch.measured_items([(m, k) for k in "ab" for m in (1, 2, 4)], 4) == 86
    stats = sft_train(_pairs(), tiny, tmp_path / "short", _settings(), max_steps=2)
    said = capfd.readouterr().out
    assert "sft: micro-batch 1, matmul attention, not measured: the stage passes over 8 items, measuring pays from " \
           f"{micro_batch.PAYS * 86}" in said, said
    assert "by measurement" not in said and not micro_batch.cache_file().exists()
    assert (stats["micro_batch_size"], stats["attention"]) == (1, "matmul")


def test_a_measured_micro_batch_is_kept_and_takes_the_step_a_fixed_one_takes(tiny, tmp_path, monkeypatch, capfd):
    monkeypatch.setenv(box_measurements.CALIBRATE_ENV, "1")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(micro_batch, "PAYS", 0)  # 2 steps would not pay for measuring (the test above)
    settings = _settings()
    stats = sft_train(_pairs(), tiny, tmp_path / "measured", settings, max_steps=2)
    said = capfd.readouterr().out
    assert "sft: micro-batch " in said and "by measurement here" in said, said
    kept = json.loads(micro_batch.cache_file().read_text())
    (entry,) = kept.values()
    assert entry["stage"] == "sft" and entry["batch_size"] == 4
    rates = {(int(c.split("/")[0]), c.split("/")[1]): r for c, r in entry["tokens_per_s"].items()}
    assert set(rates) == {(m, k) for m in (1, 2, 4) for k in ("sdpa", "matmul")}  # interleaved: all measured
    assert all(r > 0 for r in rates.values())
    best = max(rates.values())
    chosen = (entry["micro"], entry["attention"])
    assert rates[chosen] >= (1 - micro_batch.TIE) * best  # the fastest (or a near tie)
    assert all(r < (1 - micro_batch.TIE) * best for c, r in rates.items() if c[0] < chosen[0])  # ties: smaller m
    assert f"{entry['attention']} attention" in said
    # the stage's stats (MLflow) say what it trained at
    assert (stats["micro_batch_size"], stats["attention"]) == chosen and stats["calibrate_s"] > 0

    sft_train(_pairs(), tiny, tmp_path / "again", settings, max_steps=2)  # the same shape: read, not measured
    assert "by measurement" not in capfd.readouterr().out

    monkeypatch.setenv(box_measurements.CALIBRATE_ENV, "0")  # the same step, the micro-batch set by hand
    by_hand = _settings(f"actor.micro_batch_size={entry['micro']}", f"models.attn_implementation={entry['attention']}")
    stats = sft_train(_pairs(), tiny, tmp_path / "fixed", by_hand, max_steps=2)
    assert (stats["micro_batch_size"], stats["attention"], stats["calibrate_s"]) == (*chosen, 0)
    start = load_causal_lm(tiny, settings.models).state_dict()
    measured = load_causal_lm(tmp_path / "measured", settings.models).state_dict()
    fixed = load_causal_lm(tmp_path / "fixed", settings.models).state_dict()
    assert max((measured[k] - start[k]).abs().max().item() for k in start) > 1e-4  # the steps did something
    for k in start:  # calibration left the RNG and the data order as they were
        assert torch.allclose(measured[k], fixed[k], atol=1e-6), k


def test_a_scoring_pass_measures_its_batch_once_and_scores_as_a_fixed_batch_does(tiny, tmp_path, monkeypatch,
                                                                                  capfd):
    monkeypatch.setenv(box_measurements.CALIBRATE_ENV, "1")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    model = load_causal_lm(tiny, _settings().models)
    tok = load_tokenizer(tiny)
    pairs = [(p, a) for p, a in _pairs()] * 15  # 240 items: enough to pay for measuring
    rows = [{"episode_id": f"e{i}", "idx": 0, "phase": 0, "prompt": p, "response": a, "intent": f"task {i}"}
            for i, (p, a) in enumerate(pairs)]
    few = micro_batch.scoring_batch("replay", model, [len(p) for p, _ in pairs[:40]], lambda idx, b: None, 3)
    assert few == 3 and not micro_batch.cache_file().exists()  # too small to pay: the default, nothing measured
    measured, stats = score_replay(rows, model, tok, 100, low=0.0, high=1.0, batch_size=None, scoring="all")
    said = capfd.readouterr().out
    assert "replay: scoring batch " in said, said
    (entry,) = json.loads(micro_batch.cache_file().read_text()).values()
    assert entry["stage"] == "score:replay" and set(entry["rates"]) == {"1", "2", "4", "8"}
    best = max(entry["rates"].values())
    assert entry["rates"][str(entry["batch"])] >= (1 - micro_batch.TIE) * best
    fixed, _ = score_replay(rows, model, tok, 100, low=0.0, high=1.0, batch_size=entry["batch"], scoring="all")
    assert "by measurement" not in capfd.readouterr().out
    assert [r["rank_score"] for r in measured] == pytest.approx([r["rank_score"] for r in fixed], abs=1e-6)
    again = micro_batch.scoring_batch("replay", model, [len(p) + len(a) for p, a in pairs], lambda idx, b: None, 3)
    assert again == entry["batch"]  # kept: read, not measured (the no-op scorer would make any measurement 0 s)

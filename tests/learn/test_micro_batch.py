"""learn.micro_batch: the micro-batch of a CPU training stage is measured on the box, kept per shape, and changes
how a step is computed, never the step: a calibrated SFT ends with the weights of an SFT run at the chosen
micro-batch set by hand."""

from __future__ import annotations

import json

import pytest
import torch

from webrl_core.config import EmbeddedModelConfig
from webrl_core.config_loader import load_config
from webrl_core.learn import micro_batch
from webrl_core.learn.models import build_embedded_model, load_causal_lm, train_embedded_tokenizer
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
    assert micro_batch.candidates(8, 10) == [1, 2]  # 4 would need 12 items (a warm-up and two timed passes)
    assert micro_batch.candidates(6, 100) == [1, 2, 3, 6]
    assert micro_batch.candidates(1, 1) == [1]


def test_a_measured_micro_batch_is_kept_and_takes_the_step_a_fixed_one_takes(tiny, tmp_path, monkeypatch, capfd):
    monkeypatch.setenv(micro_batch.CALIBRATE_ENV, "1")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    settings = _settings()
    sft_train(_pairs(), tiny, tmp_path / "measured", settings, max_steps=2)
    said = capfd.readouterr().out
    assert "sft: micro-batch " in said and "by measurement here" in said, said
    kept = json.loads(micro_batch.cache_file().read_text())
    (entry,) = kept.values()
    assert entry["stage"] == "sft" and entry["batch_size"] == 4
    rates = {int(m): r for m, r in entry["tokens_per_s"].items()}
    assert all(r > 0 for r in rates.values())
    measured = sorted(rates)
    assert measured == [1, 2, 4][:len(measured)] and len(measured) >= 2  # ascending, from 1
    if len(measured) < 3:  # stopped early: the last one was clearly slower than the best
        assert rates[measured[-1]] < (1 - micro_batch.STOP) * max(rates.values())
    assert rates[entry["micro"]] >= (1 - micro_batch.TIE) * max(rates.values())  # the fastest (or a near tie)
    assert all(rates[m] < (1 - micro_batch.TIE) * max(rates.values()) for m in rates if m < entry["micro"])

    sft_train(_pairs(), tiny, tmp_path / "again", settings, max_steps=2)  # the same shape: read, not measured
    assert "by measurement" not in capfd.readouterr().out

    monkeypatch.setenv(micro_batch.CALIBRATE_ENV, "0")  # the same step, the micro-batch set by hand
    sft_train(_pairs(), tiny, tmp_path / "fixed", _settings(f"actor.micro_batch_size={entry['micro']}"), max_steps=2)
    start = load_causal_lm(tiny, settings.models).state_dict()
    measured = load_causal_lm(tmp_path / "measured", settings.models).state_dict()
    fixed = load_causal_lm(tmp_path / "fixed", settings.models).state_dict()
    assert max((measured[k] - start[k]).abs().max().item() for k in start) > 1e-4  # the steps did something
    for k in start:  # calibration left the RNG and the data order as they were
        assert torch.allclose(measured[k], fixed[k], atol=1e-6), k

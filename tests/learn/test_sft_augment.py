"""The bootstrap SFT's augmented passes: ceil(epochs) passes, the swap and the shuffle at their rates, seeded."""

from __future__ import annotations

import re

import pytest

from webrl_core.config_loader import ConfigError, load_config
from webrl_core.learn.sft_augment import augmented_sft_passes, sft_passes

LIST = "\n".join(f"[{6 + i}] {f} 24 submissions" for i, f in enumerate(["books", "cooking", "fitness", "gaming"]))
PAIRS = [(f"Task: Go to the gaming forum.\n{LIST}", '# Element: gaming\ndo(action="Click", element="9")'),
         ("Task: Go to page 2.\n[3] Next", 'do(action="Click", element="3")')] * 20


def gaming_id(prompt: str) -> str:
    return re.search(r"\[(\d+)\] gaming", prompt).group(1)


def test_passes_epochs_and_rates():
    assert augmented_sft_passes(PAIRS, {}, 2.5, 0.0, 0.0, seed=0) == (PAIRS, None)
    out, epochs = augmented_sft_passes(PAIRS, {}, 2.5, 0.0, 1.0, seed=0)
    assert len(out) == 3 * len(PAIRS) and epochs == pytest.approx(2.5 / 3)
    for prompt, action in out:  # every list pair moved consistently; the pair without a list is as it was
        want = gaming_id(prompt) if "gaming" in prompt else "3"
        assert action.endswith(f'element="{want}")')
    assert len({gaming_id(p) for p, _ in out if "gaming" in p}) == 4
    half, _ = augmented_sft_passes(PAIRS, {}, 1.0, 0.0, 0.5, seed=0)
    assert 4 <= sum(p != q for (p, _), (q, _) in zip(half, PAIRS)) <= 16  # about half of the 20 list pairs
    assert augmented_sft_passes(PAIRS, {}, 1.0, 0.0, 0.5, seed=0) == (half, 1.0)  # seeded
    assert augmented_sft_passes(PAIRS, {}, 1.0, 0.0, 0.5, seed=1)[0] != half


def test_settings_turn_the_shuffle_on_and_refuse_it_without_compact_lines():
    s = load_config("demo-full", sets=["bootstrap.sft_entity_swap=0", "bootstrap.sft_list_shuffle=1.0",
                                       "bootstrap.sft_epochs=1"])
    out, epochs = sft_passes(s, PAIRS)
    assert epochs == 1.0 and len({gaming_id(p) for p, _ in out if "gaming" in p}) > 1
    with pytest.raises(ConfigError, match="sft_list_shuffle=0.5 permutes the compact page"):
        load_config("demo-full", sets=["bootstrap.sft_list_shuffle=0.5", "prompt.observation=html"])

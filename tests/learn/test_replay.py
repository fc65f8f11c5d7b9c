"""Replay: 1/PPL (batched == official one-at-a-time == hand-computed), window, cap, global de-duplication."""

from __future__ import annotations

import math
import random

import pytest
import torch

from webrl_core.config import EmbeddedModelConfig, ModelsConfig
from webrl_core.learn.models import encode_prompt_action, load_causal_lm, load_tokenizer
from webrl_core.learn.embedded_model import build_embedded_model, train_embedded_tokenizer
from webrl_core.prompts import build_prompt
from webrl_core.learn.replay import (first_success_per_intent, inverse_perplexity, official_perplexity, score_replay,
                               select_replay)

ACT = 'do(action="Click", element="{}")'


def pairs(n: int) -> list[tuple[str, str]]:
    return [(build_prompt(f"Open item {i}", [ACT.format(i)] * (i % 3), f'<a id="{i}">item {i}</a>' * (1 + 5 * i)),
             "# Note: go\n" + ACT.format(i)) for i in range(n)]


@pytest.fixture(scope="module", params=["llama", "gpt_neox"])
def model(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(request.param)
    train_embedded_tokenizer([p + a for p, a in pairs(6)], 350, root / "tok")
    cfg = EmbeddedModelConfig(vocab_size=350, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=2,
                              max_length=512, arch=request.param)
    d = build_embedded_model(root / "tok", cfg, root / "model", seed=2)
    return load_causal_lm(d, ModelsConfig()), load_tokenizer(d)


def test_inverse_perplexity_matches_hand_and_official(model):
    m, tok = model
    ps = pairs(7)
    ours = inverse_perplexity(m, tok, ps, 512, batch_size=3)
    assert ours == pytest.approx(inverse_perplexity(m, tok, ps, 512, batch_size=1), abs=1e-6)
    assert ours == pytest.approx(official_perplexity(m, tok, ps, 512), abs=1e-6)
    # by hand for one item: exp(mean log-softmax of each action token given everything before it)
    enc = encode_prompt_action(tok, *ps[4], 512)
    ids = torch.tensor([enc["input_ids"]])
    with torch.no_grad():
        logp = torch.log_softmax(m(ids).logits[0].float(), -1)
    pos = [t for t, a in enumerate(enc["action_mask"]) if a]
    mean = sum(logp[t - 1, enc["input_ids"][t]].item() for t in pos) / len(pos)
    assert ours[4] == pytest.approx(math.exp(mean), rel=1e-5)
    assert all(0 < s < 1 for s in ours)


def test_inverse_perplexity_of_a_bf16_model(model):
    """A model loaded in bf16 (models.dtype auto on an AVX512-BF16/AMX CPU or a GPU) scores too, in float32 sums,
    close to its float32 weights' scores, even where the process's default dtype was left at bf16 (as in the phase
    flow on such a box)."""
    import copy

    m, tok = model
    ps = pairs(5)
    half = copy.deepcopy(m).to(torch.bfloat16)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        ours = inverse_perplexity(half, tok, ps, 512, batch_size=2)
    finally:
        torch.set_default_dtype(default)
    assert all(isinstance(s, float) and 0 < s < 1 for s in ours)
    assert ours == pytest.approx(inverse_perplexity(m, tok, ps, 512, batch_size=2), rel=0.05)


def test_window_and_cap_hand_computed():
    rows = [{"episode_id": f"e{i}", "idx": 0, "intent": f"t{i}"} for i in range(8)]
    scores = [0.5, 0.50001, 0.7, 0.95, 0.950001, 0.2, 0.9, 1.0]
    kept = select_replay(rows, scores, n_current_steps=10, low=0.5, high=0.95, cap_ratio=2.0, seed=0)
    # window (0.5, 0.95]: 0.5 and 0.950001 and 1.0 and 0.2 are out -> 4 in, the cap (20) does not bind
    assert sorted(r["episode_id"] for r in kept) == ["e1", "e2", "e3", "e6"]
    assert {r["episode_id"]: r["rank_score"] for r in kept}["e3"] == 0.95
    capped = select_replay(rows, scores, n_current_steps=1, cap_ratio=1.5, seed=0)  # floor(1.5) = 1
    assert len(capped) == 1 and capped[0]["episode_id"] in {"e1", "e2", "e3", "e6"}
    assert select_replay(rows, scores, 1, cap_ratio=1.5, seed=0) == capped  # seeded
    picks = {select_replay(rows, scores, 1, cap_ratio=1.0, seed=s)[0]["episode_id"] for s in range(20)}
    assert len(picks) > 1  # the shuffle really depends on the seed
    assert select_replay(rows, scores, 0) == []
    with pytest.raises(ValueError):
        select_replay(rows, scores[:3], 5)


def test_first_success_per_intent_is_global():
    rows = [{"episode_id": "b", "phase": 1, "idx": i, "intent": "buy lamp"} for i in range(2)]
    rows += [{"episode_id": "a", "phase": 2, "idx": 0, "intent": "buy lamp"}]
    rows += [{"episode_id": "c", "phase": 0, "idx": 1, "intent": "buy lamp"}, {"episode_id": "c", "phase": 0, "idx": 0,
                                                                              "intent": "buy lamp"}]
    rows += [{"episode_id": "d", "phase": 1, "idx": 0, "intent": "post"}]
    out = first_success_per_intent(rows)
    assert [(r["episode_id"], r["idx"]) for r in out] == [("c", 0), ("c", 1), ("d", 0)]


def test_score_replay_end_to_end(model):
    m, tok = model
    ps = pairs(6)
    cands = [{"episode_id": f"e{i}", "idx": 0, "phase": 0, "intent": f"Open item {i}", "prompt": p, "response": a}
             for i, (p, a) in enumerate(ps)]
    cands.append({**cands[0], "episode_id": "z-dup"})  # same intent, later trajectory -> dropped
    scores = inverse_perplexity(m, tok, ps, 512)
    lo = sorted(scores)[1]  # a window that keeps exactly the 4 highest-scoring items
    selected, stats = score_replay(cands, m, tok, n_current_steps=1, low=lo, high=1.0, cap_ratio=3.0,
                                   max_length=512, batch_size=4, scoring="all")
    assert stats["candidates"] == 7 and stats["scored"] == 6 and stats["deduplicated"] == 6 and stats["in_window"] == 4
    assert stats["selected"] == len(selected) == 3
    lengths = [len(encode_prompt_action(tok, p, a, 512)["input_ids"]) for p, a in ps]  # the scored rows' tokens
    assert (stats["scored_tokens"], stats["scored_tokens_sq"]) == (sum(lengths), sum(n * n for n in lengths))
    assert stats["score_s"] > 0
    for r in selected:
        i = int(r["episode_id"][1:])
        assert r["rank_score"] == pytest.approx(scores[i]) and scores[i] > lo


def test_scoring_until_the_cap_scores_less_and_draws_from_the_same_window(model):
    """``until_cap`` scores a seeded shuffle until the cap is full: it stops early on a large buffer, every pick is
    in the window with its true score, a cap above the window's size takes the whole window (as ``all`` does), and
    over seeds every in-window step gets picked (a random subset, not a fixed one)."""
    m, tok = model
    ps = pairs(40)
    cands = [{"episode_id": f"e{i:02d}", "idx": 0, "phase": 0, "intent": f"Open item {i}", "prompt": p,
              "response": a} for i, (p, a) in enumerate(ps)]
    scores = inverse_perplexity(m, tok, ps, 512)
    lo = sorted(scores)[len(scores) // 4]  # three quarters of the buffer are in the window
    window = {f"e{i:02d}" for i, s in enumerate(scores) if lo < s <= 1.0}
    picked, stats = score_replay(cands, m, tok, n_current_steps=2, low=lo, high=1.0, cap_ratio=1.0,
                                 max_length=512, batch_size=2, scoring="until_cap")
    assert stats["selected"] == len(picked) == 2 and stats["scored"] == 32 < stats["deduplicated"] == 40
    order = list(range(40))
    random.Random(0).shuffle(order)  # the seeded order until_cap scores in: its first 32 were scored
    lengths = [len(encode_prompt_action(tok, *ps[i], 512)["input_ids"]) for i in order[:32]]
    assert (stats["scored_tokens"], stats["scored_tokens_sq"]) == (sum(lengths), sum(n * n for n in lengths))
    for r in picked:
        assert r["episode_id"] in window and r["rank_score"] == pytest.approx(scores[int(r["episode_id"][1:])])
    whole, _ = score_replay(cands, m, tok, n_current_steps=100, low=lo, high=1.0, max_length=512, scoring="until_cap")
    both, _ = score_replay(cands, m, tok, n_current_steps=100, low=lo, high=1.0, max_length=512, scoring="all")
    assert {r["episode_id"] for r in whole} == {r["episode_id"] for r in both} == window
    seen = set()
    for seed in range(40):
        seen |= {r["episode_id"] for r in score_replay(cands, m, tok, 2, low=lo, high=1.0, cap_ratio=1.0,
                                                       max_length=512, seed=seed, scoring="until_cap")[0]}
    assert len(seen) > len(window) // 2
    with pytest.raises(ValueError, match="replay.scoring"):
        score_replay(cands, m, tok, 2, scoring="some")

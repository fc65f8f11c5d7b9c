"""ORM: the decision rule with hand-computed numbers, batched scoring == one at a time, examples, SFT training."""

from __future__ import annotations

import math

import pytest
import torch

from webrl_core.config import EmbeddedModelConfig, ModelsConfig, OrmConfig
from webrl_core.models import build_embedded_model, load_tokenizer, train_embedded_tokenizer
from webrl_core.orm import (OrmScorer, answer_token_ids, evaluate_orm, official_orm_p_yes, orm_decision,
                            orm_examples_from_episodes, orm_prompt_for_episode, split_examples, train_orm)
from webrl_core.prompts import build_orm_prompt

OK = 'do(action="Click", element="1")'
BAD = 'do(action="Scroll Down")'


def episodes(n: int):
    eps, steps, labels = [], {}, {}
    for i in range(n):
        good = i % 2 == 0
        eid = f"e{i}"
        eps.append({"episode_id": eid, "intent": f"Open the page of item {i}"})
        steps[eid] = [{"idx": 1, "response": OK if good else BAD, "html": f'<a id="1">item {i}</a>'},
                      {"idx": 0, "response": "# Note: first\n" + OK, "html": "<p>start</p>"}]
        labels[eid] = good
    return eps, steps, labels


def test_decision_hand_computed():
    # logits 2 vs 0: P(YES) = 1/(1+e^-2) = 0.880797...
    p, ok = orm_decision(2.0, 0.0, 0.5)
    assert p == pytest.approx(0.8807970779778823) and ok
    p, ok = orm_decision(0.0, math.log(3.0), 0.5)  # P(YES) = 1/(1+3) = 0.25
    assert p == pytest.approx(0.25) and not ok
    assert orm_decision(1.0, 1.0, 0.5) == (0.5, True)  # ties count as success (>= threshold)
    assert orm_decision(1.0, 1.0, 0.6)[1] is False


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def model_dir(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(request.param)
    eps, steps, _ = episodes(4)
    corpus = [orm_prompt_for_episode(e, steps[e["episode_id"]]) + "YES NO" for e in eps]
    train_embedded_tokenizer(corpus, 360, root / "tok")
    cfg = EmbeddedModelConfig(vocab_size=360, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=2,
                              max_length=512, arch=request.param)
    return build_embedded_model(root / "tok", cfg, root / "model", seed=1)


def test_scorer_matches_lm_head_softmax_and_batching(model_dir):
    mcfg = ModelsConfig(max_length=512)
    scorer = OrmScorer(model_dir, OrmConfig(batch_size=3), mcfg)
    prompts = [build_orm_prompt(f"intent {i}", [OK] * i, "<p>x</p>" * (i * 5 + 1)) for i in range(5)]
    batched = scorer.p_yes(prompts)
    single = scorer.p_yes(prompts, batch_size=1)
    reference = official_orm_p_yes(scorer.model, scorer.tok, prompts, 512)  # whole-sequence logits, one by one
    assert batched == pytest.approx(single, abs=1e-5) and batched == pytest.approx(reference, abs=1e-5)
    # hand check on one prompt: softmax of the two logits of the full forward pass
    yes, no = answer_token_ids(scorer.tok)
    ids = torch.tensor([scorer.tok.encode(prompts[0], add_special_tokens=False)])
    with torch.no_grad():
        z = scorer.model(ids).logits[0, -1]
    expected = 1 / (1 + math.exp(float(z[no] - z[yes])))
    assert batched[0] == pytest.approx(expected, abs=1e-5)
    assert [ok for _, ok in scorer.score(prompts)] == [p >= 0.5 for p in batched]


def test_examples_and_split():
    eps, steps, labels = episodes(6)
    ex = orm_examples_from_episodes(eps, steps, labels)
    assert [e["completion"] for e in ex] == ["YES", "NO"] * 3
    # steps are ordered by idx and the final HTML is the last step's observation
    assert ex[1]["prompt"] == build_orm_prompt("Open the page of item 1", ["# Note: first\n" + OK, BAD],
                                               '<a id="1">item 1</a>')
    assert len(orm_examples_from_episodes(eps, steps, [True, None, False, True, True, False])) == 5
    train, held = split_examples(ex, 0.34, seed=0)
    assert len(held) == 2 and len(train) == 4 and {e["episode_id"] for e in train + held} == {e["episode_id"] for e in ex}


def test_train_orm_learns_and_evaluates(tmp_path):
    eps, steps, labels = episodes(8)
    ex = orm_examples_from_episodes(eps, steps, labels)
    train_embedded_tokenizer([e["prompt"] for e in ex], 360, tmp_path / "tok")
    model_dir = build_embedded_model(tmp_path / "tok", EmbeddedModelConfig(
        vocab_size=360, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=2, max_length=512), tmp_path / "m",
        seed=1)
    cfg = OrmConfig(epochs=40, lr=2e-2, batch_size=8)
    mcfg = ModelsConfig(max_length=512, device="cpu")
    before = evaluate_orm(OrmScorer(model_dir, cfg, mcfg), ex)
    out = train_orm(ex, model_dir, tmp_path / "orm", cfg, mcfg, seed=0)
    assert (out / "model.safetensors").exists()
    after = evaluate_orm(OrmScorer(out, cfg, mcfg), ex)
    assert after["accuracy"] == 1.0 and after["precision"] == 1.0 and after["recall"] == 1.0
    assert after["n"] == 8 and after["tp"] == 4 and after["tn"] == 4
    assert before["n"] == 8 and before["accuracy"] < 1.0  # the untrained model cannot tell them apart


def test_refuses_tokenizer_that_splits_answers(tmp_path):
    train_embedded_tokenizer(["abc"], 300, tmp_path / "tok")
    tok = load_tokenizer(tmp_path / "tok")
    answer_token_ids(tok)  # ours: single tokens
    tok2 = load_tokenizer(tmp_path / "tok")
    tok2.encode = lambda text, add_special_tokens=False: [5, 6]  # a tokenizer that splits every word
    with pytest.raises(ValueError, match="one token"):
        answer_token_ids(tok2)

"""ORM: the decision rule with hand-computed numbers, batched scoring == one at a time, examples, SFT training."""

from __future__ import annotations

import math

import pytest
import torch

from webrl_core.config import EmbeddedModelConfig, ModelsConfig, OrmConfig
from webrl_core.learn.models import load_tokenizer
from webrl_core.learn.embedded_model import build_embedded_model, train_embedded_tokenizer
from webrl_core.learn.orm import (OrmScorer, answer_sequences, answer_token_ids, evaluate_orm, official_orm_p_yes, orm_decision,
                            orm_examples_from_episodes, orm_prompt_for_episode, split_examples, train_orm)
from webrl_core.prompts import build_orm_prompt
from webrl_core.runs import loss_history

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
    history = loss_history.read(out)["history"]  # 40 epochs of one step each, a loss at every step
    assert loss_history.read(out)["training"] == "orm" and [h["step"] for h in history] == list(range(1, 41))
    assert history[-1]["loss"] < history[0]["loss"]
    after = evaluate_orm(OrmScorer(out, cfg, mcfg), ex)
    assert after["accuracy"] == 1.0 and after["precision"] == 1.0 and after["recall"] == 1.0
    assert after["n"] == 8 and after["tp"] == 4 and after["tn"] == 4
    assert before["n"] == 8 and before["accuracy"] < 1.0  # the untrained model cannot tell them apart


def test_official_single_token_rule_refuses_split_answers(tmp_path):
    train_embedded_tokenizer(["abc"], 300, tmp_path / "tok")
    tok = load_tokenizer(tmp_path / "tok")
    answer_token_ids(tok)  # ours: single tokens
    tok2 = load_tokenizer(tmp_path / "tok")
    tok2.encode = lambda text, add_special_tokens=False: {"YES": [5, 6], "NO": [7]}.get(text, [5])
    with pytest.raises(ValueError, match="one token"):
        answer_token_ids(tok2)
    tok2.encode = lambda text, add_special_tokens=False: [5, 6]  # both answers alike: nothing to score
    with pytest.raises(ValueError, match="two different"):
        answer_sequences(tok2)


@pytest.fixture(scope="module")
def splitting_model_dir(tmp_path_factory):
    """A tiny random Llama on SmolLM2's tokenizer, which splits "YES" into "Y" + "ES"."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from webrl_core.pretrained import setup_model

    tok = load_tokenizer(setup_model("smollm2-135m-instruct"))
    torch.manual_seed(3)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64,
                                         num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                                         bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                                         pad_token_id=tok.pad_token_id, tie_word_embeddings=True))
    out = tmp_path_factory.mktemp("split") / "model"
    model.save_pretrained(str(out))
    tok.save_pretrained(str(out))
    return out


def test_scores_answers_the_tokenizer_splits(splitting_model_dir):
    """P(YES) = p(YES|x) / (p(YES|x) + p(NO|x)) over the answers' whole token sequences; batched (KV cache, left
    padding) equals a brute-force forward of prompt + answer, one prompt at a time."""
    mcfg = ModelsConfig(max_length=512, dtype="float32")
    scorer = OrmScorer(splitting_model_dir, OrmConfig(batch_size=3), mcfg)
    assert len(scorer.yes_ids) == 2 and len(scorer.no_ids) == 1  # the case the official rule cannot score
    with pytest.raises(ValueError, match="splits 'YES' into 2 tokens"):
        answer_token_ids(scorer.tok)
    prompts = [build_orm_prompt(f"intent {i}", [OK] * i, "<p>x</p>" * (i * 5 + 1)) for i in range(5)]
    batched = scorer.p_yes(prompts)

    def seq_logprob(prompt_ids: list[int], answer: list[int]) -> float:
        ids = torch.tensor([prompt_ids + answer])
        with torch.no_grad():
            logp = torch.log_softmax(scorer.model(input_ids=ids).logits.float()[0], dim=-1)
        return sum(logp[len(prompt_ids) - 1 + j, t].item() for j, t in enumerate(answer))

    from webrl_core.learn.models import encode_prompt

    reference = []
    for p in prompts:
        ids = encode_prompt(scorer.tok, p, 512)
        reference.append(1 / (1 + math.exp(seq_logprob(ids, scorer.no_ids) - seq_logprob(ids, scorer.yes_ids))))
    assert batched == pytest.approx(reference, abs=1e-5)
    assert batched == pytest.approx(scorer.p_yes(prompts, batch_size=1), abs=1e-5)
    assert len({round(math.log(p / (1 - p)), 4) for p in batched}) > 1  # the prompt matters: not a constant

"""The WebRL actor loss by hand, exact action log-probs under left padding, and short real training runs."""

import dataclasses

import pytest
import torch
from transformers import TrainingArguments

from actor_samples import button_steps, per_token_logp
from webrl_core.config import ActorTrainConfig, EmbeddedModelConfig
from webrl_core.config_loader import load_config
from webrl_core.learn.critic import Critic, critic_examples
from webrl_core.learn.models import encode_prompt_action, left_pad, load_causal_lm, load_tokenizer
from webrl_core.learn.embedded_model import build_embedded_model, train_embedded_tokenizer
from webrl_core.prompts import build_prompt
from webrl_core.learn.critic_trainer import train_critic
from webrl_core.learn.sft_trainer import sft_train
from webrl_core.learn.trainer_utils import actor_micro_batches, critic_micro_batches
from webrl_core.learn.webrl_trainer import (WebRLConfig, action_logprobs, encode_samples, sequence_logprobs,
                                            train_actor, webrl_actor_loss)
from webrl_core.learn.transitions import build_transitions
from webrl_core.runs import loss_history

T = torch.tensor


def _loss(logp, ref, n, adv, mask, beta0, **kw):
    logp = T(logp, requires_grad=True)
    out, _ = webrl_actor_loss(logp, T(ref), T(n), T(adv), T(mask), T(beta0), **kw)
    out.backward()
    return out.item(), logp.grad.tolist()


def test_official_loss_by_hand():
    # sample 0: log_ratio = (-3.6 + 4)/4 = 0.1; beta = min(5, 1/0.1 = 10) = 5; Huber(0.5, 1) = 0.5*0.25 = 0.125; /5
    # sample 1: masked out -> 0. Mean over the batch of 2 -> 0.0125.
    loss, grad = _loss([-3.6, -5.0], [-4.0, -5.0], [4.0, 5.0], [1.0, -0.6], [1.0, 0.0], [5.0, 5.0])
    assert loss == pytest.approx(0.0125)
    # d/dlogp0 = (1/2) * (1/5) * (beta*lr - A) * beta / n = 0.5 * 0.2 * (-0.5) * 5 / 4
    assert grad == pytest.approx([-0.0625, 0.0])
    # beta cap: log_ratio = 2/4 = 0.5 -> beta = min(5, 2) = 2 -> beta*lr = 1 = A -> loss 0 (PPO-like clip)
    assert _loss([-2.0], [-4.0], [4.0], [1.0], [1.0], [5.0])[0] == pytest.approx(0.0)
    # Huber linear branch: log_ratio = -8/4 = -2, beta = min(1, 0.5) = 0.5, d = -1 - 1 = -2 -> 2 - 0.5 = 1.5; /0.5
    assert _loss([-12.0], [-4.0], [4.0], [1.0], [1.0], [1.0])[0] == pytest.approx(3.0)
    # actor == ref: log_ratio 0 keeps beta; Huber(0, 1)/1 = 0.5
    assert _loss([-4.0], [-4.0], [4.0], [1.0], [1.0], [1.0])[0] == pytest.approx(0.5)
    # count_norm="batch": divide by the batch's kept tokens (4 + 6): lr = 0.4/10 = 0.04 and 0
    loss_b, _ = _loss([-3.6, -6.0], [-4.0, -6.0], [4.0, 6.0], [1.0, 1.0], [1.0, 1.0], [1.0, 1.0],
                      count_norm="batch")
    assert loss_b == pytest.approx((0.5 * 0.96 ** 2 + 0.5) / 2)


def test_paper_and_sft_losses_by_hand():
    # sum: log_ratio = [1, -1], beta 0.5: ((0.5 - 0.45)^2 + (-0.5 + 0.2)^2)/2
    loss, _ = _loss([-3.0, -6.0], [-4.0, -5.0], [4.0, 5.0], [0.45, -0.2], [1.0, 1.0], [0.5, 0.5], loss="paper")
    assert loss == pytest.approx((0.05 ** 2 + 0.3 ** 2) / 2)
    # mean: log_ratio = [0.25, -0.2]: ((0.125 - 0.45)^2 + (-0.1 + 0.2)^2)/2
    loss, _ = _loss([-3.0, -6.0], [-4.0, -5.0], [4.0, 5.0], [0.45, -0.2], [1.0, 1.0], [0.5, 0.5], loss="paper",
                    paper_logratio="mean")
    assert loss == pytest.approx((0.325 ** 2 + 0.1 ** 2) / 2)
    # kl=False: token-mean NLL of the kept samples: (3 + 6)/(4 + 5)
    loss, grad = _loss([-3.0, -6.0], [-4.0, -5.0], [4.0, 5.0], [1.0, 1.0], [1.0, 1.0], [1.0, 1.0], kl=False)
    assert loss == pytest.approx(1.0) and grad == pytest.approx([-1 / 9, -1 / 9])


def test_webrl_config_takes_its_loss_fields_from_the_actor_section(tmp_path):
    """One definition: the Trainer's WebRL arguments are the actor section's loss fields (type, default, help),
    validated by the section, and filled from the resolved settings."""
    own = {f.name for f in dataclasses.fields(WebRLConfig)} - {f.name for f in dataclasses.fields(TrainingArguments)}
    assert own == set(ActorTrainConfig.LOSS_FIELDS)
    for f in dataclasses.fields(WebRLConfig):
        if f.name in own:
            src = ActorTrainConfig.model_fields[f.name]
            assert (f.type, f.default, f.metadata["help"]) == (src.annotation, src.default, src.description)
    settings = load_config(sets=["models.device=cpu", "actor.loss=paper", "actor.beta=0.5", "actor.count_norm=batch",
                                 "actor.lr=0.02", "actor.batch_size=4", "actor.grad_accum=2"])
    args = WebRLConfig.from_settings(settings, tmp_path)
    assert {n: getattr(args, n) for n in own} == settings.actor.model_dump(include=own)
    assert (args.learning_rate, args.per_device_train_batch_size, args.gradient_accumulation_steps) == (0.02, 1, 8)
    assert args.disable_tqdm  # progress is rich's (RichProgressCallback), not the Trainer's tqdm bar
    with pytest.raises(ValueError, match="count_norm"):
        WebRLConfig(output_dir=str(tmp_path), use_cpu=True, count_norm="tokens")


# ---------------------------------------------------------------------------------------------
# real tiny models

def _texts():
    return [build_prompt(f"open item {i}", [], f"<button id={i}>Open {i}</button>") + f'do(action="Click", element="{i}")'
            for i in range(40)]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("actor_models")
    train_embedded_tokenizer(_texts(), 400, root / "tok")
    out = {}
    for arch in ("llama", "gpt_neox"):
        cfg = EmbeddedModelConfig(vocab_size=400, hidden_size=48, intermediate_size=96, num_layers=2, num_heads=2,
                                  max_length=512, arch=arch)
        out[arch] = build_embedded_model(root / "tok", cfg, root / arch, seed=2)
        Critic.from_backbone(out[arch], 0.05, 256, device="cpu").save(root / f"critic_{arch}")  # untrained critic
        out[f"critic_{arch}"] = root / f"critic_{arch}"
    return out


def test_action_logprobs_match_unpadded_full_logits(tiny):
    settings = load_config(sets=["models.device=cpu"])
    tok = load_tokenizer(tiny["llama"])
    model = load_causal_lm(tiny["llama"], settings.models)
    pairs = [(build_prompt("open item 1", [], "<p>a</p>"), 'do(action="Click", element="1")'),
             (build_prompt("open item 22", ["r0"], "<button id=7>Open 7</button>"), "exit(message=\"done\")")]
    rows = [encode_prompt_action(tok, p, a, 256) for p, a in pairs]
    manual = []
    with torch.no_grad():
        for r in rows:
            ids = torch.tensor([r["input_ids"]])
            logp = torch.log_softmax(model(ids).logits[0, :-1].float(), -1)
            tgt = ids[0, 1:]
            am = torch.tensor(r["action_mask"][1:], dtype=torch.bool)
            manual.append(logp.gather(-1, tgt[:, None])[:, 0][am].sum().item())
        ids, mask = left_pad([r["input_ids"] for r in rows], tok.pad_token_id)
        n = torch.tensor([sum(r["action_mask"]) for r in rows])
        batched = action_logprobs(model, ids, mask, n).tolist()
    assert batched == pytest.approx(manual, abs=1e-4)
    enc = encode_samples(tok, [{"observation": p, "action": a} for p, a in pairs], 256)
    assert sequence_logprobs(model, enc, tok.pad_token_id, batch_size=2).tolist() == pytest.approx(manual, abs=1e-4)


def _samples():
    eps = []
    for e in range(4):
        ep = {"episode_id": f"s{e}", "success": True, "intent": f"open item {e}"}
        eps.append((ep, button_steps(ep["intent"], [f'do(action="Click", element="{e + k}")' for k in range(2)],
                                     [f"<button id={e + k}>Open</button>" for k in range(2)])))
    return build_transitions(eps)


def _check_loss_history(model_dir, training: str, stats: dict) -> None:
    """The saved model folder holds the training's loss history: one point per optimizer step of a short
    training (``LOGGING_STEPS``), the curve the trainer returned."""
    doc = loss_history.read(model_dir)
    assert doc is not None and doc["training"] == training and doc["global_step"] == stats["steps"]
    assert doc["logging_steps"] == 1 and [h["step"] for h in doc["history"]] == list(range(1, stats["steps"] + 1))
    assert [[h["step"], h["loss"]] for h in doc["history"]] == stats["loss_curve"]


def _settings(*extra):
    return load_config(sets=["models.device=cpu", "models.max_length=256", "actor.batch_size=4", "actor.lr=0.003",
                             "actor.epochs=10", *extra])


@pytest.mark.parametrize("arch", ["llama", "gpt_neox"])
def test_official_loss_raises_positive_actions_with_bounded_kl(tiny, tmp_path, arch):
    samples = _samples()
    settings = _settings()
    stats = train_actor(samples, tiny[arch], tmp_path / "a", settings, critic_dir=tiny[f"critic_{arch}"],
                        progress=False)
    assert stats["n_train"] == len(samples) == stats["n_positive"]  # successes: every step is positive
    _check_loss_history(tmp_path / "a", "actor", stats)
    before = per_token_logp(tiny[arch], samples, settings)
    after = per_token_logp(tmp_path / "a", samples, settings)
    ratio = (after - before).mean().item()
    assert ratio > 0.3, ratio  # the actions' log-prob rose
    # the KL-constrained target is A / beta = 1 nat per token (beta = 1 here, ref_prob << 0.8); the loss and its
    # gradient are exactly 0 beyond it, only AdamW's momentum carries it a little further (measured ~1.6 at
    # 15 and at 30 epochs with lr 3e-3, while plain SFT reached 5.2 and 5.8)
    assert ratio < 2.0, ratio
    if arch == "llama":  # the ablation without KL keeps pushing on the same data and budget
        train_actor(samples, tiny[arch], tmp_path / "sft", _settings("actor.kl=false"),
                    critic_dir=tiny[f"critic_{arch}"], progress=False)
        sft_ratio = (per_token_logp(tmp_path / "sft", samples, settings) - before).mean().item()
        assert sft_ratio > ratio + 1.0, (sft_ratio, ratio)
        # actor.beta_low = 5: the same unsure steps are pushed to A / 5 = 0.2 nat per token only
        train_actor(samples, tiny[arch], tmp_path / "b5", _settings("actor.beta_low=5"),
                    critic_dir=tiny[f"critic_{arch}"], progress=False)
        b5_ratio = (per_token_logp(tmp_path / "b5", samples, settings) - before).mean().item()
        print("per-token log-ratio: beta_low 1", ratio, "beta_low 5", b5_ratio, "no KL", sft_ratio)
        assert 0 < b5_ratio < ratio - 0.5, (b5_ratio, ratio)


def test_lora_paper_loss_and_saved_folders(tiny, tmp_path):
    samples = _samples()
    settings = _settings("models.lora.enabled=true", "models.lora.r=8", "actor.loss=paper", "actor.beta=0.5",
                         "actor.lr=0.02")
    stats = train_actor(samples, tiny["llama"], tmp_path / "a", settings, critic_dir=tiny["critic_llama"],
                        progress=False)
    assert stats["loss_mode"] == "paper" and stats["n_train"] == len(samples)
    assert (tmp_path / "a" / "adapter" / "adapter_config.json").exists()
    assert (tmp_path / "a" / "model.safetensors").exists()  # merged full weights
    before = per_token_logp(tiny["llama"], samples, settings)
    after = per_token_logp(tmp_path / "a", samples, settings)
    n = torch.tensor([r["n_action"] for r in encode_samples(load_tokenizer(tiny["llama"]), samples, 256)])
    seq_ratio = ((after - before) * n).mean().item()
    # Eq. 6 fits beta * sum-log-ratio to A (|A| <= 1 here, beta = 0.5): up, but not beyond about A / beta
    assert 0.2 < seq_ratio < 3.0, seq_ratio


def test_sft_bootstrap_learns_the_actions(tiny, tmp_path, capfd, monkeypatch):
    monkeypatch.delenv("WEBRL_VERBOSE", raising=False)
    samples = _samples()
    settings = load_config(sets=["models.device=cpu", "models.max_length=256", "actor.batch_size=4",
                                 "bootstrap.sft_lr=0.01", "bootstrap.sft_epochs=10"])
    stats = sft_train([(s["observation"], s["action"]) for s in samples], tiny["llama"], tmp_path / "sft", settings)
    assert stats["steps"] == 20
    _check_loss_history(tmp_path / "sft", "sft", stats)
    losses = [loss for _, loss in stats["loss_curve"]]
    assert losses[-1] < losses[0] / 2  # the curve shows the learning
    shown = capfd.readouterr()
    # one progress line of ours ("train sft ... 20/20 ... loss"), not the Trainer's printed log dicts or TRL's panel
    assert "train sft" in shown.out and "20/20" in shown.out
    assert "{'loss'" not in shown.out + shown.err and "Step 10" not in shown.out
    before = per_token_logp(tiny["llama"], samples, settings)
    after = per_token_logp(tmp_path / "sft", samples, settings)
    assert (after - before).mean().item() > 1.0
    with pytest.raises(ValueError, match="pair 0"):
        sft_train([("only a prompt",)], tiny["llama"], tmp_path / "x", settings)


def test_micro_batches_with_accumulation_take_the_same_step_as_one_batch(tiny, tmp_path):
    """actor.micro_batch_size only changes how a step is computed (CPU default 1: no padding), not the step."""
    samples = _samples()  # 8 positive samples of two lengths: one optimizer step of batch 8
    weights = {}
    for micro in (8, 1):
        settings = _settings("actor.batch_size=8", f"actor.micro_batch_size={micro}", "actor.lr=0.01")
        assert actor_micro_batches(settings) == (micro, 8 // micro)
        train_actor(samples, tiny["llama"], tmp_path / f"m{micro}", settings, critic_dir=tiny["critic_llama"],
                    max_steps=1, progress=False)
        weights[micro] = load_causal_lm(tmp_path / f"m{micro}", settings.models).state_dict()
    start = load_causal_lm(tiny["llama"], settings.models).state_dict()
    moved = max((weights[8][k] - start[k]).abs().max().item() for k in start)
    assert moved > 1e-3  # the step did something
    for k in start:
        assert torch.allclose(weights[8][k], weights[1][k], atol=1e-5), k
    assert actor_micro_batches(_settings("models.device=cpu")) == (1, 4)  # the CPU default
    with pytest.raises(ValueError, match="actor.micro_batch_size=3 must divide actor.batch_size=4"):
        actor_micro_batches(_settings("actor.micro_batch_size=3"))


def test_critic_micro_batches_with_accumulation_take_the_same_step_as_one_batch(tiny, tmp_path):
    """critic.micro_batch_size changes how the weighted step is computed, not the step: each micro-batch's loss is
    its share of the whole step's weighted mean (a per-micro-batch mean would weight prompts differently)."""
    samples = _samples()
    for s in samples[::2]:
        s["mc_return"] = 0.0  # both labels; prompts seen as s and s' weigh 2, the others 1
    n = len(critic_examples(samples))  # one optimizer step over every distinct prompt, whatever the order
    assert len({e["weight"] for e in critic_examples(samples)}) == 2
    weights = {}
    for micro in (n, 1):
        settings = _settings(f"critic.batch_size={n}", f"critic.micro_batch_size={micro}", "critic.lr=0.01")
        assert critic_micro_batches(settings) == (micro, n // micro)
        train_critic(samples, tiny["llama"], tmp_path / f"c{micro}", settings, max_steps=1)
        weights[micro] = Critic.load(tmp_path / f"c{micro}", device="cpu").state_dict()
    start = Critic.from_backbone(tiny["llama"], 0.2, 256, device="cpu", seed=0).state_dict()
    assert max((weights[n][k] - start[k]).abs().max().item() for k in start) > 1e-3  # the step did something
    for k in start:
        assert torch.allclose(weights[n][k], weights[1][k], atol=1e-5), k
    assert critic_micro_batches(_settings())[0] == 1  # the CPU default


def test_a_replayed_steps_reference_is_its_replay_score_and_equals_the_recomputed_one(tiny, tmp_path):
    """One pass serves the replay's 1/PPL and the actor's reference: a step with a ``rank_score`` (computed by the
    replay stage under the same phase-start actor) enters the reference columns as n log(1/PPL), and that is what
    the reference pass computes for it (float32 here, so equal to 1e-5)."""
    from webrl_core.learn.replay import inverse_perplexity

    settings = _settings("actor.epochs=1")
    samples = _samples()
    tok = load_tokenizer(tiny["llama"])
    model = load_causal_lm(tiny["llama"], settings.models)
    replayed = samples[4:]
    scores = inverse_perplexity(model, tok, [(s["observation"], s["action"]) for s in replayed], 256)
    mixed = samples[:4] + [dict(s, rank_score=r) for s, r in zip(replayed, scores)]
    kw = dict(critic_dir=tiny["critic_llama"], progress=False, max_steps=1)
    reused = train_actor(mixed, tiny["llama"], tmp_path / "reused", settings, **kw)
    recomputed = train_actor(mixed, tiny["llama"], tmp_path / "recomputed",
                             _settings("actor.epochs=1", "actor.reuse_replay_logprobs=false"), **kw)
    assert reused["n_ref_from_replay"] == len(replayed) and recomputed["n_ref_from_replay"] == 0
    assert reused["mean_ref_prob"] == pytest.approx(recomputed["mean_ref_prob"], abs=1e-5)
    wrong = train_actor(samples[:4] + [dict(s, rank_score=0.5) for s in replayed], tiny["llama"], tmp_path / "wrong",
                        settings, **kw)  # the score is what is used: a made-up one moves the mean
    n = len(samples)
    assert wrong["mean_ref_prob"] == pytest.approx(recomputed["mean_ref_prob"]
                                                   + (0.5 * len(replayed) - sum(scores)) / n, abs=1e-5)

"""M-GRPO (``actor.loss: grpo``, webrl_core/learn/grpo.py): the group advantages and the clipped loss by hand,
the loss against TRL 1.16's own ``GRPOTrainer._compute_loss`` (values, gradients, and one optimizer step's
gradient under accumulation through our Trainer), and ``train_actor`` end to end without a critic."""

import math
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch
from trl import GRPOTrainer

from actor_samples import button_steps, per_token_logp
from webrl_core.config import EmbeddedModelConfig
from webrl_core.config_loader import load_config
from webrl_core.learn import grpo
from webrl_core.learn.grpo import episode_advantages, group_advantages, grpo_loss
from webrl_core.learn.models import load_causal_lm, load_tokenizer
from webrl_core.learn.embedded_model import build_embedded_model, train_embedded_tokenizer
from webrl_core.learn.transitions import build_transitions
from webrl_core.learn.webrl_trainer import (ActorCollator, WebRLConfig, WebRLTrainer, action_token_logprobs,
                                            encode_samples, sequence_logprobs, train_actor)
from webrl_core.prompts import build_prompt

EPS = 1e-4
LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo")


# ---------------------------------------------------------------------------------------------
# group advantages

def test_group_advantages_by_hand():
    rewards = [1, 0, 0, 1, 1, 1, 1, 1]
    groups = ["a", "a", "a", "a", "b", "b", "b", "c"]  # a: mixed; b: uniform; c: a singleton
    adv, stats = group_advantages(rewards, groups)
    std_a = math.sqrt(4 * 0.25 / 3)  # Bessel: sum of squared deviations / (n - 1)
    a = 0.5 / (std_a + EPS)
    assert adv.tolist() == pytest.approx([a, -a, -a, a, 0, 0, 0, 0], abs=1e-6)
    assert stats == {"n_groups": 3, "n_uniform_groups": 2, "n_singleton_groups": 1,
                     "mean_abs_adv": pytest.approx(4 * a / 8, abs=1e-6)}
    # batch: the group-centred reward over the std of all eight rewards (mean 0.75: 6 x 0.25^2 + 2 x 0.75^2 = 1.5)
    adv, _ = group_advantages(rewards, groups, "batch")
    b = 0.5 / (math.sqrt(1.5 / 7) + EPS)
    assert adv.tolist() == pytest.approx([b, -b, -b, b, 0, 0, 0, 0], abs=1e-6)
    adv, _ = group_advantages(rewards, groups, "none")
    assert adv.tolist() == pytest.approx([0.5, -0.5, -0.5, 0.5, 0, 0, 0, 0])
    # rewards that are not 0/1: group of three 0.2, 0.5, 1.1 (mean 0.6, deviations -0.4, -0.1, 0.5)
    adv, stats = group_advantages([0.2, 0.5, 1.1], [7, 7, 7])
    s = math.sqrt((0.16 + 0.01 + 0.25) / 2)
    assert adv.tolist() == pytest.approx([-0.4 / (s + EPS), -0.1 / (s + EPS), 0.5 / (s + EPS)], abs=1e-6)
    assert stats["n_uniform_groups"] == stats["n_singleton_groups"] == 0
    with pytest.raises(ValueError, match="scale_rewards"):
        group_advantages([1], ["a"], "token")


def test_episode_advantages_give_every_step_its_episode_advantage():
    def steps(eid, task, phase, reward, n):
        return [{"episode_id": eid, "task": task, "phase": phase, "trajectory_reward": reward, "step_idx": k}
                for k in range(n)]
    # task "t" in phase 1: rewards 1, 0 (A = +-0.5 / (std + eps)); the same task in phase 2 is its own group (uniform)
    samples = steps("e1", "t", 1, 1.0, 3) + steps("e2", "t", 1, 0.0, 2) + steps("e3", "t", 2, 1.0, 1)
    adv, stats = episode_advantages(samples)
    a = 0.5 / (math.sqrt(0.5) + EPS)
    assert adv.tolist() == pytest.approx([a] * 3 + [-a] * 2 + [0.0], abs=1e-6)
    assert stats["n_groups"] == 2 and stats["n_singleton_groups"] == 1 and stats["n_episodes"] == 3
    with pytest.raises(ValueError, match="e1"):
        episode_advantages(steps("e1", "t", 1, 1.0, 1) + steps("e1", "t", 1, 0.0, 1))


# ---------------------------------------------------------------------------------------------
# the loss by hand

def _case():
    """Two samples, k = 3 action columns, the second left padded (2 action tokens). Row 0: A = +1, ratios 1, 1.5,
    0.5; row 1: A = -0.5, ratios 0.7, 1.4. Reference log-ratios ref - logp: 0, ln 2, -ln 2 and 0.5, -0.5."""
    logp = torch.tensor([[-1.0, -2.0, -0.5], [-9.0, -1.5, -0.7]])
    log_ratio = torch.tensor([[0.0, math.log(1.5), math.log(0.5)], [0.0, math.log(0.7), math.log(1.4)]])
    ref = logp + torch.tensor([[0.0, math.log(2), -math.log(2)], [3.0, 0.5, -0.5]])
    mask = torch.tensor([[1, 1, 1], [0, 1, 1]])
    return logp, logp - log_ratio, ref, torch.tensor([1.0, -0.5]), mask


def _kl(d):
    return math.exp(d) - d - 1


def test_grpo_loss_by_hand_for_each_loss_type():
    logp, old, ref, adv, mask = _case()
    # clipped surrogate, eps 0.2: row 0 -min(r, clip(r)) = -1, -1.2 (clipped), -0.5; row 1 -min(-r/2, -clip/2) =
    # max(r, clip)/2 = 0.4 (clipped at 0.8), 0.7
    row0, row1 = [-1.0, -1.2, -0.5], [0.4, 0.7]
    expected = {"grpo": (sum(row0) / 3 + sum(row1) / 2) / 2, "bnpo": (sum(row0) + sum(row1)) / 5,
                "dr_grpo": (sum(row0) + sum(row1)) / (2 * 4), "dapo": (sum(row0) + sum(row1)) / 10}
    for loss_type, value in expected.items():
        got, stats = grpo_loss(logp, old, ref, adv, mask, 0.0, 0.2, 0.2, loss_type, 4, num_items_in_batch=10)
        assert got.item() == pytest.approx(value, abs=1e-6), loss_type
    # clipped tokens: 1.5 with A > 0 and 0.7 with A < 0 (0.5 with A > 0 and 1.4 with A < 0 are not clipped)
    assert stats["clip_fraction"] == pytest.approx(2 / 5)
    assert stats["ratio"] == pytest.approx((1 + 1.5 + 0.5 + 0.7 + 1.4) / 5)
    kl0, kl1 = [_kl(0), _kl(math.log(2)), _kl(-math.log(2))], [_kl(0.5), _kl(-0.5)]
    assert stats["kl"] == pytest.approx((sum(kl0) + sum(kl1)) / 5, abs=1e-6)  # the padded column is not counted
    # beta = 0.1 adds 0.1 x k3 per token
    r0 = [a + 0.1 * b for a, b in zip(row0, kl0)]
    r1 = [a + 0.1 * b for a, b in zip(row1, kl1)]
    got, _ = grpo_loss(logp, old, ref, adv, mask, 0.1, 0.2, 0.2, "grpo", 4)
    assert got.item() == pytest.approx((sum(r0) / 3 + sum(r1) / 2) / 2, abs=1e-6)
    got, _ = grpo_loss(logp, old, ref, adv, mask, 0.1, 0.2, 0.2, "bnpo", 4)
    assert got.item() == pytest.approx((sum(r0) + sum(r1)) / 5, abs=1e-6)
    # asymmetric clip (DAPO's eps_high 0.28 > 0.5 - 1): 1.5 still clipped, now at 1.28
    got, _ = grpo_loss(logp, old, ref, adv, mask, 0.0, 0.2, 0.28, "bnpo", 4)
    assert got.item() == pytest.approx((-1 - 1.28 - 0.5 + 0.4 + 0.7) / 5, abs=1e-6)
    with pytest.raises(ValueError, match="num_items_in_batch"):
        grpo_loss(logp, old, ref, adv, mask, 0.0, 0.2, 0.2, "dapo", 4)


def test_grpo_loss_gradient_by_hand():
    logp, old, ref, adv, mask = _case()
    logp.requires_grad_(True)
    grpo_loss(logp, old, ref, adv, mask, 0.0, 0.2, 0.2, "grpo", 4)[0].backward()
    # unclipped tokens: d(-r A)/d logp = -r A, over (tokens of the row x 2 rows); clipped ones: 0
    base = torch.tensor([[-1 / 6, 0.0, -0.5 / 6], [0.0, 0.0, 0.7 / 4]])
    assert torch.allclose(logp.grad, base, atol=1e-6), logp.grad
    logp.grad = None
    grpo_loss(logp, old, ref, adv, mask, 0.1, 0.2, 0.2, "grpo", 4)[0].backward()
    d = ref - logp.detach()  # d k3 / d logp = 1 - exp(ref - logp)
    kl_grad = 0.1 * (1 - torch.exp(d)) * mask / torch.tensor([[6.0], [4.0]])
    assert torch.allclose(logp.grad, base + kl_grad, atol=1e-6), logp.grad


def test_ratio_is_one_and_gradient_is_the_policy_gradient_on_policy():
    """num_iterations = 1 before any update: logp == old, ratio exactly 1, gradient -A / n per token (the policy
    gradient of the per-action token mean), for every clip range."""
    logp = torch.tensor([[-1.0, -2.0], [-0.3, -0.4]], requires_grad=True)
    adv = torch.tensor([2.0, -1.0])
    loss, stats = grpo_loss(logp, logp.detach(), logp.detach(), adv, torch.ones(2, 2), 0.04, 0.2, 0.2, "grpo", 8)
    loss.backward()
    assert stats["ratio"] == 1.0 and stats["clip_fraction"] == 0.0 and stats["kl"] == 0.0
    assert torch.equal(logp.grad, torch.tensor([[-2 / 4, -2 / 4], [1 / 4, 1 / 4]]))


# ---------------------------------------------------------------------------------------------
# against TRL 1.16's GRPOTrainer._compute_loss

class TRLStandIn:
    """The attributes ``GRPOTrainer._compute_loss`` reads, for one process, no vLLM, no entropy masking or bonus,
    token-level importance sampling; ``logps(input_ids, attention_mask)`` gives the policy's per-token log-probs."""

    def __init__(self, logps, beta, loss_type, epsilon_low, epsilon_high, max_completion_length, grad_accum=1):
        self.logps = logps
        self.beta, self.loss_type = beta, loss_type
        self.epsilon_low, self.epsilon_high = epsilon_low, epsilon_high
        self.max_completion_length = max_completion_length
        self.top_entropy_quantile = 1.0
        self.importance_sampling_level = "token"
        self.off_policy_mask_threshold = None
        self.use_vllm = self.vllm_importance_sampling_correction = False
        self.aux_loss_enabled = self._entropy_bonus_enabled = False
        self.model = SimpleNamespace(training=True)
        self.current_gradient_accumulation_steps = grad_accum
        self.accelerator = SimpleNamespace(num_processes=1, sync_gradients=True, gather=lambda t: t,
                                           gather_for_metrics=lambda t: t, reduce=lambda t, reduction="sum": t)
        # TRL's default: one generation batch per optimizer step
        self.args = SimpleNamespace(delta=None, use_bias_correction_kl=False, steps_per_generation=grad_accum)
        self._metrics = {"train": defaultdict(list), "eval": defaultdict(list)}

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, **kw):
        logps = self.logps(input_ids, attention_mask)
        assert logps.shape[1] == logits_to_keep
        return logps, torch.zeros_like(logps), None


def _trl_inputs(input_ids, attention_mask, mask, adv, old, ref, num_items):
    k = mask.shape[1]
    return {"prompt_ids": input_ids[:, :-k], "prompt_mask": attention_mask[:, :-k],
            "completion_ids": input_ids[:, -k:], "completion_mask": mask.long(), "advantages": adv,
            "old_per_token_logps": old, "ref_per_token_logps": ref, "num_items_in_batch": torch.tensor(num_items)}


@pytest.mark.parametrize("beta", [0.0, 0.04])
@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_grpo_loss_matches_trl_compute_loss(loss_type, beta):
    g = torch.Generator().manual_seed(3)
    B, k, L = 4, 5, 8
    logp0 = -torch.rand(B, k, generator=g) * 3
    old = logp0 + 0.4 * torch.randn(B, k, generator=g)   # ratios well outside [0.8, 1.28]: clipping active
    ref = logp0 + 0.3 * torch.randn(B, k, generator=g)
    n = torch.tensor([5, 3, 1, 4])
    mask = torch.arange(k).unsqueeze(0) >= (k - n).unsqueeze(1)
    adv = torch.tensor([1.2, -0.7, 0.4, -1.5])
    ours_logp = logp0.clone().requires_grad_(True)
    ours, stats = grpo_loss(ours_logp, old, ref, adv, mask, beta, 0.2, 0.28, loss_type, L,
                            num_items_in_batch=int(n.sum()))
    ours.backward()
    trl_logp = logp0.clone().requires_grad_(True)
    standin = TRLStandIn(lambda ids, att: trl_logp, beta, loss_type, 0.2, 0.28, L)
    ids = torch.zeros(B, k + 2, dtype=torch.long)
    att = torch.cat([torch.ones(B, 2, dtype=torch.long), mask.long()], 1)
    theirs = GRPOTrainer._compute_loss(standin, None, _trl_inputs(ids, att, mask, adv, old, ref, int(n.sum())))
    theirs.backward()
    assert ours.item() == pytest.approx(theirs.item(), rel=1e-6, abs=1e-7)
    assert torch.allclose(ours_logp.grad, trl_logp.grad, atol=1e-7)
    assert stats["clip_fraction"] == pytest.approx(standin._metrics["train"]["clip_ratio/region_mean"][0])
    assert 0 < stats["clip_fraction"] < 1
    if beta:
        assert stats["kl"] == pytest.approx(standin._metrics["train"]["kl"][0], rel=1e-5)


# ---------------------------------------------------------------------------------------------
# a tiny model: one optimizer step's gradient under accumulation, and train_actor end to end

def _texts():
    return [build_prompt(f"open item {i}", [], f"<button id={i}>Open {i}</button>")
            + f'do(action="Click", element="{i}")' for i in range(40)]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("grpo_models")
    train_embedded_tokenizer(_texts(), 400, root / "tok")
    cfg = EmbeddedModelConfig(vocab_size=400, hidden_size=48, intermediate_size=96, num_layers=2, num_heads=2,
                              max_length=512, arch="llama")
    return build_embedded_model(root / "tok", cfg, root / "llama", seed=2)


def _episodes(tasks=3, per_task=4, uniform_task=True):
    """``per_task`` rollouts of each task (one phase), 1-2 steps; successes alternate within a task, the last task
    all successful when ``uniform_task``."""
    eps = []
    for t in range(tasks):
        for r in range(per_task):
            ok = True if uniform_task and t == tasks - 1 else r % 2 == 0
            ep = {"episode_id": f"t{t}r{r}", "success": ok, "intent": f"open item {t}", "phase": 1}
            resp = f'do(action="Click", element="{t + (0 if ok else 7 + r)}")'
            eps.append((ep, button_steps(ep["intent"], [resp] * (1 + r % 2), f"<button id={t}>Open</button>")))
    return build_transitions(eps)


def _settings(*extra):
    return load_config(sets=["models.device=cpu", "models.max_length=256", "actor.batch_size=4", "actor.lr=0.003",
                             "actor.loss=grpo", "actor.beta=0", "curriculum.rollouts_per_task=4", *extra])


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_accumulated_step_gradient_matches_trl(tiny, tmp_path, loss_type):
    """Two micro-batches of 2 through ``WebRLTrainer.training_step`` (the Trainer's accumulation scaling, our
    ``num_items_in_batch``) accumulate the gradient TRL's ``_compute_loss`` gives for the same optimizer step."""
    tok = load_tokenizer(tiny)
    model = load_causal_lm(tiny, load_config(sets=["models.device=cpu"]).models, trainable=True)
    samples = _episodes(tasks=2, per_task=2, uniform_task=False)[:4]
    rows = encode_samples(tok, samples, 256)
    ref_tokens = sequence_logprobs(model, rows, tok.pad_token_id, 4, per_token=True)
    g = torch.Generator().manual_seed(0)
    for j, r in enumerate(rows):  # an older policy than the current one: ratios away from 1, clipping active
        r.update(ref_token_logps=[x + 0.3 * float(torch.randn(1, generator=g)) for x in ref_tokens[j]],
                 adv=[1.0, -0.5, 0.8, -1.2][j])
    args = WebRLConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", remove_unused_columns=False,
                       per_device_train_batch_size=2, gradient_accumulation_steps=2, loss="grpo",
                       loss_type=loss_type, beta=0.04, epsilon_high=0.28)
    trainer = WebRLTrainer(model=model, args=args, data_collator=ActorCollator(tok.pad_token_id),
                           max_completion_length=16)
    batches = [trainer.data_collator(rows[:2]), trainer.data_collator(rows[2:])]
    trainer.current_gradient_accumulation_steps = 2
    num_items = trainer._get_num_items_in_batch(batches, torch.device("cpu"))
    model.zero_grad()
    for b in batches:
        trainer.training_step(model, b, num_items)
    ours = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    model.zero_grad()
    total = sum(int(b["n_action"].sum()) for b in batches)
    for b in batches:
        keep = action_token_logprobs(model, b["input_ids"], b["attention_mask"], b["n_action"])[1]
        # TRL's attention mask is prompt_mask + completion_mask; ours left pads, so the batch's own mask is the
        # same sequence (the completion columns before a short action are prompt tokens, not padding)
        standin = TRLStandIn(lambda ids, att, b=b: action_token_logprobs(model, ids, b["attention_mask"],
                                                                         b["n_action"])[0],
                             0.04, loss_type, 0.2, 0.28, 16, grad_accum=2)
        ref = b["ref_token_logps"]
        loss = GRPOTrainer._compute_loss(standin, model, _trl_inputs(b["input_ids"], b["attention_mask"], keep,
                                                                     b["adv"], ref, ref, total))
        loss.backward()  # TRL's loss is already scaled for accumulation (its loss_is_scaled_for_ga = True)
    assert ours and ours.keys() == {n for n, p in model.named_parameters() if p.grad is not None}
    for n, p in model.named_parameters():
        if p.grad is not None:
            assert torch.allclose(ours[n], p.grad, rtol=1e-4, atol=1e-7), n
    assert max(v.abs().max().item() for v in ours.values()) > 1e-4  # a real gradient


def test_train_actor_grpo_without_critic(tiny, tmp_path, monkeypatch):
    samples = _episodes()
    first = []
    original = grpo.grpo_loss

    def recording(per_token_logps, old, *a, **kw):
        if not first:
            first.append((per_token_logps.detach().clone(), old.clone(), a[2].clone()))
        return original(per_token_logps, old, *a, **kw)

    monkeypatch.setattr(grpo, "grpo_loss", recording)
    settings = _settings("actor.micro_batch_size=1", "actor.epochs=2")
    stats = train_actor(samples, tiny, tmp_path / "a", settings, critic_dir=None, progress=False)
    # tasks 0, 1: two successes and two failures each; task 2: all successes (uniform, A = 0, dropped at beta 0)
    assert stats["loss_mode"] == "grpo" and stats["mean_v"] == 0.0 and stats["critic_s"] == 0.0
    assert (stats["n_groups"], stats["n_uniform_groups"], stats["n_singleton_groups"]) == (3, 1, 0)
    n_uniform = sum(s["task"] == "open item 2" for s in samples)
    assert stats["n_train"] == len(samples) - n_uniform and stats["n_samples"] == len(samples)
    a = 0.5 / (math.sqrt(4 * 0.25 / 3) + EPS)
    assert stats["mean_abs_adv"] == pytest.approx(8 * a / 12, abs=1e-5)
    assert 0 <= stats["clip_fraction"] <= 1 and stats["ratio"] > 0 and stats["steps"] == 12 // 4 * 2
    # the first micro-batch: the phase-start actor itself, so the ratio is exactly 1 on every action token
    logp, old, mask = first[0]
    assert torch.equal(torch.exp(logp - old)[mask], torch.ones(int(mask.sum())))
    after = load_causal_lm(tmp_path / "a", settings.models).state_dict()
    start = load_causal_lm(tiny, settings.models).state_dict()
    assert max((after[k] - start[k]).abs().max().item() for k in start) > 1e-3
    # the successes' actions became likelier than the failures' (per token, relative to the start)
    trained = [s for s in samples if s["task"] != "open item 2"]
    rise = per_token_logp(tmp_path / "a", trained, settings) - per_token_logp(tiny, trained, settings)
    won = torch.tensor([s["trajectory_reward"] > 0 for s in trained])
    assert rise[won].mean() > rise[~won].mean() + 0.1, (rise[won].mean(), rise[~won].mean())


def test_train_actor_grpo_keeps_zero_advantage_samples_for_the_kl_and_counts_dapo_tokens(tiny, tmp_path):
    samples = _episodes()
    stats = train_actor(samples, tiny, tmp_path / "kl", _settings("actor.beta=0.04", "actor.loss_type=dapo",
                                                                  "actor.num_iterations=2"),
                        critic_dir=None, max_steps=2, progress=False)
    assert stats["n_train"] == stats["n_samples"] == len(samples)  # beta > 0: the uniform task's steps stay
    assert stats["steps"] == 2 and stats["epochs"] == 2.0 and stats["kl"] >= 0
    assert stats["n_positive"] == sum(1 for s in samples if s["trajectory_reward"] > 0 and s["task"] != "open item 2")


def test_grpo_collator_right_aligns_the_reference_tokens(tiny):
    tok = load_tokenizer(tiny)
    rows = encode_samples(tok, _episodes(tasks=1, per_task=2, uniform_task=False)[:2], 256)
    rows[0]["n_action"], rows[1]["n_action"] = 3, 2
    rows[0].update(ref_token_logps=[-1.0, -2.0, -3.0], adv=1.0)
    rows[1].update(ref_token_logps=[-4.0, -5.0], adv=-1.0)
    batch = ActorCollator(tok.pad_token_id)(rows)
    assert batch["ref_token_logps"].tolist() == [[-1.0, -2.0, -3.0], [0.0, -4.0, -5.0]]
    assert set(batch) == {"input_ids", "attention_mask", "n_action", "adv", "ref_token_logps"}


def test_grpo_needs_episode_fields(tiny, tmp_path):
    samples = _episodes()
    del samples[0]["trajectory_reward"]
    with pytest.raises(ValueError, match="trajectory_reward"):
        train_actor(samples, tiny, tmp_path / "x", _settings(), critic_dir=None, progress=False)
    with pytest.raises(ValueError, match="critic_dir is required"):
        train_actor(_episodes(), tiny, tmp_path / "x", _settings("actor.loss=official"), progress=False)


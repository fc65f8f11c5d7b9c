"""Multi-turn GRPO (M-GRPO) for the actor, ``actor.loss: grpo``: WebAgent-R1 (arXiv 2505.16421), whose trainer
subclasses TRL's ``GRPOTrainer``; the equations below are those of TRL 1.16 (``trl/trainer/grpo_trainer.py``:
the advantages in ``GRPOTrainer._generate_and_score_completions``, the loss in ``GRPOTrainer._compute_loss``).

WebAgent-R1 samples a group of trajectories per task and gives the trajectory's group-normalised outcome reward to
every token of every turn's action. Here a sample is ONE step (a prompt and the action the actor wrote;
``transitions.py``), an episode j is several samples, and the group g(j) is the task: the episodes of the same
(phase, task), ``curriculum.rollouts_per_task`` of them. With R_j the episode's outcome (``trajectory_reward``, 1/0)::

    A_j = (R_j - mean_{g(j)} R) / (std_{g(j)} R + eps)      scale_rewards="group" (std with Bessel's correction,
                                                              TRL's ``nanstd``; eps = 1e-4)
    A_j = (R_j - mean_{g(j)} R) / (std_all R + eps)          scale_rewards="batch" (std over every episode)
    A_j =  R_j - mean_{g(j)} R                               scale_rewards="none" (Dr. GRPO)

and every step of episode j carries A_j. A group whose episodes share one outcome (all R equal; a group of one
episode too) gives A = 0 for all its episodes: it carries no signal (``group_advantages`` counts such groups).

Per action token t of sample i (pi_old: the policy that acted; pi_ref: the KL reference; both are the phase-start
actor here, so old and ref log-probs are one precomputed column)::

    r_it  = exp(log pi_theta(a_it) - log pi_old(a_it))
    l_it  = -min(r_it A_i, clip(r_it, 1 - eps_low, 1 + eps_high) A_i) + beta * KL_it
    KL_it = exp(ref_it - logp_it) - (ref_it - logp_it) - 1           (k3 estimator; only when beta != 0)

aggregated over the micro-batch's B samples with the action mask m (``loss_type``)::

    grpo     mean_i ( sum_t l_it m_it / sum_t m_it )                  per action, then over the batch
    bnpo     sum_it l_it m_it / sum_it m_it                           over the micro-batch's action tokens
    dr_grpo  sum_it l_it m_it / (B * L_max)                           L_max = policy.max_new_tokens
    dapo     sum_it l_it m_it / N                                     N = the action tokens of the whole
                                                                      optimizer step (all micro-batches, all ranks)

Gradient accumulation as TRL does it: grpo, bnpo and dr_grpo are divided by the accumulation steps (the Trainer does
that for ours); dapo is not, and TRL divides by N / num_processes instead, so the ranks' averaged gradient is that
of the step's token sum over N (``WebRLTrainer`` passes that normaliser).

Before the first update r = 1 exactly, so the first step's gradient is the policy gradient sum_t A_i grad log
pi_theta (plus the KL's, which is 0 there too). TRL samples afresh for every optimizer step, so with
``num_iterations`` = 1 its ratio stays 1; a phase's rollouts here feed all of the phase's optimizer steps
(``num_iterations`` passes over them), and r is the correction against the policy that acted, clipped as in PPO.
"""

from __future__ import annotations

import torch

SCALE_REWARDS = ("group", "batch", "none")
LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo")


def _unbiased_std(x: torch.Tensor) -> torch.Tensor:
    """Standard deviation with Bessel's correction (TRL's ``nanstd``); 0 for fewer than two values."""
    return x.std(unbiased=True) if x.numel() > 1 else torch.zeros((), dtype=x.dtype)


def group_advantages(rewards, groups, scale_rewards: str = "group", eps: float = 1e-4) -> tuple[torch.Tensor, dict]:
    """Group-normalised advantages of episodes (module docstring): ``rewards[j]`` is episode j's outcome R_j,
    ``groups[j]`` any hashable naming its group. Returns (A per episode, float32, and stats): ``n_groups``,
    ``n_uniform_groups`` (every R of the group equal, singletons included: A = 0 there), ``n_singleton_groups``,
    ``mean_abs_adv`` (over episodes)."""
    if scale_rewards not in SCALE_REWARDS:
        raise ValueError(f"scale_rewards={scale_rewards!r}; allowed: {', '.join(SCALE_REWARDS)}")
    r = torch.as_tensor([float(x) for x in rewards], dtype=torch.float32)
    groups = list(groups)
    if len(groups) != len(r):
        raise ValueError(f"group_advantages: {len(r)} rewards but {len(groups)} group keys")
    members: dict = {}
    for j, g in enumerate(groups):
        members.setdefault(g, []).append(j)
    adv = torch.zeros_like(r)
    batch_std = _unbiased_std(r)
    n_uniform = n_singleton = 0
    for idx in members.values():
        rg = r[idx]
        n_singleton += len(idx) == 1
        if bool((rg == rg[0]).all()):  # one outcome: no signal (set exactly, not left to rounding)
            n_uniform += 1
            continue
        centred = rg - rg.mean()
        if scale_rewards == "group":
            centred = centred / (_unbiased_std(rg) + eps)
        elif scale_rewards == "batch":
            centred = centred / (batch_std + eps)
        adv[idx] = centred
    stats = {"n_groups": len(members), "n_uniform_groups": n_uniform, "n_singleton_groups": n_singleton,
             "mean_abs_adv": float(adv.abs().mean()) if len(adv) else 0.0}
    return adv, stats


def episode_advantages(samples: list[dict], scale_rewards: str = "group") -> tuple[torch.Tensor, dict]:
    """A per step sample: its episode's group advantage (``group_advantages`` over ``trajectory_reward``, the
    episodes grouped by (phase, task), WebAgent-R1's trajectory-level advantage on every turn)."""
    episode_of: dict = {}
    for i, s in enumerate(samples):
        ep = episode_of.setdefault(s["episode_id"], {"reward": float(s["trajectory_reward"]),
                                                     "group": (s.get("phase"), s["task"]), "rows": []})
        if float(s["trajectory_reward"]) != ep["reward"] or (s.get("phase"), s["task"]) != ep["group"]:
            raise ValueError(f"episode {s['episode_id']!r}: its steps disagree on trajectory_reward, phase or task")
        ep["rows"].append(i)
    episodes = list(episode_of.values())
    adv_ep, stats = group_advantages([e["reward"] for e in episodes], [e["group"] for e in episodes], scale_rewards)
    adv = torch.zeros(len(samples), dtype=torch.float32)
    for e, a in zip(episodes, adv_ep):
        adv[e["rows"]] = a
    return adv, stats | {"n_episodes": len(episodes)}


def grpo_loss(per_token_logps: torch.Tensor, old_per_token_logps: torch.Tensor, ref_per_token_logps: torch.Tensor,
              advantages: torch.Tensor, mask: torch.Tensor, beta: float, epsilon_low: float, epsilon_high: float,
              loss_type: str, max_completion_length: int | None, num_items_in_batch=None) -> tuple[torch.Tensor, dict]:
    """The clipped GRPO loss of one micro-batch (module docstring) on [B, k] per-token log-probs and action mask,
    before any gradient-accumulation scaling; returns (loss, detached stats: ``ratio`` (mean over action tokens),
    ``clip_fraction`` (tokens whose clip is active: r below 1 - eps_low with A < 0 or above 1 + eps_high with
    A > 0, TRL's clip_ratio/region_mean), ``kl`` (mean k3 KL to the reference))."""
    if loss_type not in LOSS_TYPES:
        raise ValueError(f"loss_type={loss_type!r}; allowed: {', '.join(LOSS_TYPES)}")
    mask = mask.to(per_token_logps.dtype)
    old = old_per_token_logps.to(per_token_logps)
    adv = advantages.to(per_token_logps)
    adv = adv.unsqueeze(1) if adv.dim() == 1 else adv
    ratio = torch.exp(per_token_logps - old)
    clipped = torch.clamp(ratio, 1 - epsilon_low, 1 + epsilon_high)
    per_token = -torch.min(ratio * adv, clipped * adv)
    ref_minus_logp = ref_per_token_logps.to(per_token_logps) - per_token_logps
    kl = torch.exp(ref_minus_logp) - ref_minus_logp - 1
    if beta != 0.0:
        per_token = per_token + beta * kl
    masked = per_token * mask
    if loss_type == "grpo":
        loss = (masked.sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    elif loss_type == "bnpo":
        loss = masked.sum() / mask.sum().clamp(min=1.0)
    elif loss_type == "dr_grpo":
        if not max_completion_length:
            raise ValueError("loss_type=dr_grpo needs max_completion_length (policy.max_new_tokens)")
        loss = masked.sum() / (per_token.size(0) * max_completion_length)
    else:
        if num_items_in_batch is None:
            raise ValueError("loss_type=dapo needs num_items_in_batch (the optimizer step's action tokens)")
        loss = masked.sum() / torch.as_tensor(num_items_in_batch, dtype=masked.dtype, device=masked.device).clamp(
            min=1.0)
    with torch.no_grad():
        n = mask.sum().clamp(min=1.0)
        is_clipped = ((ratio < 1 - epsilon_low) & (adv < 0)) | ((ratio > 1 + epsilon_high) & (adv > 0))
        stats = {"ratio": float((ratio * mask).sum() / n), "clip_fraction": float((is_clipped * mask).sum() / n),
                 "kl": float((kl * mask).sum() / n)}
    return loss, stats

"""PAE's filtered behaviour cloning, ``actor.loss: filtered_bc`` (amazon-science/PAE, ``algorithm: filteredbc``:
``pae/algorithms/utils.py`` ``filter_trajectories(trajectories, top_p=0.2)`` selects, ``pae/algorithms/filteredbc/
trainer.py`` ``BCTrainer.actor_loss`` trains, both called from ``onpolicy_train_loop``).

Selection: keep the episodes that succeeded (``trajectory_reward > 0``); per task, when it has more than one
success, keep those no longer (in steps) than the q-quantile of the successes' lengths (linear interpolation,
``numpy.percentile``'s default; q = ``actor.bc_length_quantile``, PAE's top_p = 0.2), so the shortest successes
are imitated; a task's single success is kept. Every step of a kept episode is a training sample.

Loss: the negative log-likelihood of the actions, a token mean over the micro-batch's kept samples (mask m_i = 1
for all here; the KL losses' ``kl=False`` ablation passes its A > 0 mask), with n_i the action's tokens (the
action and the stop token)::

    L = - sum_i m_i log pi_theta(a_i | s_i, I) / sum_i m_i n_i,    log pi_theta(a_i | s_i, I) = sum_t log pi(a_it | ...)

No critic and no reference model: the phase-start actor is only the starting point.
"""

from __future__ import annotations

import torch


def _quantile(values: list[int], q: float) -> float:
    """The q-quantile with linear interpolation between order statistics (``numpy.percentile``'s default)."""
    return float(torch.quantile(torch.tensor(values, dtype=torch.float64), q))


def select_successful_episodes(samples: list[dict], quantile: float) -> tuple[list[dict], dict]:
    """The step samples of the episodes PAE's filter keeps (module docstring), in their input order, and stats:
    ``episodes``, ``successful_episodes``, ``kept_episodes``."""
    if not 0 < quantile <= 1:
        raise ValueError(f"bc_length_quantile={quantile} must be in (0, 1]")
    steps: dict = {}
    for s in samples:
        steps.setdefault(s["episode_id"], []).append(s)
    lengths_of: dict = {}
    for eid, ss in steps.items():
        if float(ss[0]["trajectory_reward"]) > 0:
            lengths_of.setdefault(ss[0]["task"], []).append((eid, len(ss)))
    kept: set = set()
    for episodes in lengths_of.values():
        cutoff = _quantile([n for _, n in episodes], quantile) if len(episodes) > 1 else float("inf")
        kept |= {eid for eid, n in episodes if n <= cutoff}
    stats = {"episodes": len(steps), "successful_episodes": sum(len(e) for e in lengths_of.values()),
             "kept_episodes": len(kept)}
    return [s for s in samples if s["episode_id"] in kept], stats


def action_nll(logp: torch.Tensor, n_tokens: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Token-mean NLL of the actions of a micro-batch (module docstring): ``logp`` the summed action log-probs
    [B], ``n_tokens`` their token counts, ``mask`` which samples count (None: all)."""
    n_tokens = n_tokens.to(logp)
    mask = torch.ones_like(logp) if mask is None else mask.to(logp)
    return -(logp * mask).sum() / (n_tokens * mask).sum().clamp(min=1.0)

"""Advantages and the adaptive KL coefficient of the WebRL actor loss (paper, arXiv 2411.02337: Eq. 6 and Eq. 9;
official: ``WebRLTrainer.actor_loss`` in ``webrl/algorithms/webrl/trainer.py``).

Notation per step t of a trajectory of T steps: V = V(s_t), V' = V(s_{t+1}) (critic: min over two heads of
P(success)), R = the trajectory's final label (ORM or env, 0/1), r_t = R on the last step and 0 before it
(the paper's "reward only at the final step"), done_t = 1 on the last step, mc_t = R * sum_{k=0}^{T-1-t} gamma^k.

``paper`` (Eq. 9, lambda = 0.5)::

    A = lam * (r_t + (1 - done_t) * V' - V) + (1 - lam) * (R - V)

  V' is zeroed on the last step because the episode has ended (the official records repeat the last prompt as
  s', which would otherwise bootstrap from a state after the end); so the last step gets A = R - V.

``official`` (repo ``trainer.actor_loss``; the record's ``reward`` is R on *every* step)::

    A_raw = clamp(V' - V - margin + R + mc_t, -1, 1)        margin = 0.05
    A     = 1.0 if A_raw >= 0 else -0.6                      (binarised)
    mask  = A > 0                                            (negative samples never contribute)

  A successful trajectory (R = 1) always gives A_raw > 0; a failed one is positive iff V' - V >= margin.

Adaptive beta (official), with ref_prob = exp(ref_logp / n_action_tokens) = 1 / reference perplexity::

    beta = 5 if (A >= 0 and ref_prob >= 0.8) or (A < 0 and ref_prob < 0.9) else 1
    beta = min(beta, |A / log_ratio|)   (detached; the loss is exactly 0 once beta*log_ratio reaches A)
"""

from __future__ import annotations

import torch


def _t(x) -> torch.Tensor:
    return x.float() if isinstance(x, torch.Tensor) else torch.as_tensor(x, dtype=torch.float32)


def paper_advantage(v, nv, final_reward, done, lam: float = 0.5) -> torch.Tensor:
    """Paper Eq. 9 with the reward only at the final step (see module docstring)."""
    v, nv, R, done = _t(v), _t(nv), _t(final_reward), _t(done)
    r_t = R * done
    td = r_t + (1.0 - done) * nv - v
    mc = R - v
    return lam * td + (1.0 - lam) * mc


def official_advantage_raw(v, nv, reward, mc_return, margin: float = 0.05) -> torch.Tensor:
    """A_raw = clamp(V' - V - margin + reward + mc_return, -1, 1) (official ``actor_loss``)."""
    return torch.clamp(_t(nv) - _t(v) - margin + _t(reward) + _t(mc_return), -1.0, 1.0)


def binarise(a_raw, positive: float = 1.0, negative: float = -0.6) -> torch.Tensor:
    """Official binarisation: 1.0 where A_raw >= 0, else -0.6."""
    a_raw = _t(a_raw)
    return torch.where(a_raw >= 0, torch.full_like(a_raw, positive), torch.full_like(a_raw, negative))


def official_advantage(v, nv, reward, mc_return, margin: float = 0.05) -> tuple[torch.Tensor, torch.Tensor]:
    """(A, mask): the binarised official advantage and its positive-only training mask (A > 0)."""
    a = binarise(official_advantage_raw(v, nv, reward, mc_return, margin))
    return a, (a > 0).float()


def reference_prob(ref_logp_sum, n_tokens) -> torch.Tensor:
    """exp(mean token log-prob of the action under pi_ref) = 1 / perplexity."""
    return torch.exp(_t(ref_logp_sum) / _t(n_tokens).clamp(min=1.0))


def official_beta(adv, ref_prob, low: float = 1.0, high: float = 5.0,
                  pos_threshold: float = 0.8, neg_threshold: float = 0.9) -> torch.Tensor:
    """beta = high if (A >= 0 and ref_prob >= 0.8) or (A < 0 and ref_prob < 0.9) else low."""
    adv, ref_prob = _t(adv), _t(ref_prob)
    strong = ((adv >= 0) & (ref_prob >= pos_threshold)) | ((adv < 0) & (ref_prob < neg_threshold))
    return torch.where(strong, torch.full_like(adv, high), torch.full_like(adv, low))


def cap_beta(beta: torch.Tensor, adv: torch.Tensor, log_ratio: torch.Tensor) -> torch.Tensor:
    """min(beta, |A / log_ratio|), detached. log_ratio = 0 (actor == ref) leaves beta unchanged (|A/0| = inf)."""
    with torch.no_grad():
        ratio_cap = torch.abs(adv.float() / log_ratio.detach().float())  # inf or nan where log_ratio == 0
        ratio_cap = torch.nan_to_num(ratio_cap, nan=float("inf"))
        return torch.minimum(beta.float(), ratio_cap).to(log_ratio.dtype)

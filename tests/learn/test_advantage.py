"""Advantages and the adaptive beta, against numbers computed by hand."""

import pytest
import torch

from webrl_core.learn.advantage import (binarise, cap_beta, official_advantage, official_advantage_raw, official_beta,
                                  paper_advantage, reference_prob)


def test_paper_advantage_mid_last_and_failed_steps():
    # mid step of a success: 0.5*(0 + 0.7 - 0.4) + 0.5*(1 - 0.4) = 0.15 + 0.30
    # last step (V' ignored): 0.5*(1 - 0.3) + 0.5*(1 - 0.3) = 0.7
    # mid step of a failure: 0.5*(0.5 - 0.2) + 0.5*(0 - 0.2) = 0.15 - 0.10
    a = paper_advantage(v=[0.4, 0.3, 0.2], nv=[0.7, 0.9, 0.5], final_reward=[1, 1, 0], done=[0, 1, 0], lam=0.5)
    assert torch.allclose(a, torch.tensor([0.45, 0.7, 0.05]), atol=1e-6)
    # lam = 1 is pure TD, lam = 0 pure MC
    assert paper_advantage(0.4, 0.7, 1, 0, lam=1.0).item() == pytest.approx(0.3)
    assert paper_advantage(0.4, 0.7, 1, 0, lam=0.0).item() == pytest.approx(0.6)


def test_official_advantage_raw_clamp_binarise_mask():
    # failed step: 0.40 - 0.30 - 0.05 = 0.05 -> positive; 0.33 - 0.30 - 0.05 = -0.02 -> negative
    # success: 0.1 - 0.9 - 0.05 + 1 + 1.9 = 2.05 -> clamp 1; worst failure 0 - 1 - 0.05 = -1.05 -> clamp -1
    v, nv = [0.3, 0.3, 0.9, 1.0], [0.4, 0.33, 0.1, 0.0]
    reward, mc = [0, 0, 1, 0], [0, 0, 1.9, 0]
    raw = official_advantage_raw(v, nv, reward, mc, margin=0.05)
    assert torch.allclose(raw, torch.tensor([0.05, -0.02, 1.0, -1.0]), atol=1e-6)
    a, mask = official_advantage(v, nv, reward, mc, margin=0.05)
    assert a.tolist() == pytest.approx([1.0, -0.6, 1.0, -0.6])
    assert mask.tolist() == [1.0, 0.0, 1.0, 0.0]
    assert binarise([0.0, -1e-9]).tolist() == pytest.approx([1.0, -0.6])  # A_raw = 0 counts as positive


def test_every_step_of_a_success_is_positive_whatever_the_critic_says():
    # worst case for a success: V = 1, V' = 0 on the last step (mc = 1)
    a, mask = official_advantage(v=[1.0], nv=[0.0], reward=[1.0], mc_return=[1.0])
    assert mask.item() == 1.0 and a.item() == 1.0


def test_official_beta_rule_and_boundaries():
    adv = torch.tensor([1.0, 1.0, 1.0, -0.6, -0.6, -0.6])
    ref_prob = torch.tensor([0.85, 0.8, 0.5, 0.5, 0.9, 0.95])
    assert official_beta(adv, ref_prob).tolist() == [5.0, 5.0, 1.0, 5.0, 1.0, 1.0]
    assert official_beta(adv, ref_prob, low=3.0, high=8.0).tolist() == [8.0, 8.0, 3.0, 8.0, 3.0, 3.0]  # actor.beta_low


def test_beta_cap_and_detach():
    beta = torch.tensor([5.0, 5.0, 5.0, 1.0])
    adv = torch.tensor([1.0, 1.0, 1.0, 1.0])
    log_ratio = torch.tensor([0.5, 0.0, -0.1, 2.0], requires_grad=True)
    capped = cap_beta(beta, adv, log_ratio)
    # |1/0.5| = 2 < 5; |1/0| = inf keeps 5; |1/-0.1| = 10 > 5; |1/2| = 0.5 < 1
    assert capped.tolist() == pytest.approx([2.0, 5.0, 5.0, 0.5])
    assert not capped.requires_grad


def test_reference_prob_is_inverse_perplexity():
    assert reference_prob(torch.tensor([-2.0, 0.0]), torch.tensor([4, 3])).tolist() == pytest.approx(
        [torch.exp(torch.tensor(-0.5)).item(), 1.0])

"""PAE's filtered BC (``actor.loss: filtered_bc``, webrl_core/learn/filtered_bc.py): the episode selection against
a hand-built sample list, the NLL by hand, and ``train_actor`` end to end without a critic or a reference pass."""

import numpy as np
import pytest
import torch

from actor_samples import button_steps, per_token_logp
from webrl_core.config import EmbeddedModelConfig
from webrl_core.config_loader import load_config
from webrl_core.learn import webrl_trainer
from webrl_core.learn.filtered_bc import _quantile, action_nll, select_successful_episodes
from webrl_core.learn.embedded_model import build_embedded_model, train_embedded_tokenizer
from webrl_core.learn.transitions import build_transitions
from webrl_core.learn.webrl_trainer import train_actor, webrl_actor_loss
from webrl_core.prompts import build_prompt


def _steps(eid, task, success, n):
    return [{"episode_id": eid, "task": task, "trajectory_reward": float(success), "step_idx": k} for k in range(n)]


def _hand_built():
    """Task A: successes of 1..5 steps and a failure of 1 step; task B: one success of 7 steps; task C: failures
    only; task D: successes of 2, 2 and 3 steps (a tie at the cutoff)."""
    out = []
    for n in (3, 1, 5, 2, 4):
        out += _steps(f"A{n}", "A", True, n)
    out += _steps("Afail", "A", False, 1) + _steps("B7", "B", True, 7) + _steps("C1", "C", False, 2)
    out += _steps("C2", "C", False, 1) + _steps("D2a", "D", True, 2) + _steps("D2b", "D", True, 2)
    out += _steps("D3", "D", True, 3)
    return out


def _kept_episodes(samples):
    return sorted({s["episode_id"] for s in samples})


def test_selection_keeps_the_shortest_successes_per_task():
    samples = _hand_built()
    kept, stats = select_successful_episodes(samples, 0.2)
    # A: 20th percentile of 1..5 = 1 + 0.2 x 4 = 1.8 -> the 1-step success; B: its only success; C: none;
    # D: 20th percentile of 2, 2, 3 = 2 -> both 2-step successes
    assert _kept_episodes(kept) == ["A1", "B7", "D2a", "D2b"]
    assert stats == {"episodes": 12, "successful_episodes": 9, "kept_episodes": 4}
    assert kept == [s for s in samples if s["episode_id"] in {"A1", "B7", "D2a", "D2b"}]  # every step, in order
    kept, stats = select_successful_episodes(samples, 0.5)  # A: median 3
    assert _kept_episodes(kept) == ["A1", "A2", "A3", "B7", "D2a", "D2b"]
    kept, stats = select_successful_episodes(samples, 1.0)  # every success
    assert _kept_episodes(kept) == ["A1", "A2", "A3", "A4", "A5", "B7", "D2a", "D2b", "D3"]
    assert stats["kept_episodes"] == stats["successful_episodes"] == 9
    assert sum(s["episode_id"] == "A3" for s in kept) == 3
    with pytest.raises(ValueError, match="bc_length_quantile"):
        select_successful_episodes(samples, 0.0)


def test_quantile_is_numpys_percentile():
    """PAE's cutoff: np.percentile(lengths, top_p * 100), linear interpolation."""
    for lengths in ([1, 2, 3, 4, 5], [2, 2, 3], [4, 1, 9, 9, 2, 7], [3, 8]):
        for q in (0.2, 0.35, 0.5, 1.0):
            assert _quantile(lengths, q) == pytest.approx(float(np.percentile(lengths, q * 100)))


def test_nll_by_hand_and_one_definition():
    logp = torch.tensor([-3.0, -6.0], requires_grad=True)
    loss = action_nll(logp, torch.tensor([4.0, 5.0]))
    loss.backward()
    assert loss.item() == pytest.approx(9 / 9) and logp.grad.tolist() == pytest.approx([-1 / 9, -1 / 9])
    # a mask leaves the second sample out of the sum and the token count: 3 / 4
    assert action_nll(logp, torch.tensor([4.0, 5.0]), torch.tensor([1.0, 0.0])).item() == pytest.approx(0.75)
    # the KL losses' kl=False ablation is the same NLL
    same, _ = webrl_actor_loss(logp, torch.zeros(2), torch.tensor([4.0, 5.0]), torch.ones(2), torch.tensor([1.0, 0.0]),
                               torch.ones(2), kl=False)
    assert same.item() == pytest.approx(0.75)


# ---------------------------------------------------------------------------------------------
# a tiny model end to end

@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("bc_models")
    texts = [build_prompt(f"open item {i}", [], f"<button id={i}>Open {i}</button>")
             + f'do(action="Click", element="{i}")' for i in range(40)]
    train_embedded_tokenizer(texts, 400, root / "tok")
    cfg = EmbeddedModelConfig(vocab_size=400, hidden_size=48, intermediate_size=96, num_layers=2, num_heads=2,
                              max_length=512, arch="llama")
    return build_embedded_model(root / "tok", cfg, root / "llama", seed=2)


def _episodes():
    """Two tasks, four rollouts each: per task a 1-step and a 3-step success and two 1-step failures."""
    eps = []
    for t in range(2):
        for r, (ok, n) in enumerate([(True, 1), (True, 3), (False, 1), (False, 1)]):
            ep = {"episode_id": f"t{t}r{r}", "success": ok, "intent": f"open item {t}", "phase": 1}
            responses = [f'do(action="Click", element="{t + k if ok else 9}")' for k in range(n)]
            eps.append((ep, button_steps(ep["intent"], responses, f"<button id={t}>Open</button>")))
    return build_transitions(eps)


def _settings(*extra):
    return load_config(sets=["models.device=cpu", "models.max_length=256", "actor.batch_size=2", "actor.lr=0.01",
                             "actor.epochs=5", "actor.loss=filtered_bc", *extra])


def test_train_actor_filtered_bc_without_critic_or_reference(tiny, tmp_path, monkeypatch):
    def no_reference_pass(*a, **kw):
        raise AssertionError("filtered_bc ran a reference pass")

    monkeypatch.setattr(webrl_trainer, "sequence_logprobs", no_reference_pass)
    samples = _episodes()
    settings = _settings()
    stats = train_actor(samples, tiny, tmp_path / "bc", settings, critic_dir=None, progress=False)
    monkeypatch.undo()
    # q = 0.2 of lengths 1 and 3 is 1.4: per task the 1-step success only
    assert stats["loss_mode"] == "filtered_bc" and stats["critic_s"] == 0.0 and stats["mean_ref_prob"] is None
    assert (stats["n_episodes"], stats["n_successful_episodes"], stats["n_kept_episodes"]) == (8, 4, 2)
    assert stats["n_train"] == 2 and stats["steps"] == 5  # 2 samples, batch 2, 5 epochs
    kept = [s for s in samples if s["episode_id"] in ("t0r0", "t1r0")]
    rise = (per_token_logp(tmp_path / "bc", kept, settings).mean().item()
            - per_token_logp(tiny, kept, settings).mean().item())
    assert rise > 1.0, rise  # the imitated actions became likelier
    # kl=False without a critic is the same filtered BC
    folded = train_actor(samples, tiny, tmp_path / "fold", _settings("actor.loss=official", "actor.kl=false"),
                         critic_dir=None, max_steps=1, progress=False)
    assert folded["loss_mode"] == "filtered_bc" and folded["n_kept_episodes"] == 2 and folded["n_train"] == 2

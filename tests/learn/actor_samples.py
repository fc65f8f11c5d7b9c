"""Tiny samples on button pages for the actor-loss tests (test_training, test_grpo, test_filtered_bc), and what the
tests read back from a trained actor. Test files in tests/learn import it as ``from actor_samples import ...``
(pytest puts a test file's folder on ``sys.path``)."""

from __future__ import annotations

import torch

from webrl_core.config import EmbeddedModelConfig
from webrl_core.learn.embedded_model import build_embedded_model, train_embedded_tokenizer
from webrl_core.learn.models import load_causal_lm, load_tokenizer
from webrl_core.learn.transitions import build_transitions
from webrl_core.learn.webrl_trainer import encode_samples, sequence_logprobs
from webrl_core.prompts import build_prompt


def button_steps(intent: str, responses: list[str], pages: str | list[str]) -> list[dict]:
    """An episode's steps as the rollout stores them: step ``k`` answers ``responses[k]`` to the prompt of the
    intent, the responses before it and its page (``pages``: one page for every step, or one per step)."""
    pages = [pages] * len(responses) if isinstance(pages, str) else pages
    return [{"idx": k, "prompt": build_prompt(intent, responses[:k], page), "response": resp}
            for k, (resp, page) in enumerate(zip(responses, pages, strict=True))]


def four_layer_model(root) -> str:
    """A 4-layer embedded Llama (seed 3) with a tokenizer trained on "open item i" button prompts, in ``root``."""
    texts = [build_prompt(f"open item {i}", [], f"<button id={i}>Open {i}</button>") for i in range(40)]
    train_embedded_tokenizer(texts, 400, root / "tok")
    cfg = EmbeddedModelConfig(vocab_size=400, hidden_size=48, intermediate_size=96, num_layers=4, num_heads=2,
                              max_length=512)
    return build_embedded_model(root / "tok", cfg, root / "model", seed=3)


def two_click_transitions() -> list[dict]:
    """Three two-step "open item e" episodes (the second failed), as transitions."""
    eps = []
    for e in range(3):
        ep = {"episode_id": f"e{e}", "success": e != 1, "intent": f"open item {e}"}
        eps.append((ep, button_steps(ep["intent"], [f'do(action="Click", element="{e + k}")' for k in range(2)],
                                     [f"<button id={e + k}>Open</button>" for k in range(2)])))
    return build_transitions(eps)


def per_token_logp(model_dir, samples, settings) -> torch.Tensor:
    """Each sample's action log-prob under the model in ``model_dir``, per action token."""
    tok = load_tokenizer(model_dir)
    model = load_causal_lm(model_dir, settings.models)
    rows = encode_samples(tok, samples, settings.models.max_length)
    n = torch.tensor([r["n_action"] for r in rows], dtype=torch.float32)
    return sequence_logprobs(model, rows, tok.pad_token_id, 8) / n

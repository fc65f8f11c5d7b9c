"""Tiny samples on button pages for the actor-loss tests (test_training, test_grpo, test_filtered_bc), and what the
tests read back from a trained actor. Test files in tests/learn import it as ``from actor_samples import ...``
(pytest puts a test file's folder on ``sys.path``)."""

from __future__ import annotations

import torch

from webrl_core.learn.models import load_causal_lm, load_tokenizer
from webrl_core.learn.webrl_trainer import encode_samples, sequence_logprobs
from webrl_core.prompts import build_prompt


def button_steps(intent: str, responses: list[str], pages: str | list[str]) -> list[dict]:
    """An episode's steps as the rollout stores them: step ``k`` answers ``responses[k]`` to the prompt of the
    intent, the responses before it and its page (``pages``: one page for every step, or one per step)."""
    pages = [pages] * len(responses) if isinstance(pages, str) else pages
    return [{"idx": k, "prompt": build_prompt(intent, responses[:k], page), "response": resp}
            for k, (resp, page) in enumerate(zip(responses, pages, strict=True))]


def per_token_logp(model_dir, samples, settings) -> torch.Tensor:
    """Each sample's action log-prob under the model in ``model_dir``, per action token."""
    tok = load_tokenizer(model_dir)
    model = load_causal_lm(model_dir, settings.models)
    rows = encode_samples(tok, samples, settings.models.max_length)
    n = torch.tensor([r["n_action"] for r in rows], dtype=torch.float32)
    return sequence_logprobs(model, rows, tok.pad_token_id, 8) / n

"""The selected-logits SFT loss equals the model's own token-mean loss over the labelled positions, gradients too."""

from __future__ import annotations

import torch

from webrl_core.config import EmbeddedModelConfig, ModelsConfig
from webrl_core.learn.models import load_causal_lm
from webrl_core.learn.embedded_model import build_embedded_model, train_embedded_tokenizer
from webrl_core.learn.sft_trainer import selected_token_nll


def test_selected_loss_equals_full_logits_loss(tmp_path):
    train_embedded_tokenizer(["click the button and type the name " * 20], 320, tmp_path / "tok")
    cfg = EmbeddedModelConfig(vocab_size=320, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=2,
                              max_length=128)
    folder = build_embedded_model(tmp_path / "tok", cfg, tmp_path / "m", seed=0)
    model = load_causal_lm(folder, ModelsConfig(dtype="float32", device="cpu"), trainable=True)
    torch.manual_seed(0)
    ids = torch.randint(5, model.config.vocab_size, (3, 40))
    mask = torch.ones_like(ids)
    mask[0, :6] = 0  # a left-padded row
    labels = torch.full_like(ids, -100)
    labels[:, -7:] = ids[:, -7:]
    ours = selected_token_nll(model, ids, mask, labels)
    grads_ours = torch.autograd.grad(ours, [p for p in model.parameters() if p.requires_grad])
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    ref = model(input_ids=ids, attention_mask=mask, position_ids=pos, labels=labels).loss
    grads_ref = torch.autograd.grad(ref, [p for p in model.parameters() if p.requires_grad])
    assert torch.allclose(ours, ref, atol=1e-5)
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(grads_ours, grads_ref))
    # normalised by the step's labelled tokens when given (gradient accumulation)
    assert torch.allclose(selected_token_nll(model, ids, mask, labels, num_items=42), ours * 21 / 42, atol=1e-6)

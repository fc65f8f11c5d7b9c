"""The bootstrap SFT (``sft_train``): the actor fine-tuned on (prompt, action) demonstrations before phase 1, with
TRL's ``SFTTrainer`` whose LM head is applied only where the loss reads it (``SelectedLogitsSFTTrainer``, also the
ORM's trainer). Arguments, progress, precision and the saving under ``accelerate launch``: ``trainer_utils``.

``SelectedLogitsSFTTrainer``'s loss (TRL's token-mean NLL over the labelled positions, Trainer-normalised across
accumulation)::

    L = - sum_{t : y_{t+1} != -100} log softmax(W h_t)[y_{t+1}]  /  N_batch

where h_t is the decoder's last hidden state at position t, W the LM head and N_batch the labelled tokens of the
optimizer step (``num_items_in_batch``). With a completion-only loss the labelled positions are the action and its
stop token (about 15 of 700 tokens of a WebRL step; "YES"/"NO" and a stop token of a 1,000-token ORM prompt), so
the [B, T, V] logits of a 49,152-token vocabulary and their softmax are never built: on a 2-core CPU this alone
makes SmolLM2-135M's step 1.3x faster (183 vs 139 trained tokens/s). The change is the ``compute_loss`` hook only;
under FSDP or DeepSpeed, whose sharded model runs only through its root forward, TRL's own loss is used.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import set_seed
from trl import SFTConfig, SFTTrainer

from webrl_core.learn.model_flops import DecoderShape, flop_stats, lengths_sums
from webrl_core.learn.models import (count_parameters, encode_prompt_action, head_logits, last_hidden_states,
                                     load_causal_lm, load_tokenizer, save_model)
from webrl_core.learn.trainer_utils import (_full_model, _loss_curve, _process_device, _trainer_args,
                                            actor_micro_batches, fit, passes_over_rows, progress_callbacks,
                                            trained_shape)
from webrl_core.runs import loss_history


def selected_token_nll(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, labels: torch.Tensor,
                       num_items: torch.Tensor | int | None = None) -> torch.Tensor:
    """Summed next-token NLL at the labelled positions, divided by ``num_items`` (default: their count)."""
    hidden = last_hidden_states(model, input_ids, attention_mask)[:, :-1]
    target = labels[:, 1:]
    keep = target != -100
    logits = head_logits(model, hidden[keep])
    total = F.cross_entropy(logits, target[keep], reduction="sum")
    denom = keep.sum() if num_items is None else torch.as_tensor(num_items, device=total.device)
    return total / denom.clamp(min=1)


class SelectedLogitsSFTTrainer(SFTTrainer):
    """``SFTTrainer`` whose loss builds logits only at labelled positions (module docstring)."""

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        from accelerate.utils import DistributedType

        if self.accelerator.distributed_type in (DistributedType.FSDP, DistributedType.DEEPSPEED):
            # a sharded model runs only through its root forward (FSDP2 refuses the decoder and head called apart)
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        mask = inputs.get("attention_mask")
        if mask is None:
            mask = torch.ones_like(inputs["input_ids"])
        # the Trainer's mixed precision wraps the model's forward; the decoder called directly needs it here
        with self.accelerator.autocast():
            loss = selected_token_nll(model, inputs["input_ids"], mask, inputs["labels"], num_items_in_batch)
        return (loss, None) if return_outputs else loss


def sft_train(pairs: list[tuple[str, str]], model_dir: str | Path, out_dir: str | Path, settings,
              max_steps: int | None = None, epochs: float | None = None, callbacks: list | None = None) -> dict:
    """Bootstrap SFT of the actor on (prompt, action) pairs with TRL's SFTTrainer, completion-only loss.

    The prompt-completion examples are tokenised by ``models.encode_prompt_action`` (prompt ids + action ids +
    stop, observation cut first) and given to SFTTrainer as ``input_ids`` + ``completion_mask``, so the loss
    covers exactly the action and its stop token (``bootstrap.sft_loss: all``: every token, for from-scratch
    models). LR, epochs and loss come from the ``bootstrap`` section; batch sizes and clipping from ``actor``
    (the model trained is the actor); ``epochs`` overrides ``bootstrap.sft_epochs`` (pairs that already hold
    several augmented passes); ``callbacks``: extra ``TrainerCallback``s (``bench sft-curve`` measures the model
    during training through one). The recipe (cosine schedule, 10% warm-up) is the official SFT's
    (``LLaMA-Factory/examples/train_full/llama3_full_policy_web.yaml``)."""
    from datasets import Dataset

    if not pairs:
        raise ValueError("sft_train: no (prompt, action) pairs")
    a, boot = settings.actor, settings.bootstrap
    epochs = boot.sft_epochs if epochs is None else epochs
    out_dir = Path(out_dir)
    micro, accum = actor_micro_batches(settings)
    args = _trainer_args(SFTConfig, out_dir, settings, boot.sft_lr, epochs, micro, accum,
                         a.max_grad_norm, max_steps, scheduler="cosine", warmup=0.1,  # the paper's SFT recipe
                         completion_only_loss=boot.sft_loss == "completion", max_length=settings.models.max_length,
                         activation_checkpointing=settings.models.gradient_checkpointing)
    tok = load_tokenizer(model_dir)
    set_seed(settings.run.seed)
    models_cfg = settings.models.model_copy(update={"device": _process_device(settings)})
    model = load_causal_lm(model_dir, models_cfg, trainable=True)
    counts = count_parameters(model)
    rows = []
    for i, pair in enumerate(pairs):
        if len(pair) != 2 or not all(isinstance(x, str) for x in pair):
            raise ValueError(f"sft_train: pair {i} must be (prompt: str, action: str), got {pair!r:.120}")
        enc = encode_prompt_action(tok, pair[0], pair[1], settings.models.max_length)
        rows.append({"input_ids": enc["input_ids"], "completion_mask": enc["action_mask"]})
    trainer = SelectedLogitsSFTTrainer(model=model, args=args, train_dataset=Dataset.from_list(rows),
                                       processing_class=tok,
                                       callbacks=progress_callbacks("sft") + list(callbacks or []))
    t0 = time.perf_counter()
    result = fit(trainer, "sft", settings.actor, settings.models.attn_implementation,
                 compile_setting=settings.models.compile_layers, weight_casts=settings.models.weight_casts,
                 compute_dtype=settings.models.dtype)
    # the seconds the stats report, which its share of the peak is then measured against
    train_s = round(time.perf_counter() - t0 - result.metrics["calibrate_s"], 3)
    tokens, tokens_sq = lengths_sums((len(r["input_ids"]) for r in rows),
                                     passes_over_rows(trainer, result.global_step, len(rows)))
    shape = DecoderShape.of(model)
    flops = shape.pass_flops(tokens, tokens_sq, result.metrics["cached"], train=True) if shape else None
    full = _full_model(trainer, lambda: load_causal_lm(model_dir, models_cfg.model_copy(update={"device": "cpu"}),
                                                       trainable=True))
    if full is not None:
        save_model(full, tok, out_dir)
        loss_history.write(out_dir, "sft", trainer.state)
    trainer.accelerator.wait_for_everyone()
    return {"n_pairs": len(pairs), "train_s": train_s, **trained_shape(result),
            "train_loss": result.training_loss,
            "steps": result.global_step, "tokens": int(tokens),
            **flop_stats("", flops, train_s, result.metrics["peak_flops"]), **counts, "loss_curve": _loss_curve(trainer)}

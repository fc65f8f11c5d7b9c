"""The critic's trainer: one epoch of the double-head value model on the phase's samples (official: before the
actor, on the same samples), a ``transformers.Trainer`` subclass.

Loss (``critic.py``; official THUDM/WebRL ``webrl/algorithms/webrl/trainer.py``, ``WebRLTrainer.critic_loss``;
paper arXiv 2411.02337, Eq. 8): the cross-entropy of both heads on s and on s' against the step's 0/1 label
y = 1[mc_return > 0], run on the DISTINCT prompts, each weighted by how often it occurs (``critic_examples``,
``critic_loss``). ``CriticTrainer`` divides every micro-batch's loss by the optimizer step's total weight over all
micro-batches and ranks, so accumulation and data parallelism take exactly the step of one process with the whole
batch. Arguments, progress, precision and the saving under ``accelerate launch``: ``trainer_utils``.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch
from transformers import Trainer, TrainingArguments, set_seed

from webrl_core.learn import frozen_prefix
from webrl_core.learn.critic import Critic, critic_examples, critic_loss
from webrl_core.learn.model_flops import DecoderShape, flop_stats, lengths_sums
from webrl_core.learn.models import left_pad, training_dtype
from webrl_core.learn.trainer_utils import (_full_model, _loss_curve, _process_device, _trainer_args,
                                            critic_micro_batches, fit, passes_over_rows, progress_callbacks,
                                            trained_shape)
from webrl_core.runs import loss_history


class CriticTrainer(Trainer):
    """transformers.Trainer for the double-head critic: weighted CE on distinct prompts (critic.py)."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.loss_is_scaled_for_ga = True  # each micro-batch's loss is already its share of the step (below)

    def get_batch_samples(self, epoch_iterator, num_batches: int, device) -> tuple[list, torch.Tensor]:
        """The optimizer step's micro-batches, with its n_samples = sum(w)/2 over ALL of them and all ranks, so
        micro-batches with accumulation, on any number of ranks, take exactly the step one process takes with the
        whole batch."""
        batch_samples, _ = super().get_batch_samples(epoch_iterator, num_batches, device)
        local = sum(b["weight"].float().sum() for b in batch_samples).to(device)
        total = self.accelerator.reduce(local, reduction="sum") if self.accelerator.num_processes > 1 else local
        return batch_samples, total / 2.0

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        l1, l2 = model(inputs["input_ids"], inputs["attention_mask"])
        n_samples = None  # outside a training step (evaluation): the micro-batch's own weight
        if num_items_in_batch is not None:
            # x world: DDP averages the ranks' gradients, and every rank divides by the global weight
            n_samples = num_items_in_batch / self.accelerator.num_processes
        loss = critic_loss(l1, l2, inputs["labels"], inputs["weight"], n_samples=n_samples)
        return (loss, (l1, l2)) if return_outputs else loss

    def _save(self, output_dir=None, state_dict=None):  # Trainer checkpoints: our folder format
        self.accelerator.unwrap_model(self.model).save(output_dir or self.args.output_dir)


class CriticCollator:
    def __init__(self, pad_id: int):
        self.pad_id = pad_id

    def __call__(self, features: list[dict]) -> dict[str, torch.Tensor]:
        ids, mask = left_pad([f["input_ids"] for f in features], self.pad_id)
        return {"input_ids": ids, "attention_mask": mask,
                "labels": torch.tensor([f["label"] for f in features], dtype=torch.long),
                "weight": torch.tensor([f["weight"] for f in features], dtype=torch.float32)}


def train_critic(samples: list[dict], backbone_dir: str | Path, out_dir: str | Path, settings,
                 resume: str | Path | None = None, max_steps: int | None = None) -> dict:
    """One critic epoch (official: before the actor, on the same samples); saves a critic folder at ``out_dir``.

    ``resume``: the previous phase's critic folder (backbone and heads); otherwise a fresh critic on the
    backbone of ``backbone_dir`` (the SFT model)."""
    for i, s in enumerate(samples):
        miss = [k for k in ("observation", "next_observation", "mc_return") if s.get(k) is None]
        if miss:
            raise ValueError(f"critic sample {i}: missing field(s) {miss}")
    out_dir = Path(out_dir)
    c, models_cfg = settings.critic, settings.models
    micro, accum = critic_micro_batches(settings)
    args = _trainer_args(TrainingArguments, out_dir, settings, c.lr, c.epochs, micro, accum, c.max_grad_norm,
                         max_steps)
    load_dtype = training_dtype(models_cfg)  # float32 master weights, or a LoRA's frozen base in models.dtype

    def build(device):
        if resume:
            critic = Critic.load(resume, dtype=load_dtype, device=device, max_length=models_cfg.max_length)
        else:
            critic = Critic.from_backbone(backbone_dir, c.head_init_std, models_cfg.max_length, load_dtype, device,
                                          seed=settings.run.seed)
        set_seed(settings.run.seed)  # LoRA adapter init draws from the global RNG: the same on every rank
        return critic.for_training(models_cfg)

    critic = build(_process_device(settings))
    frozen_prefix.attach(critic.backbone, models_cfg)  # its prompts come back in the actor stage's critic values
    critic._no_split_modules = getattr(critic.backbone, "_no_split_modules", None)  # FSDP wraps the decoder layers
    counts = critic.parameter_counts()  # LoRA: adapters + heads; full fine-tuning: everything
    examples = critic_examples(samples)
    ids = critic.encode([e["prompt"] for e in examples])
    rows = [{"input_ids": x, "label": e["label"], "weight": e["weight"], "length": len(x)} for x, e in zip(ids, examples)]
    from datasets import Dataset

    trainer = CriticTrainer(model=critic, args=args, train_dataset=Dataset.from_list(rows),
                            data_collator=CriticCollator(critic.tokenizer.pad_token_id),
                            callbacks=progress_callbacks("critic"))
    t0 = time.perf_counter()
    result = fit(trainer, "critic", settings.critic, settings.models.attn_implementation,
                 compile_setting=settings.models.compile_layers, weight_casts=settings.models.weight_casts,
                 compute_dtype=settings.models.dtype)
    # the seconds the stats report, which its share of the peak is then measured against
    train_s = round(time.perf_counter() - t0 - result.metrics["calibrate_s"], 3)
    shape = DecoderShape.of(critic.backbone)

    full = _full_model(trainer, lambda: build("cpu"))
    if full is not None:
        full.save(out_dir)
        loss_history.write(out_dir, "critic", trainer.state)
    trainer.accelerator.wait_for_everyone()
    labels = [e["label"] for e in examples]
    tokens, tokens_sq = lengths_sums((r["length"] for r in rows),
                                     passes_over_rows(trainer, result.global_step, len(rows)))
    return {"n_samples": len(samples), "n_prompts": len(examples), "positive_share": sum(labels) / max(len(labels), 1),
            "train_s": train_s, **trained_shape(result),
            "train_loss": result.training_loss, "steps": result.global_step,
            "tokens": int(tokens), "tokens_sq": int(tokens_sq),
            **flop_stats("", shape.pass_flops(tokens, tokens_sq, result.metrics["cached"], train=True)
                         if shape else None, train_s, result.metrics["peak_flops"]),
            **counts, "loss_curve": _loss_curve(trainer)}

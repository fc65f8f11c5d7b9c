"""The trainers' public names in one place (this module defines nothing; each name lives with its trainer).

    webrl_trainer    the actor: ``WebRLConfig``, ``webrl_actor_loss`` (the KL-constrained update, paper Eq. 6 with
                     the advantage of Eq. 9, or the official ``WebRLTrainer.actor_loss``), ``WebRLTrainer``, its
                     precompute (``critic_values_for``, ``compute_advantages``, ``sequence_logprobs``) and
                     ``train_actor``
    critic_trainer   the critic: ``CriticTrainer`` and ``train_critic``
    sft_trainer      the bootstrap SFT: ``sft_train`` (and the SFT/ORM Trainer with logits only where the loss reads)
    trainer_utils    what they share: ``TrainingArguments`` building, progress (``fit``, ``progress_callbacks``), the
                     data-parallel precompute and the saving under ``accelerate launch`` (``distributed_save_model``)

``webrl_core.scale.launch`` reaches the trainers through this module (``from webrl_core.learn import training as
tr``; ``tr.train_actor``, ``tr.train_critic``, ``tr.sft_train``, ``tr.distributed_save_model``), one module alias
for the four: a stage's cached identity (``runs.code_identity``) follows a module alias to one module, so the
launcher's code stays as it was when these lived here. New code imports from the trainer modules (``benchmarks/``
still imports ``sft_train``, ``train_actor``, ``train_critic`` and ``actor_micro_batches`` from here).
"""

from __future__ import annotations

from webrl_core.learn.critic_trainer import CriticTrainer, train_critic
from webrl_core.learn.sft_trainer import sft_train
from webrl_core.learn.trainer_utils import actor_micro_batches, distributed_save_model, fit, progress_callbacks
from webrl_core.learn.webrl_trainer import (WebRLConfig, WebRLTrainer, action_logprobs, compute_advantages,
                                            critic_values_for, encode_samples, sequence_logprobs, train_actor,
                                            webrl_actor_loss)

__all__ = ["WebRLConfig", "WebRLTrainer", "CriticTrainer", "webrl_actor_loss", "action_logprobs",
           "sequence_logprobs", "encode_samples", "compute_advantages", "critic_values_for", "train_actor",
           "train_critic", "sft_train", "fit", "progress_callbacks"]

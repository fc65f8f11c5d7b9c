"""WebRL training: the critic, the KL-constrained actor update, and the bootstrap SFT.

The actor update is the WebRL paper's KL-constrained policy update (arXiv 2411.02337, Eq. 6 with the advantage of
Eq. 9) or the official code's version of it (``webrl/algorithms/webrl/trainer.py``, ``WebRLTrainer.actor_loss``).
Actor loss per kept sample i, with logp_i = sum over the action tokens of log pi_theta, ref_logp_i the same under
pi_ref (the actor at the start of the phase), n_i the action token count (the action + the stop token):

``loss="official"`` (``WebRLTrainer.actor_loss``; A binarised, beta adaptive, advantage.py)::

    c_i         = n_i ("sample", the repo at its batch size 1) or sum_j n_j mask_j ("batch", the repo's formula
                  for batch > 1); max(c, 1)
    log_ratio_i = (logp_i - ref_logp_i) / c_i                           per-token mean log-ratio
    beta_i      = min(beta_i^0, |A_i / log_ratio_i|)  (detached)         beta_i^0 in {beta_low, beta_high}
                                                                         from ref_prob: the repo's {1, 5}
    L           = mean_i  Huber_delta=1(beta_i * log_ratio_i, A_i) / beta_i * mask_i

  mask_i = A_i > 0. Masked-out samples contribute exactly 0 to the loss and its gradient, so they are DROPPED
  before the epoch instead of being run forward/backward (the repo runs them); the mean is over the kept samples.

``loss="paper"`` (Eq. 6, A from Eq. 9, fixed beta)::

    log_ratio_i = logp_i - ref_logp_i        ("sum": the sequence log-ratio log pi(a|s)/pi_ref(a|s), the paper's)
                  (logp_i - ref_logp_i)/n_i  ("mean": per token)
    L           = mean_i (beta * log_ratio_i - A_i)^2                   all samples, negative A included

``kl=False`` (paper Fig. 5 ablation): plain token-mean NLL of the actions on the samples the KL loss would push up
(A > 0), no reference.

Precompute (once per phase, batched, no grad, BEFORE the actor epoch): the critic's V for every DISTINCT prompt
among observations and next observations (V(s_{t+1}) of step t is V(s) of step t+1), then the critic is freed; the
reference log-probs come from the freshly loaded actor itself before its first update (it IS pi_ref), so no second
model is ever in memory. The results are dataset columns (ref_logp, n_action, adv, mask, beta0).

Scaling out: ``webrl_core.scale.launch`` runs ``train_actor`` / ``train_critic`` / ``sft_train`` (and ``orm.train_orm``)
as ``accelerate launch`` jobs (``training.launcher: accelerate``; configs in ``infra/accelerate/``: DDP, FSDP,
DeepSpeed ZeRO-3 with CPU offload). Every rank reads the same data and builds the same model (same seed); the Trainer
shards the batches; the model is saved once, by the main process, after gathering the full weights under FSDP /
DeepSpeed ZeRO-3 (``_full_model``: a collective, every rank calls it). Each trainer returns ``loss_curve``, the
Trainer's logged [step, loss] pairs (the loss of a logged step is averaged over the logging window and the ranks),
and writes them into the model folder it saves (``webrl_core.runs.loss_history``: ``loss_history.json``). A
training logs about ``1 / LOGGING_STEPS`` points, every optimizer step when it has fewer.

The precompute is split across the processes and gathered (``accelerate.PartialState``); the trainers are
``transformers.Trainer`` subclasses, so data sharding, gradient sync and clipping come from Trainer/accelerate.
Defaults follow the paper (constant LR, 1 epoch, grad clip 1.0, AdamW weight decay 0.01); only the LR of the tiny
embedded model is larger (``ActorTrainConfig.lr``) because 1e-6 does not move a 1-10M-parameter model in one epoch.

Precision (every trainer: SFT, actor, critic, and the ORM via ``models``): with ``models.dtype`` bfloat16/float16
the trained model holds float32 master weights (``models.training_dtype``; with LoRA only the adapters and the
critic's heads, over a frozen base in the low dtype) and the Trainer runs forward and backward under autocast in
the low dtype (``models.trainer_precision_args``: ``bf16``/``fp16`` in the ``TrainingArguments``; fp16 needs a
GPU). Under ``accelerate launch`` the launcher passes the matching ``--mixed_precision`` (FSDP2: bf16 param/reduce
policy over float32 sharded masters; DeepSpeed: its bf16/fp16 optimizer with float32 masters). Frozen passes run
in ``models.dtype`` (the critic precompute) or in the training autocast (the reference log-probs, so that
log_ratio is exactly 0 before the first update). Memory for an 8B actor + critic: ``webrl bench memory``.

Reference policy with LoRA: ``train_actor`` loads the phase-start actor folder (a previous phase's ``save_model``
output, which holds the MERGED weights) and puts a FRESH adapter on it. peft initialises ``lora_B = 0``, so before
the first update the wrapped model is exactly the phase-start actor, and the reference log-probs are computed from
it at that moment (``ref_logp``). This equals ``disable_adapter()`` on the trained model only because the previous
adapters were merged into the folder; an unmerged adapter chain would make "adapter off" an older policy.

Settings: the config sections (``webrl_core.config``: ``actor``, ``critic``, ``bootstrap``) are the only definition;
``WebRLConfig``, the actor Trainer's arguments, takes its loss fields from ``ActorTrainConfig`` and is built from
the settings by ``WebRLConfig.from_settings``. Progress: rich, for our loops (``rich.progress``) and for the
Trainers (``TrainProgress``: one line per training; TRL's ``RichProgressCallback`` with ``webrl --verbose``).
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, track
from transformers import Trainer, TrainerCallback, TrainingArguments, set_seed
from transformers.trainer_callback import PrinterCallback

from webrl_core.learn import advantage as adv_mod
from webrl_core.learn import micro_batch
from webrl_core.config import ActorTrainConfig
from webrl_core.logs import is_verbose
from webrl_core.runs import loss_history
from webrl_core.learn.critic import Critic, critic_examples, critic_loss
from webrl_core.learn.models import (autocast_context, count_parameters, encode_prompt_action, left_pad, load_causal_lm,
                               load_tokenizer, resolve_device, save_model, trainer_precision_args, training_dtype)


# ---------------------------------------------------------------------------------------------
# configs

LOGGING_STEPS = 0.02
"""The Trainers' ``logging_steps`` as a share of the training's steps (ceil(0.02 x steps) steps per logged loss):
about 50 points of a long training's loss curve, and one per step of a short one (a fixed 10 left the short
trainings of a small run one point or none)."""


def _fields_of(section: type, names: tuple[str, ...]):
    """A class decorator: the dataclass fields ``names`` of a pydantic config section -- type, default and help
    (``description``) -- added to a ``TrainingArguments`` subclass, which is then made a dataclass. The section
    stays the one definition of those fields."""

    def decorate(cls):
        annotations = dict(cls.__dict__.get("__annotations__", {}))
        for name in names:
            f = section.model_fields[name]
            annotations[name] = f.annotation
            setattr(cls, name, field(default=f.default, metadata={"help": f.description}))
        cls.__annotations__ = annotations
        return dataclass(cls)

    return decorate


@_fields_of(ActorTrainConfig, ActorTrainConfig.LOSS_FIELDS)
class WebRLConfig(TrainingArguments):
    """``TrainingArguments`` + the WebRL loss fields, the arguments of ``WebRLTrainer`` (TRL's ``XxxConfig``
    convention). The loss fields (``ActorTrainConfig.LOSS_FIELDS``: loss, kl, beta, beta_low, beta_high, lam,
    margin, paper_logratio, count_norm) are declared once, in the ``actor`` config section, and validated by it;
    ``from_settings`` maps the section's optimisation fields onto the ``TrainingArguments`` ones."""

    def __post_init__(self):
        super().__post_init__()
        ActorTrainConfig.model_validate({n: getattr(self, n) for n in ActorTrainConfig.LOSS_FIELDS})

    @classmethod
    def from_settings(cls, settings, out_dir: str | Path, max_steps: int | None = None) -> WebRLConfig:
        """The actor Trainer's arguments from the ``actor`` section of the settings."""
        a = settings.actor
        micro, accum = actor_micro_batches(settings)
        return _trainer_args(cls, Path(out_dir), settings, a.lr, a.epochs, micro, accum, a.max_grad_norm,
                             max_steps, **a.model_dump(include=set(ActorTrainConfig.LOSS_FIELDS)))


class TrainProgress(TrainerCallback):
    """One rich progress line per training: its name, steps done of all, elapsed time and the last logged loss."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.bar = None

    def on_train_begin(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            self.bar = Progress(TextColumn(f"[bold]train {self.name}"), BarColumn(), MofNCompleteColumn(),
                                TextColumn("{task.description}"), TimeElapsedColumn())
            self.bar.start()
            self.task = self.bar.add_task("", total=state.max_steps)

    def on_step_end(self, args, state, control, **kwargs):
        if self.bar is not None:
            self.bar.update(self.task, completed=state.global_step)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self.bar is not None and logs and "loss" in logs:
            self.bar.update(self.task, description=f"loss {logs['loss']:.4g}")

    def on_train_end(self, args, state, control, **kwargs):
        self.stop()

    def stop(self) -> None:
        if self.bar is not None:
            self.bar.stop()
            self.bar = None


def progress_callbacks(name: str) -> list:
    """The Trainers' progress display: one line of ours (``TrainProgress``); with ``webrl --verbose``, TRL's rich
    panel of every logged metric instead. The Trainer's own tqdm bar is off (``disable_tqdm=True``)."""
    if is_verbose():
        from trl.trainer.callbacks import RichProgressCallback

        return [RichProgressCallback()]
    return [TrainProgress(name)]


def fit(trainer: Trainer, stage: str | None = None, section=None):
    """``trainer.train()``; the progress display is stopped even when training raises. Without ``--verbose`` the
    Trainer's printed log dicts (``PrinterCallback``, added by ``disable_tqdm=True``) are dropped. ``stage`` and its
    config ``section`` (``batch_size``, ``grad_accum``, ``micro_batch_size``): where the section leaves the micro-batch
    empty and the stage trains in one CPU process, it is measured first (``micro_batch.calibrate``); its seconds are
    ``result.metrics["calibrate_s"]``, which the stages' ``train_s`` leaves out."""
    if not is_verbose():
        trainer.remove_callback(PrinterCallback)
    if (stage and micro_batch.enabled() and getattr(section, "micro_batch_size", None) is None
            and trainer.args.device.type == "cpu" and trainer.args.world_size == 1 and len(trainer.train_dataset)):
        t0 = time.perf_counter()
        micro_batch.calibrate(trainer, stage, section.batch_size, getattr(section, "grad_accum", 1))
        calibrate_s = time.perf_counter() - t0
    else:
        calibrate_s = 0.0
    try:
        result = trainer.train()
        result.metrics["calibrate_s"] = round(calibrate_s, 3)
        return result
    finally:
        for cb in trainer.callback_handler.callbacks:
            if isinstance(cb, TrainProgress):
                cb.stop()
            live = getattr(cb, "rich_group", None)  # RichProgressCallback's Live, None once on_train_end ran
            if live is not None:
                live.stop()


def _trainer_args(cls, out_dir: Path, settings, lr: float, epochs: float, batch_size: int, grad_accum: int,
                  max_grad_norm: float, max_steps: int | None, scheduler: str = "constant", warmup: float = 0,
                  **extra):
    device = resolve_device(settings.models.device)
    use_cpu = device.type == "cpu"
    extra = {**trainer_precision_args(settings.models, device), **extra}  # autocast over float32 master weights
    return cls(output_dir=str(out_dir / "trainer"), per_device_train_batch_size=batch_size,
               gradient_accumulation_steps=grad_accum, learning_rate=lr, num_train_epochs=epochs,
               max_steps=max_steps if max_steps else -1, lr_scheduler_type=scheduler, warmup_steps=warmup,
               weight_decay=0.01, max_grad_norm=max_grad_norm, logging_steps=LOGGING_STEPS, save_strategy="no",
               report_to="none", remove_unused_columns=False, use_cpu=use_cpu, seed=settings.run.seed,
               data_seed=settings.run.seed, disable_tqdm=True, dataloader_num_workers=0,
               train_sampling_strategy="group_by_length", **extra)  # less padding; uses the "length" column


def _micro_batches(section, models_device: str) -> tuple[int, int]:
    """(items per forward pass, accumulation steps) for ``batch_size`` x ``grad_accum`` items per optimizer step of
    a config section. On CPU the micro-batch the Trainer starts from is 1 (on an AVX2 box padded batches of mixed
    lengths cost more than they save: ``webrl bench train``), and ``fit`` then measures the fastest one on the box
    (``micro_batch.calibrate``); on an accelerator the whole batch goes in one pass. That ``micro_batch_size``
    divides ``batch_size`` is the config schema's check (``config.MicroBatched``)."""
    micro = section.micro_batch_size or (1 if resolve_device(models_device).type == "cpu" else section.batch_size)
    return micro, section.grad_accum * (section.batch_size // micro)


def actor_micro_batches(settings) -> tuple[int, int]:
    """``_micro_batches`` of the ``actor`` section (samples)."""
    return _micro_batches(settings.actor, settings.models.device)


def critic_micro_batches(settings) -> tuple[int, int]:
    """``_micro_batches`` of the ``critic`` section (distinct prompts)."""
    return _micro_batches(settings.critic, settings.models.device)


# ---------------------------------------------------------------------------------------------
# log-probs of actions (left padded: every sequence ends at the last column)

def action_logprobs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                    n_action: torch.Tensor) -> torch.Tensor:
    """Sum over the last n_action tokens of each left-padded row of log pi(token | prefix).

    Only the last max(n_action)+1 positions go through the LM head (``logits_to_keep``), so no [B, T, vocab]
    tensor is built for long prompts."""
    k = int(n_action.max())
    pos = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
    out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=pos, use_cache=False,
                logits_to_keep=k + 1)
    logits = out.logits[:, :-1].float()                      # position j predicts token j+1
    targets = input_ids[:, -k:]
    tok_logp = torch.log_softmax(logits, -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    keep = torch.arange(k, device=input_ids.device).unsqueeze(0) >= (k - n_action.to(input_ids.device)).unsqueeze(1)
    return (tok_logp * keep).sum(-1)


def encode_samples(tok, samples: list[dict], max_length: int) -> list[dict]:
    """Token ids of prompt + action + stop per sample (``models.encode_prompt_action``) and the action length."""
    rows = []
    for i, s in enumerate(samples):
        for key in ("observation", "action"):
            if not isinstance(s.get(key), str):
                raise ValueError(f"actor sample {i}: field {key!r} must be a string, got {type(s.get(key)).__name__}")
        enc = encode_prompt_action(tok, s["observation"], s["action"], max_length)
        rows.append({"input_ids": enc["input_ids"], "n_action": int(sum(enc["action_mask"]))})
    return rows


@torch.no_grad()
def sequence_logprobs(model, rows: list[dict], pad_id: int, batch_size: int = 8,
                      progress: bool = False) -> torch.Tensor:
    """Sum of action-token log-probs for encoded rows, batched by length, in eval mode without grad."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    out = torch.zeros(len(rows), dtype=torch.float32)
    order = sorted(range(len(rows)), key=lambda i: len(rows[i]["input_ids"]))
    batches = [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
    for idx in track(batches, description="reference log-probs", disable=not progress):
        ids, mask = left_pad([rows[i]["input_ids"] for i in idx], pad_id)
        n = torch.tensor([rows[i]["n_action"] for i in idx])
        out[idx] = action_logprobs(model, ids.to(device), mask.to(device), n).float().cpu()
    model.train(was_training)
    return out


# ---------------------------------------------------------------------------------------------
# the loss

def webrl_actor_loss(logp: torch.Tensor, ref_logp: torch.Tensor, n_tokens: torch.Tensor, adv: torch.Tensor,
                     mask: torch.Tensor, beta0: torch.Tensor, loss: str = "official", kl: bool = True,
                     paper_logratio: str = "sum", count_norm: str = "sample") -> tuple[torch.Tensor, dict]:
    """The actor loss of one micro-batch (module docstring); returns (loss, detached stats)."""
    n_tokens, adv, mask = n_tokens.to(logp), adv.to(logp), mask.to(logp)
    ref_logp, beta0 = ref_logp.to(logp), beta0.to(logp)
    diff = logp - ref_logp
    if not kl:
        nll = -(logp * mask).sum() / (n_tokens * mask).sum().clamp(min=1.0)
        return nll, {"log_ratio": (diff / n_tokens.clamp(min=1)).mean().item()}
    if loss == "paper":
        log_ratio = diff if paper_logratio == "sum" else diff / n_tokens.clamp(min=1.0)
        value = ((beta0 * log_ratio - adv) ** 2).mean()
        return value, {"log_ratio": log_ratio.detach().mean().item()}
    if count_norm == "batch":
        count = (n_tokens * mask).sum().clamp(min=1.0).expand_as(n_tokens)
    else:
        count = (n_tokens * mask).clamp(min=1.0)
    log_ratio = diff / count
    beta = adv_mod.cap_beta(beta0, adv, log_ratio)
    per_sample = F.smooth_l1_loss(beta * log_ratio, adv, reduction="none", beta=1.0) / beta * mask
    return per_sample.mean(), {"log_ratio": log_ratio.detach().mean().item(), "beta": beta.mean().item()}


class ActorCollator:
    """Left-pads input_ids; carries the precomputed per-sample columns as float tensors."""

    columns = ("ref_logp", "adv", "mask", "beta0")

    def __init__(self, pad_id: int):
        self.pad_id = pad_id

    def __call__(self, features: list[dict]) -> dict[str, torch.Tensor]:
        ids, mask = left_pad([f["input_ids"] for f in features], self.pad_id)
        batch = {"input_ids": ids, "attention_mask": mask,
                 "n_action": torch.tensor([f["n_action"] for f in features], dtype=torch.long)}
        for c in self.columns:
            batch[c] = torch.tensor([float(f[c]) for f in features], dtype=torch.float32)
        return batch


class WebRLTrainer(Trainer):
    """transformers.Trainer whose ``compute_loss`` is the WebRL actor loss on precomputed reference columns."""

    args: WebRLConfig

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.loss_is_scaled_for_ga = False  # our loss is a per-micro-batch mean: let Trainer divide by GA steps
        self._stats: dict[str, list[float]] = {}

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        logp = action_logprobs(model, inputs["input_ids"], inputs["attention_mask"], inputs["n_action"])
        a = self.args
        loss, stats = webrl_actor_loss(logp, inputs["ref_logp"], inputs["n_action"].float(), inputs["adv"],
                                       inputs["mask"], inputs["beta0"], loss=a.loss, kl=a.kl,
                                       paper_logratio=a.paper_logratio, count_norm=a.count_norm)
        for k, v in stats.items():
            self._stats.setdefault(k, []).append(v)
        return (loss, {"logp": logp}) if return_outputs else loss

    def log(self, logs: dict, *args, **kwargs):
        for k, v in self._stats.items():
            if v:
                logs[k] = sum(v) / len(v)
        self._stats = {}
        super().log(logs, *args, **kwargs)


# ---------------------------------------------------------------------------------------------
# precompute (sharded over processes under accelerate launch)

def _dist_map(fn, items: list, state=None) -> list:
    """fn(list) -> list, split across accelerate processes and gathered in the original order."""
    from accelerate import PartialState
    from accelerate.utils import gather_object

    state = state or PartialState()
    if state.num_processes == 1:
        return fn(items)
    indexed = list(enumerate(items))
    with state.split_between_processes(indexed) as mine:
        part = list(zip([i for i, _ in mine], fn([x for _, x in mine])))
    merged = dict(gather_object(part))
    return [merged[i] for i in range(len(items))]


def _process_device(settings) -> str:
    from accelerate import PartialState

    state = PartialState()
    return str(state.device) if state.num_processes > 1 else settings.models.device


def critic_values_for(samples: list[dict], critic: Critic, settings, progress: bool = True
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """(V(s), V(s')) for every sample, running the critic once per distinct prompt (no grad), in the actor's
    micro-batches (one prompt at a time on CPU, where that is fastest)."""
    prompts = sorted({s["observation"] for s in samples} | {s["next_observation"] for s in samples})
    micro, _ = actor_micro_batches(settings)

    def run(ps):
        return critic.values(ps, batch_size=micro, progress=progress)[0].tolist()

    v_of = dict(zip(prompts, _dist_map(run, prompts)))
    v = torch.tensor([v_of[s["observation"]] for s in samples])
    nv = torch.tensor([v_of[s["next_observation"]] for s in samples])
    return v, nv


def compute_advantages(samples: list[dict], v: torch.Tensor, nv: torch.Tensor, cfg: WebRLConfig
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """(A, mask) for every sample in the configured loss mode (mask = which samples train)."""
    reward = torch.tensor([float(s["reward"]) for s in samples])
    if cfg.loss == "official":
        mc = torch.tensor([float(s["mc_return"]) for s in samples])
        return adv_mod.official_advantage(v, nv, reward, mc, cfg.margin)
    done = torch.tensor([float(bool(s["done"])) for s in samples])
    a = adv_mod.paper_advantage(v, nv, reward, done, cfg.lam)
    mask = torch.ones_like(a) if cfg.kl else (a > 0).float()
    return a, mask


def _check_samples(samples: list[dict]) -> None:
    need = ("observation", "next_observation", "action", "reward", "done", "mc_return")
    for i, s in enumerate(samples):
        miss = [k for k in need if k not in s or s[k] is None]
        if miss:
            raise ValueError(f"actor sample {i} (episode {s.get('episode_id')!r}): missing field(s) {miss}")


# ---------------------------------------------------------------------------------------------
# saving under accelerate launch (one process saves; sharded weights are gathered first)

def _is_main_process() -> bool:
    from accelerate import PartialState

    return PartialState().is_main_process


def _sharded(distributed_type) -> bool:
    from accelerate.utils import DistributedType

    return distributed_type in (DistributedType.FSDP, DistributedType.DEEPSPEED)


def _load_full_state(model, state_dict: dict) -> None:
    """Load a gathered full state dict; keys missing from it must be tied to keys it has (e.g. lm_head)."""
    missing, unexpected = model.load_state_dict(state_dict, strict=False)
    owners: dict[int, set[str]] = {}
    tensors = list(model.named_parameters(remove_duplicate=False)) + list(model.named_buffers(remove_duplicate=False))
    for name, t in tensors:
        owners.setdefault(id(t), set()).add(name)
    by_name = {n: names for names in owners.values() for n in names}
    untied = [k for k in missing if not (by_name.get(k, set()) - {k}) & set(state_dict)]
    if untied or unexpected:
        raise RuntimeError(f"gathered state dict does not match the model: missing {untied[:8]}, "
                           f"unexpected {list(unexpected)[:8]}")


@contextmanager
def _whole_models():
    """Load models whole even when a DeepSpeed ZeRO-3 config is active (TrainingArguments registers it globally, and
    ``from_pretrained`` would then build ZeRO-3-partitioned models): the precompute runs the critic and the actor
    outside the DeepSpeed engine, which partitions the actor at ``prepare``. A no-op without DeepSpeed.
    (Untested: no GPU and no deepspeed where this was written.)"""
    from transformers.integrations import deepspeed as hf_ds

    ref = getattr(hf_ds, "_hf_deepspeed_config_weak_ref", None)
    if ref is None or ref() is None or not ref().is_zero3():
        yield
        return
    hf_ds._hf_deepspeed_config_weak_ref = None
    try:
        yield
    finally:
        hf_ds._hf_deepspeed_config_weak_ref = ref


def _full_model(trainer: Trainer, rebuild):
    """The trained model with its full weights on the main process, None on the others. Without sharding that
    is ``trainer.model``; under FSDP / DeepSpeed ZeRO-3 the full state dict is gathered (a collective: every rank
    must call this) and loaded into ``rebuild()``, a fresh CPU copy built like the trained one."""
    acc = trainer.accelerator
    if not _sharded(acc.distributed_type):
        return trainer.model if trainer.is_world_process_zero() else None
    state_dict = acc.get_state_dict(trainer.model_wrapped)
    if not acc.is_main_process:
        return None
    with _whole_models():
        model = rebuild()
    _load_full_state(model, state_dict)
    return model


def distributed_save_model(save, base_model_dir: str | Path, models_cfg):
    """Wrap ``models.save_model`` for code that calls it from every process after training (``orm.train_orm``):
    the main process saves, after the full weights are gathered under FSDP (into a CPU model rebuilt from
    ``base_model_dir``); under DeepSpeed ZeRO-3 the partitioned parameters are gathered in place."""
    from accelerate.state import AcceleratorState
    from accelerate.utils import DistributedType

    def saver(model, tokenizer, out_dir, *a, **kw):
        state = AcceleratorState()
        out = Path(out_dir)
        if state.distributed_type == DistributedType.FSDP:
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

            sd = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
            if state.is_main_process:
                full = load_causal_lm(base_model_dir, models_cfg.model_copy(update={"device": "cpu"}), trainable=True)
                _load_full_state(full, sd)
                out = save(full, tokenizer, out_dir, *a, **kw)
        elif state.distributed_type == DistributedType.DEEPSPEED:  # untested here: no GPU, no deepspeed
            import deepspeed

            with deepspeed.zero.GatheredParameters(list(model.parameters()), modifier_rank=None):
                if state.is_main_process:
                    out = save(model, tokenizer, out_dir, *a, **kw)
        elif state.is_main_process:
            out = save(model, tokenizer, out_dir, *a, **kw)
        state.wait_for_everyone()
        return out

    return saver


def _loss_curve(trainer: Trainer) -> list[list[float]]:
    """[step, loss] of every logged training step (mean over the logging window and, under DDP, the ranks)."""
    return [[h["step"], h["loss"]] for h in loss_history.history_entries(trainer.state.log_history)]


# ---------------------------------------------------------------------------------------------
# entry points

def train_actor(samples: list[dict], actor_dir: str | Path, out_dir: str | Path, settings,
                critic_dir: str | Path | None = None, max_steps: int | None = None, progress: bool = True) -> dict:
    """One actor epoch of WebRL on step samples (transitions.py); saves an HF folder at ``out_dir``.

    ``critic_dir`` is required for the KL losses; with ``actor.kl=False`` and no critic, the successful
    trajectories' steps are used (filtered BC). Returns timings and statistics (with the trainable and total
    parameter counts).

    The KL reference is the phase-start actor ``actor_dir``: its log-probs are computed by the freshly loaded model
    before the first update (with LoRA: a fresh, zero-initialised adapter on the merged ``actor_dir`` weights, so
    the model is exactly ``actor_dir``'s; see the module docstring), in the training forward's autocast."""
    _check_samples(samples)
    out_dir = Path(out_dir)
    cfg = WebRLConfig.from_settings(settings, out_dir, max_steps)
    t0 = time.perf_counter()
    if critic_dir is not None:
        with _whole_models():
            critic = Critic.load(critic_dir, dtype=settings.models.dtype, device=_process_device(settings),
                                 max_length=settings.models.max_length)
        t0 = time.perf_counter()  # timings exclude loading
        v, nv = critic_values_for(samples, critic, settings, progress)
        del critic  # freed before the actor is loaded: never two models in memory
        adv, mask = compute_advantages(samples, v, nv, cfg)
    elif not cfg.kl:
        v = nv = torch.zeros(len(samples))
        adv = torch.tensor([1.0 if float(s["trajectory_reward"] if "trajectory_reward" in s else s["reward"]) >= 0.5
                            else -0.6 for s in samples])
        mask = (adv > 0).float()
    else:
        raise ValueError("train_actor: critic_dir is required for the KL-constrained loss (actor.kl=True)")
    t_critic = time.perf_counter() - t0

    tok = load_tokenizer(actor_dir)
    models_cfg = settings.models.model_copy(update={"device": _process_device(settings)})
    set_seed(settings.run.seed)  # LoRA adapter init draws from the global RNG
    with _whole_models():
        model = load_causal_lm(actor_dir, models_cfg, trainable=True)
    keep = [i for i in range(len(samples)) if mask[i] > 0]  # masked-out samples add 0 loss and 0 gradient
    rows = encode_samples(tok, [samples[i] for i in keep], settings.models.max_length)
    t1 = time.perf_counter()
    micro = cfg.per_device_train_batch_size  # actor_micro_batches, resolved once in WebRLConfig.from_settings

    def ref_pass(r):  # in the training forward's autocast, so log_ratio is 0 before the first update
        with autocast_context(models_cfg, next(model.parameters()).device):
            return sequence_logprobs(model, r, tok.pad_token_id, micro, progress).tolist()

    ref_logp = torch.tensor(_dist_map(ref_pass, rows)) if rows else torch.zeros(0)
    t_ref = time.perf_counter() - t1
    n_tok = torch.tensor([r["n_action"] for r in rows], dtype=torch.float32)
    adv_k, mask_k = adv[keep], mask[keep]
    ref_prob = adv_mod.reference_prob(ref_logp, n_tok)
    if cfg.loss == "official":
        beta0 = adv_mod.official_beta(adv_k, ref_prob, cfg.beta_low, cfg.beta_high)
    else:
        beta0 = torch.full_like(adv_k, cfg.beta)
    for j, r in enumerate(rows):
        r.update(ref_logp=float(ref_logp[j]), adv=float(adv_k[j]), mask=float(mask_k[j]), beta0=float(beta0[j]),
                 length=len(r["input_ids"]))

    stats = {"n_samples": len(samples), "n_train": len(rows), "n_positive": int((adv > 0).sum()),
             "critic_s": round(t_critic, 3), "ref_s": round(t_ref, 3),
             "mean_v": float(v.mean()) if len(v) else 0.0, "mean_ref_prob": float(ref_prob.mean()) if len(rows) else 0.0,
             "loss_mode": cfg.loss if cfg.kl else "sft", **count_parameters(model)}
    if not rows:
        if _is_main_process():
            save_model(model, tok, out_dir)
        return stats | {"train_s": 0.0, "train_loss": None, "steps": 0, "tokens": 0, "tokens_sq": 0,
                        "epochs": cfg.num_train_epochs, "loss_curve": []}
    from datasets import Dataset

    trainer = WebRLTrainer(model=model, args=cfg, train_dataset=Dataset.from_list(rows),
                           data_collator=ActorCollator(tok.pad_token_id), callbacks=progress_callbacks("actor"))
    t2 = time.perf_counter()
    result = fit(trainer, "actor", settings.actor)
    t_train = time.perf_counter() - t2 - result.metrics["calibrate_s"]
    full = _full_model(trainer, lambda: load_causal_lm(actor_dir, models_cfg.model_copy(update={"device": "cpu"}),
                                                       trainable=True))
    if full is not None:
        save_model(full, tok, out_dir)
        loss_history.write(out_dir, "actor", trainer.state)
    trainer.accelerator.wait_for_everyone()
    lengths = [len(r["input_ids"]) for r in rows]
    return stats | {"train_s": round(t_train, 3), "calibrate_s": result.metrics["calibrate_s"],
                    "train_loss": result.training_loss, "steps": result.global_step,
                    "tokens": sum(lengths), "tokens_sq": sum(n * n for n in lengths), "epochs": cfg.num_train_epochs,
                    "loss_curve": _loss_curve(trainer)}


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
    result = fit(trainer, "critic", settings.critic)
    train_s = time.perf_counter() - t0 - result.metrics["calibrate_s"]

    full = _full_model(trainer, lambda: build("cpu"))
    if full is not None:
        full.save(out_dir)
        loss_history.write(out_dir, "critic", trainer.state)
    trainer.accelerator.wait_for_everyone()
    labels = [e["label"] for e in examples]
    lengths = [r["length"] for r in rows]
    return {"n_samples": len(samples), "n_prompts": len(examples), "positive_share": sum(labels) / max(len(labels), 1),
            "train_s": round(train_s, 3), "calibrate_s": result.metrics["calibrate_s"],
            "train_loss": result.training_loss, "steps": result.global_step,
            "tokens": int(sum(lengths) * c.epochs), "tokens_sq": int(sum(n * n for n in lengths) * c.epochs),
            **counts, "loss_curve": _loss_curve(trainer)}


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
    from trl import SFTConfig

    from webrl_core.learn.sft_trainer import SelectedLogitsSFTTrainer

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
    result = fit(trainer, "sft", settings.actor)
    train_s = time.perf_counter() - t0 - result.metrics["calibrate_s"]
    full = _full_model(trainer, lambda: load_causal_lm(model_dir, models_cfg.model_copy(update={"device": "cpu"}),
                                                       trainable=True))
    if full is not None:
        save_model(full, tok, out_dir)
        loss_history.write(out_dir, "sft", trainer.state)
    trainer.accelerator.wait_for_everyone()
    return {"n_pairs": len(pairs), "train_s": round(train_s, 3), "calibrate_s": result.metrics["calibrate_s"],
            "train_loss": result.training_loss,
            "steps": result.global_step, "tokens": int(sum(len(r["input_ids"]) for r in rows) * epochs),
            **counts, "loss_curve": _loss_curve(trainer)}


__all__ = ["WebRLConfig", "WebRLTrainer", "CriticTrainer", "webrl_actor_loss", "action_logprobs",
           "sequence_logprobs", "encode_samples", "compute_advantages", "critic_values_for", "train_actor",
           "train_critic", "sft_train", "fit", "progress_callbacks"]

"""What the WebRL trainers share (``webrl_trainer``, ``critic_trainer``, ``sft_trainer``, and ``orm``): their
``TrainingArguments``, their progress display and run, and the data-parallel precompute and saving under
``accelerate launch``.

Arguments (``_trainer_args``): defaults follow the paper (constant LR, 1 epoch, grad clip 1.0, AdamW weight decay
0.01; the SFT's cosine schedule with 10% warm-up); a config section's ``batch_size`` x ``grad_accum`` becomes a
micro-batch and its accumulation (``_micro_batches``: 1 on CPU, where ``fit`` then measures the fastest one, the
whole batch on an accelerator). A training logs about ``1 / LOGGING_STEPS`` points, every optimizer step when it
has fewer; each trainer returns them as ``loss_curve`` (``_loss_curve``: the Trainer's logged [step, loss] pairs,
the loss of a logged step averaged over the logging window and the ranks) and writes them into the model folder it
saves (``webrl_core.runs.loss_history``: ``loss_history.json``).

Precision (every trainer: SFT, actor, critic, and the ORM via ``models``): with ``models.dtype`` bfloat16/float16
the trained model holds float32 master weights (``models.training_dtype``; with LoRA only the adapters and the
critic's heads, over a frozen base in the low dtype) and the Trainer runs forward and backward under autocast in
the low dtype (``models.trainer_precision_args``: ``bf16``/``fp16`` in the ``TrainingArguments``; fp16 needs a
GPU). Under ``accelerate launch`` the launcher passes the matching ``--mixed_precision`` (FSDP2: bf16 param/reduce
policy over float32 sharded masters; DeepSpeed: its bf16/fp16 optimizer with float32 masters). Frozen passes run
in ``models.dtype`` (the critic precompute) or in the training autocast (the reference log-probs, so that
log_ratio is exactly 0 before the first update). Memory for an 8B actor + critic: ``webrl bench memory``.

Progress: rich, for our loops (``rich.progress``) and for the Trainers (``TrainProgress``: one line per training;
TRL's ``RichProgressCallback`` with ``webrl --verbose``).

Scaling out: ``webrl_core.scale.launch`` runs ``train_actor`` / ``train_critic`` / ``sft_train`` (and
``orm.train_orm``) as ``accelerate launch`` jobs (``training.launcher: accelerate``; configs in
``infra/accelerate/``: DDP, FSDP, DeepSpeed ZeRO-3 with CPU offload). Every rank reads the same data and builds the
same model (same seed); the Trainer shards the batches, so data sharding, gradient sync and clipping come from
Trainer/accelerate. A precompute is split across the processes and gathered (``_dist_map``, through
``accelerate.PartialState``). The model is saved once, by the main process, after gathering the full weights under
FSDP / DeepSpeed ZeRO-3 (``_full_model``: a collective, every rank calls it; ``distributed_save_model`` for
``orm.train_orm``, which saves from every process).
"""

from __future__ import annotations

import contextlib
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from transformers import Trainer, TrainerCallback
from transformers.trainer_callback import PrinterCallback

from webrl_core.learn import box_measurements, frozen_prefix, micro_batch
from webrl_core.learn.model_flops import rates_around
from webrl_core.learn.models import (attention_of, compile_layers, load_causal_lm, resolve_device,
                                     trainer_precision_args)
from webrl_core.logs import is_verbose
from webrl_core.runs import loss_history


# ---------------------------------------------------------------------------------------------
# the Trainers' arguments

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
# progress and running

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


def fit(trainer: Trainer, stage: str | None = None, section=None, attention: str = "auto", before_train=None,
        compile_setting: str = "off", weight_casts: str = "per_micro_batch", compute_dtype: str | None = None):
    """``trainer.train()``; the progress display is stopped even when training raises. Without ``--verbose`` the
    Trainer's printed log dicts (``PrinterCallback``, added by ``disable_tqdm=True``) are dropped. ``stage`` and its
    config ``section`` (``batch_size``, ``grad_accum``, ``micro_batch_size``): where the section leaves the micro-batch
    empty and the stage trains in one CPU process, it is measured first (``micro_batch.calibrate``); its seconds are
    ``result.metrics["calibrate_s"]``, which the stages' ``train_s`` leaves out; the shape it trained at is
    ``result.metrics["micro_batch_size"]`` and ``["attention"]`` (``trained_shape``). ``attention``:
    ``models.attn_implementation`` (``auto``: the calibration measures the attention kernels too).
    ``before_train(trainer)`` runs after the calibration, before the first step: a pass that must see the model as
    it will train (the actor's reference log-probs) goes there. ``compile_setting``: ``models.compile_layers``,
    applied after the calibration (which then times the eager layers and compiles nothing);
    ``result.metrics["compiled_layers"]`` says whether it compiled. ``weight_casts``: ``models.weight_casts``
    (``per_step``: :func:`weight_casts_per_step` around the training of layers that run eager).
    ``result.metrics["cached"]``: what the training looked up in ``frozen_prefix``'s cache (its token counts);
    ``["peak_flops"]``: with ``compute_dtype`` (``models.dtype``) and calibration on, the box's matmul peak in that
    dtype, the better of a measurement just before the first step and one after the last (``model_flops``), and
    ``["copy_bytes_per_s"]`` the copy bandwidth beside it (a slow hour on a shared host can move bytes slowly while
    the matrix units keep their rate); their seconds count in ``calibrate_s``."""
    if not is_verbose():
        trainer.remove_callback(PrinterCallback)
    fixed = getattr(section, "micro_batch_size", None)
    if (stage and box_measurements.enabled() and (fixed is None or attention == "auto")
            and trainer.args.device.type == "cpu" and trainer.args.world_size == 1 and len(trainer.train_dataset)):
        t0 = time.perf_counter()
        micro_batch.calibrate(trainer, stage, section.batch_size, getattr(section, "grad_accum", 1), attention,
                              fixed)
        calibrate_s = time.perf_counter() - t0
    else:
        calibrate_s = 0.0
    micro = trainer.args.per_device_train_batch_size
    passes = micro_batch.trained_items(trainer, len(trainer.train_dataset)) // max(1, micro)
    compiled = compile_layers(trainer.model, compile_setting, passes)
    try:
        if before_train is not None:
            before_train(trainer)
        # compiled layers cast inside their own code (and ran 1.6x slower in the outer context: 74 against 46 s for
        # the demo's first 30 SFT steps)
        per_step = weight_casts == "per_step" and not compiled
        # the box's rates in one process only: the ranks of a launch would measure each other's load
        with rates_around(compute_dtype, str(trainer.args.device), trainer.args.world_size == 1) as rates:
            looked_up = frozen_prefix.stats()
            with weight_casts_per_step(trainer) if per_step else contextlib.nullcontext():
                result = trainer.train()
            result.metrics["cached"] = frozen_prefix.tokens_since(looked_up)
        result.metrics["peak_flops"], result.metrics["copy_bytes_per_s"] = rates.peak_flops, rates.copy_bytes_per_s
        calibrate_s += rates.measure_s
        result.metrics["calibrate_s"] = round(calibrate_s, 3)
        result.metrics["micro_batch_size"] = trainer.args.per_device_train_batch_size
        result.metrics["attention"] = attention_of(trainer.model) or ""
        result.metrics["compiled_layers"] = int(compiled)
        return result
    finally:
        for cb in trainer.callback_handler.callbacks:
            if isinstance(cb, TrainProgress):
                cb.stop()
            live = getattr(cb, "rich_group", None)  # RichProgressCallback's Live, None once on_train_end ran
            if live is not None:
                live.stop()


def passes_over_rows(trainer: Trainer, global_step: int, n_rows: int) -> float:
    """How many times the finished training passed over its ``n_rows`` rows: its epochs, or, where ``max_steps``
    cut it, the optimizer steps it ran times their rows (every process's) over ``n_rows``. A stage's FLOPs are its
    rows' lengths summed this many times (``model_flops.lengths_sums``); a run of 8 steps over a 400-row set passed
    over a fraction of the rows, not their epochs."""
    args = trainer.args
    if not args.max_steps or args.max_steps <= 0 or not n_rows:
        return float(args.num_train_epochs)
    rows = global_step * args.per_device_train_batch_size * args.gradient_accumulation_steps * args.world_size
    return rows / n_rows


class _DropCastsAfterStep(TrainerCallback):
    """Autocast's cast cache emptied after every optimizer step: the trained weights have just changed."""

    def on_optimizer_step(self, args, state, control, **kwargs):
        torch.clear_autocast_cache()


@contextmanager
def weight_casts_per_step(trainer: Trainer):
    """Each trained float32 weight cast to the autocast dtype once per optimizer step, not once per micro-batch.

    Autocast keeps the low-precision copy of a float32 leaf tensor that requires grad (a trained weight) for reuse,
    and empties that cache when its outermost context exits; the Trainer enters one per micro-batch's forward, so
    with gradient accumulation every micro-batch casts every trained weight again (on a CPU: reading 4 and writing
    2 bytes per parameter, 42.5M parameters for SmolLM2's top 12 layers). Inside an outer context that leaves
    autocast off (a disabled context counts in the nesting as well) the micro-batches' forwards share the copies,
    and ``_DropCastsAfterStep`` empties the cache after each optimizer step. The backward passes run outside
    autocast as before; each micro-batch's gradient still flows through the cast to the float32 weight."""
    callback = _DropCastsAfterStep()
    trainer.add_callback(callback)
    try:
        with torch.autocast(trainer.args.device.type, enabled=False):
            yield
    finally:
        trainer.remove_callback(callback)
        torch.clear_autocast_cache()


def trained_shape(result) -> dict:
    """What ``fit`` trained at, for a stage's stats (MLflow: the micro-batch a metric, the kernel a tag), and the
    box's matmul peak and copy bandwidth it measured (``peak_flops``, ``copy_bytes_per_s``: absent when it measured
    none)."""
    peak = {k: result.metrics[k] for k in ("peak_flops", "copy_bytes_per_s") if result.metrics.get(k)}
    return {k: result.metrics[k] for k in ("calibrate_s", "micro_batch_size", "attention", "compiled_layers")} | peak


def _loss_curve(trainer: Trainer) -> list[list[float]]:
    """[step, loss] of every logged training step (mean over the logging window and, under DDP, the ranks)."""
    return [[h["step"], h["loss"]] for h in loss_history.history_entries(trainer.state.log_history)]


# ---------------------------------------------------------------------------------------------
# data-parallel precompute (sharded over processes under accelerate launch)

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

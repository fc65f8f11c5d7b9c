"""The micro-batch and attention kernel of a training stage, chosen by measurement on the box it runs on.

An optimizer step of ``batch_size`` items runs as forward/backward passes of ``m`` items, ``m`` a divisor of
``batch_size``, gradient accumulation making up the rest: the step is the same for every ``m`` (each pass's loss is
its items' mean, divided by the accumulation steps), only its speed differs, and which ``m`` is fastest depends on
the box. On an AVX2 CPU in float32 one sequence per pass wins: padding costs more than batching saves
(``webrl bench train``); on a CPU with a bf16 matrix unit (AMX), larger passes feed the unit. The attention kernel
is the same kind of choice (``models.attn_implementation: auto``): the same softmax(QK^T/sqrt(d))V up to rounding,
by PyTorch's fused CPU kernel (sdpa) or by two batched matmuls and a softmax in the compute dtype ("matmul",
:mod:`webrl_core.learn.matmul_attention`, which itself hands long sequences to sdpa). On a 2-core AMX Xeon the fused
kernel's backward ran at about 85 GFLOP/s while the matmuls ran near the box's bf16 peak, and which kernel won
depended on the stage (transformers' eager, then the matmul candidate, for the actor stage; sdpa for the SFT and
the critic; docs/benchmarks.md).

So where a stage trains on a CPU and ``actor.micro_batch_size`` / ``critic.micro_batch_size`` is empty (or set and
the kernel ``auto``: then only the kernels are candidates), ``calibrate`` times each candidate (``m``, kernel) on
the stage's own data with the stage's own ``Trainer.training_step`` (forward, loss and backward under its autocast;
no optimizer step, gradients cleared, the RNG state restored, so the training that follows is the one an
uncalibrated run would do). The candidates are interleaved: round r draws ``max m`` items of one optimizer step as
the stage's length-grouped sampler forms it (seeded; ``sampler_draw``), and every candidate passes over those same
items in passes of its ``m``; round 0 is the warm-up (kernel selection, allocations), then ``REPS`` timed rounds (a
candidate more than ``PRUNE`` slower than a round's best leaves the rounds after it). A box whose speed drifts from
minute to minute (a shared VM: 2-4x seen on the AMX Xeon) then shifts every candidate of a round alike instead of
favouring whichever ran in a fast minute. A candidate's rate is its median over the rounds, in trained tokens per
second; the fastest wins, and ties within ``TIE`` go to the smaller ``m`` (less memory, less padding) and then to
the default kernel. The choice is kept in ``~/.cache/webrl/micro-batch.json`` per CPU, threads, stage, model shape,
dtype, trained parameters, batch size, length bucket and kernel setting, so a box measures each shape once. A stage
that would pass over fewer than ``PAYS`` times the items measuring takes (a small phase's critic, a small ORM:
measuring would cost about what the stage does) is not measured and trains at the default shape, unless one is kept.

``WEBRL_CALIBRATE=0`` keeps the fixed CPU default (micro-batch 1, the loaded kernel), as the test suite does for its
exact comparisons.
"""

from __future__ import annotations

import hashlib
import json
import random
import statistics
import time
from pathlib import Path
from typing import Callable, Sequence

import torch

from webrl_core.artifacts import user_cache_dir
from webrl_core.learn import frozen_prefix
from webrl_core.learn.box_measurements import enabled, keep, read_kept
from webrl_core.learn.models import attention_of, set_attention

REPS = 3
TIE = 0.05
PRUNE = 0.25  # a candidate this much slower than a round's best is not measured again
MAX_MICRO = 16
SCORING_BATCHES = (1, 2, 4, 8)
PAYS = 2  # a stage or scoring pass is measured only when it passes over this many times the items measuring takes
KERNELS = ("matmul", "sdpa")  # models.attn_implementation: auto measures these (both run on every CPU build)


def cache_file() -> Path:
    return user_cache_dir() / "micro-batch.json"


def candidates(batch_size: int, n_items: int) -> list[int]:
    """Divisors of ``batch_size`` up to ``MAX_MICRO`` and ``n_items`` (1 always)."""
    return [m for m in range(1, min(batch_size, MAX_MICRO) + 1) if batch_size % m == 0 and (m == 1 or m <= n_items)]


def kernels(model, setting: str) -> list[str]:
    """The attention kernels to measure: ``KERNELS`` (the loaded one first) under ``auto`` when the model runs one
    of them, else only the one it runs (a kernel set by name, or a model without a choice)."""
    loaded = attention_of(model)
    if setting != "auto" or loaded not in KERNELS:
        return [loaded]
    return [loaded] + [k for k in KERNELS if k != loaded]


def _key(model, stage: str, lengths: list[int], *more) -> str:
    """The cache key of a measurement: CPU, threads, stage, model shape, trained parameters, the median length's
    power-of-2 bucket, and what else the choice depends on (``more``)."""
    from webrl_core.hardware import cpu_summary

    cfg = getattr(model, "config", None) or getattr(getattr(model, "backbone", None), "config", None)
    shape = {k: getattr(cfg, k, None) for k in ("model_type", "hidden_size", "intermediate_size",
                                                "num_hidden_layers", "vocab_size")}
    trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
    median = sorted(lengths)[len(lengths) // 2]
    blob = json.dumps([cpu_summary(), torch.get_num_threads(), stage, shape, trained,
                       1 << max(0, median - 1).bit_length(), *more], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _label(m: int, kernel: str | None) -> str:
    return f"{m}/{kernel}"


def _passes(trainer, items: list[dict], m: int, kernel: str | None) -> tuple[float, int]:
    """Seconds and trained tokens of ``items`` in forward/backward passes of ``m`` under ``kernel``."""
    model = trainer.model
    if kernel is not None:
        set_attention(model, kernel)
    seconds, tokens = 0.0, 0
    for i in range(0, len(items), m):
        group = items[i:i + m]
        inputs = trainer._prepare_inputs(trainer.data_collator(group))
        t0 = time.perf_counter()
        with trainer.accelerator.autocast():  # the train loop's own autocast starts with train(), not before
            trainer.training_step(model, inputs)
        seconds += time.perf_counter() - t0
        tokens += sum(len(r["input_ids"]) for r in group)
        model.zero_grad(set_to_none=True)
    return seconds, tokens


def measured_items(cands: list[tuple], size: int) -> int:
    """Items a measurement of ``cands`` passes over (at most: pruning drops some): each candidate's warm-up of its
    first ``c[0]`` items, then ``REPS`` rounds of ``size`` items per candidate (``round_robin``)."""
    return sum(c[0] for c in cands) + REPS * len(cands) * size


def trained_items(trainer, n_rows: int) -> int:
    """Items the stage's ``trainer.train()`` will pass over: ``max_steps`` optimizer steps of the effective batch, or
    its epochs over ``n_rows``."""
    args = trainer.args
    if args.max_steps and args.max_steps > 0:
        return args.max_steps * args.per_device_train_batch_size * args.gradient_accumulation_steps
    return int(args.num_train_epochs * n_rows)


def _training_rounds(ms: list[int], ks: list[str | None], n_rows: int) -> tuple[list[tuple], int]:
    """The (m, kernel) candidates a training stage's measurement times and the items each of its rounds draws."""
    return [(m, k) for k in ks for m in ms], min(max(ms), n_rows)


def sampler_draw(rows: list[dict], size: int, batch_size: int, seed: int) -> list[dict]:
    """``size`` items as the training stage's sampler puts them in one optimizer step: transformers'
    ``get_length_grouped_indices`` (``train_sampling_strategy="group_by_length"``, ``trainer_utils._trainer_args``)
    sorts random mega-batches of up to 50 steps by length, so a step's ``batch_size`` items have about one length;
    of a step drawn at random (seeded), its first ``size``. A plain random sample pads every pass of ``m > 1`` to
    its longest item, padding the training never runs: on the demo's SFT data (SmolLM2, bf16) micro-batch 4 measured
    715 trained tokens/s on random draws and 1,122 on sampler steps (docs/benchmarks.md)."""
    from transformers.trainer_pt_utils import get_length_grouped_indices

    lengths = [len(r["input_ids"]) for r in rows]
    order = get_length_grouped_indices(lengths, batch_size, generator=torch.Generator().manual_seed(seed))
    steps = max(1, len(order) // batch_size)
    start = random.Random(seed).randrange(steps) * batch_size
    return sorted((rows[i] for i in order[start:start + size]), key=lambda x: len(x["input_ids"]))


def measure(trainer, rows: list[dict], ms: list[int], ks: list[str | None],
            batch_size: int | None = None) -> dict[tuple[int, str | None], float]:
    """Median trained tokens/s of every (m, kernel) over ``REPS`` interleaved rounds after a warm-up pass each
    (module docstring); each round's items one optimizer step's of ``batch_size`` (``sampler_draw``)."""
    if not hasattr(trainer, "current_gradient_accumulation_steps"):  # set by the training loop, read by the step
        trainer.current_gradient_accumulation_steps = 1
    cands, size = _training_rounds(ms, ks, len(rows))
    draws = [sampler_draw(rows, size, max(size, batch_size or size), r) for r in range(REPS + 1)]
    return round_robin(cands, draws, lambda items, c: _passes(trainer, items, *c), prune=True)


def round_robin(cands: list, draws: list[list], run: Callable[[list, object], tuple[float, float]],
                 prune: bool) -> dict:
    """Median rate (units/s) of every candidate ``c`` over the timed rounds ``draws[1:]``: ``run(items, c)`` returns
    (seconds, units) of ``c`` over a round's items; ``draws[0]``'s first ``c[0]`` items are its warm-up. ``prune``:
    a candidate ``PRUNE`` slower than a round's best leaves the rounds after it. Every candidate meets the frozen
    layers' cache as the measurement found it (``frozen_prefix.no_new_rows``)."""
    rates: dict = {c: [] for c in cands}
    with frozen_prefix.no_new_rows():
        for c in cands:
            run(draws[0][:c[0]], c)
        for items in draws[1:]:
            for c in cands:
                seconds, units = run(items, c)
                rates[c].append(units / seconds if seconds else 0.0)
            if prune:
                best = max(rates[c][-1] for c in cands)
                cands = [c for c in cands if rates[c][-1] >= (1 - PRUNE) * best]
    return {c: statistics.median(r) for c, r in rates.items()}


def calibrate(trainer, stage: str, batch_size: int, grad_accum: int, kernel_setting: str = "auto",
              micro_batch_size: int | None = None) -> int:
    """The fastest micro-batch and attention kernel for ``trainer``'s stage on this box (module docstring), applied
    to its model and arguments (per-device batch and accumulation steps) before it trains; returns the
    micro-batch. ``micro_batch_size``: the section's, set by hand (only the kernel is measured)."""
    rows = [trainer.train_dataset[i] for i in range(len(trainer.train_dataset))]
    ms = [micro_batch_size] if micro_batch_size else candidates(batch_size, len(rows))
    ks = kernels(trainer.model, kernel_setting)
    micro, kernel = ms[0], ks[0]
    if len(ms) * len(ks) > 1:
        key = _key(trainer.model, stage, [len(r["input_ids"]) for r in rows], trainer.args.bf16, batch_size,
                   kernel_setting, "sampler_draw", "no_new_rows", ks)  # measured otherwise before: again
        entry = read_kept(cache_file()).get(key)
        if entry is not None and entry.get("micro") in ms and entry.get("attention") in ks:  # kept
            micro, kernel = entry["micro"], entry["attention"]
        elif ((items := trained_items(trainer, len(rows)))
              < (need := PAYS * measured_items(*_training_rounds(ms, ks, len(rows))))):  # would cost what it saves
            print(f"{stage}: micro-batch {micro}, {kernel} attention, not measured: the stage passes over {items} "
                  f"items, measuring pays from {need}", flush=True)
        else:
            with torch.random.fork_rng(devices=[]):  # the training that follows draws what it would have drawn
                rates = measure(trainer, rows, ms, ks, batch_size * grad_accum)
            best = max(rates.values())
            micro, kernel = min((c for c, r in rates.items() if r >= (1 - TIE) * best),
                                key=lambda c: (c[0], ks.index(c[1])))
            entry = {"micro": micro, "attention": kernel, "stage": stage, "batch_size": batch_size,
                     "tokens_per_s": {_label(*c): round(r, 1) for c, r in rates.items()},
                     "measured": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
            keep(cache_file(), key, entry)
            print(f"{stage}: micro-batch {micro} of {batch_size}, {kernel} attention, by measurement here ("
                  + ", ".join(f"{_label(*c)}: {r:.0f}" for c, r in rates.items()) + f" tokens/s; kept in "
                  f"{cache_file()})", flush=True)
    if kernel is not None:
        set_attention(trainer.model, kernel)
    trainer.args.per_device_train_batch_size = micro
    trainer.args.gradient_accumulation_steps = grad_accum * (batch_size // micro)
    trainer._train_batch_size = micro  # the Trainer read it from the arguments when built
    return micro


def scoring_batch(stage: str, model, lengths: Sequence[int], score: Callable[[list[int], int], object],
                  default: int) -> int:
    """The fastest batch of a forward-only scoring pass on this box (the critic's values, the ORM's P(YES), the
    replay's 1/PPL): ``score(indices, b)`` scores those items, of ``lengths``, in length-sorted batches of ``b``.
    Candidates ``SCORING_BATCHES`` up to the item count, measured in interleaved rounds as ``calibrate`` measures
    (each round's items scored by every candidate; the median rate over ``REPS`` rounds after a warm-up; ties to
    the smaller batch); kept per CPU, threads, stage, model shape, dtype and length bucket. Without a measurement
    (calibration off, not a CPU, or a pass too small to pay for measuring it, ``PAYS``, and none kept):
    ``default``."""
    param = next(model.parameters())
    bs = [b for b in SCORING_BATCHES if b <= len(lengths)]
    if not enabled() or param.device.type != "cpu" or len(bs) < 2:
        return default
    # "no_new_rows": kept entries of before, when later candidates met the rows the first one kept, are measured again
    key = _key(model, f"score:{stage}", list(lengths), str(param.dtype), attention_of(model), "no_new_rows")
    entry = read_kept(cache_file()).get(key)
    if entry is None or entry.get("batch") not in bs:
        size = max(bs)
        if len(lengths) < PAYS * measured_items([(b,) for b in bs], size):
            return default
        draws = [sorted(random.Random(r).sample(range(len(lengths)), size), key=lambda i: lengths[i])
                 for r in range(REPS + 1)]
        def timed(items, c):
            t0 = time.perf_counter()
            score(items, c[0])
            return max(time.perf_counter() - t0, 1e-9), sum(lengths[i] for i in items)

        median = {c[0]: r for c, r in round_robin([(b,) for b in bs], draws, timed, prune=False).items()}
        best = max(median.values())
        batch = min(b for b, r in median.items() if r >= (1 - TIE) * best)
        entry = {"batch": batch, "stage": f"score:{stage}", "rates": {str(b): round(r, 1) for b, r in median.items()},
                 "measured": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        keep(cache_file(), key, entry)
        print(f"{stage}: scoring batch {batch} by measurement here (" + ", ".join(f"{b}: {r:.0f}" for b, r in
              median.items()) + f" length units/s; kept in {cache_file()})", flush=True)
    return entry["batch"]

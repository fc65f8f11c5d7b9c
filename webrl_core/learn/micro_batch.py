"""The micro-batch of a training stage, chosen by measurement on the box it runs on.

An optimizer step of ``batch_size`` items runs as forward/backward passes of ``m`` items, ``m`` a divisor of
``batch_size``, gradient accumulation making up the rest: the step is the same for every ``m`` (each pass's loss is
its items' mean, divided by the accumulation steps), only its speed differs, and which ``m`` is fastest depends on
the box. On an AVX2 CPU in float32 one sequence per pass wins: padding costs more than batching saves
(``webrl bench train``); on a CPU with a bf16 matrix unit (AMX), larger passes feed the unit (a probe of the SFT step
on a 2-core AMX Xeon: 53, 100 and 155 tokens/s at m = 1, 4 and 8); on a GPU the whole batch goes in one pass.

So where ``actor.micro_batch_size`` / ``critic.micro_batch_size`` is empty and the stage trains on a CPU,
``calibrate`` times each candidate ``m`` on the stage's own data with the stage's own ``Trainer.training_step``
(forward, loss and backward under its autocast; no optimizer step, gradients cleared, the RNG state restored, so
the training that follows is the one an uncalibrated run would do): one warm-up pass, then ``REPS`` timed passes of
``m`` items drawn by a seeded sample and grouped by length as the length-grouped sampler groups them, in ascending
``m``, stopping at the first ``m`` more than ``STOP`` slower than the best so far (larger passes only pad more then:
on the AVX2 box that spares the most expensive candidates). The fastest ``m`` in trained tokens per second wins; ties
within ``TIE`` go to the smaller one (less memory, less padding). The
choice is kept in ``~/.cache/webrl/micro-batch.json`` per CPU, threads, stage, model shape, dtype, trained
parameters, batch size and length bucket, so a box measures each shape once.

``WEBRL_CALIBRATE=0`` keeps the fixed CPU default (1), as the test suite does for its exact comparisons.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import time
from pathlib import Path

import torch

from webrl_core.artifacts import replace_text, user_cache_dir

CALIBRATE_ENV = "WEBRL_CALIBRATE"
REPS = 2
TIE = 0.05
STOP = 0.15
MAX_MICRO = 16


def cache_file() -> Path:
    return user_cache_dir() / "micro-batch.json"


def enabled() -> bool:
    return os.environ.get(CALIBRATE_ENV, "1") not in ("0", "false", "no")


def candidates(batch_size: int, n_items: int) -> list[int]:
    """Divisors of ``batch_size`` up to ``MAX_MICRO``, each with enough items for a warm-up and ``REPS`` passes
    (1 always)."""
    return [m for m in range(1, min(batch_size, MAX_MICRO) + 1)
            if batch_size % m == 0 and (m == 1 or m * (REPS + 1) <= n_items)]


def _key(trainer, stage: str, batch_size: int, lengths: list[int]) -> str:
    from webrl_core.hardware import cpu_summary

    model = trainer.model
    cfg = getattr(model, "config", None) or getattr(getattr(model, "backbone", None), "config", None)
    shape = {k: getattr(cfg, k, None) for k in ("model_type", "hidden_size", "intermediate_size",
                                                "num_hidden_layers", "vocab_size")}
    trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
    median = sorted(lengths)[len(lengths) // 2]
    blob = json.dumps([cpu_summary(), torch.get_num_threads(), stage, shape, trained, trainer.args.bf16,
                       batch_size, 1 << max(0, median - 1).bit_length()], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _read() -> dict:
    try:
        return json.loads(cache_file().read_text())
    except (OSError, ValueError):
        return {}


def _write(key: str, entry: dict) -> None:
    with contextlib.suppress(OSError):  # a read-only home: measured again next time
        replace_text(cache_file(), json.dumps(_read() | {key: entry}, indent=1, sort_keys=True))


def _tokens_per_s(trainer, rows: list[dict], m: int) -> float:
    """Trained tokens per second of ``REPS`` passes of ``m`` rows after a warm-up pass."""
    rng = random.Random(m)
    picked = sorted(rng.sample(rows, min(len(rows), m * (REPS + 1))), key=lambda r: len(r["input_ids"]))
    groups = [picked[i:i + m] for i in range(0, len(picked), m)]
    model = trainer.model
    seconds = tokens = 0.0
    if not hasattr(trainer, "current_gradient_accumulation_steps"):  # set by the training loop, read by the step
        trainer.current_gradient_accumulation_steps = 1
    for i, group in enumerate(groups[:REPS + 1]):
        inputs = trainer._prepare_inputs(trainer.data_collator(group))
        t0 = time.perf_counter()
        with trainer.accelerator.autocast():  # the train loop's own autocast starts with train(), not before
            trainer.training_step(model, inputs)
        if i:  # the first pass is the warm-up (kernel selection, allocations)
            seconds += time.perf_counter() - t0
            tokens += sum(len(r["input_ids"]) for r in group)
        model.zero_grad(set_to_none=True)
    return tokens / seconds if seconds else 0.0


def calibrate(trainer, stage: str, batch_size: int, grad_accum: int) -> int:
    """The fastest micro-batch for ``trainer``'s stage on this box (module docstring), applied to its arguments
    (per-device batch and accumulation steps) before it trains; returns it."""
    rows = [trainer.train_dataset[i] for i in range(len(trainer.train_dataset))]
    ms = candidates(batch_size, len(rows))
    if len(ms) > 1:
        key = _key(trainer, stage, batch_size, [len(r["input_ids"]) for r in rows])
        entry = _read().get(key)
        if entry is None or entry.get("micro") not in ms:
            rates: dict[int, float] = {}
            with torch.random.fork_rng(devices=[]):  # the training that follows draws what it would have drawn
                for m in ms:
                    rates[m] = _tokens_per_s(trainer, rows, m)
                    if rates[m] < (1 - STOP) * max(rates.values()):
                        break
            best = max(rates.values())
            micro = min(m for m, r in rates.items() if r >= (1 - TIE) * best)
            entry = {"micro": micro, "tokens_per_s": {str(m): round(r, 1) for m, r in rates.items()},
                     "stage": stage, "batch_size": batch_size, "measured": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                                         time.gmtime())}
            _write(key, entry)
            print(f"{stage}: micro-batch {micro} of {batch_size} by measurement here ("
                  + ", ".join(f"{m}: {r:.0f}" for m, r in rates.items()) + f" tokens/s; kept in {cache_file()})",
                  flush=True)
        micro = entry["micro"]
    else:
        micro = ms[0]
    trainer.args.per_device_train_batch_size = micro
    trainer.args.gradient_accumulation_steps = grad_accum * (batch_size // micro)
    trainer._train_batch_size = micro  # the Trainer read it from the arguments when built
    return micro

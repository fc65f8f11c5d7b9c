"""The demo shape's SFT step on a GPU, per attention kernel, on sequence lengths seen and not seen before in the
process (docs/benchmarks.md, "The training stages on a GPU"): `sft_train` as the pipeline calls it, on a random-init
folder built from CONFIG_DIR (a model folder's config and tokenizer; ``benchmarks.train_model.random_init``), the
bench's synthetic WebRL steps. Each call prints one ``RESULT`` line: steps, ms a step, tokens/s.

    usage: python infra/gpu/sft_lengths.py CONFIG_DIR [DEVICE]      (DEVICE: cuda, the default, or cpu)
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import torch

import webrl_core.learn.sft_trainer as sft
from benchmarks.train import synthetic_trajectories
from benchmarks.train_model import random_init
from webrl_core.config_loader import load_config
from webrl_core.learn.transitions import build_transitions


def main(config_dir: str, device: str = "cuda") -> None:
    folder = random_init(config_dir, Path(tempfile.gettempdir()) / "webrl-sft-lengths-model")
    samples = build_transitions(synthetic_trajectories(64, 4, (1500, 4000), 0), gamma=0.9)
    pairs = [(s["observation"], s["action"]) for s in samples]  # 256 pairs
    progress = sft.progress_callbacks
    dtype = "bfloat16" if device == "cuda" else "float32"

    def call(label: str, batch: int, attention: str, bar: bool = True, n: int = 64) -> None:
        settings = load_config("demo", sets=[f"models.actor={folder}", f"models.device={device}",
                                             f"models.dtype={dtype}", f"actor.batch_size={batch}",
                                             f"models.attn_implementation={attention}"])
        sft.progress_callbacks = progress if bar else (lambda name: [])
        with tempfile.TemporaryDirectory() as tmp:
            if device == "cuda":
                torch.cuda.synchronize()
            t = time.perf_counter()
            st = sft.sft_train(pairs[:n], folder, Path(tmp) / "sft", settings, epochs=1)
            whole = time.perf_counter() - t
        print(f"RESULT {label}: batch {batch} {attention} bar={bar}: {st['steps']} steps, train {st['train_s']:.2f}s"
              f" = {st['train_s'] / st['steps'] * 1000:.0f} ms/step, {st['tokens'] / st['train_s']:.0f} tokens/s"
              f" (whole call {whole:.1f}s)", flush=True)

    call("warm-up", 4, "sdpa", n=8)
    for rep in (1, 2):  # round 1 meets the 64 pairs' lengths first with sdpa; round 2 has seen them all
        call(f"sdpa{rep}", 4, "sdpa")
        call(f"eager{rep}", 4, "eager")
        call(f"sdpa-nobar{rep}", 4, "sdpa", bar=False)
    call("sdpa-b32", 32, "sdpa", n=256)
    call("eager-b32", 32, "eager", n=256)


if __name__ == "__main__":
    main(*sys.argv[1:])

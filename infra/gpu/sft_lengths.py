"""The demo shape's SFT step on a GPU, per attention kernel and sdpa backend, on sequence lengths seen and not seen
before in the process (docs/benchmarks.md, "The training stages on a GPU"): `sft_train` as the pipeline calls it,
on a random-init folder built from CONFIG_DIR (a model folder's config and tokenizer;
``benchmarks.train_model.random_init``), the bench's synthetic WebRL steps. Each variant gets its own draw of steps
(its lengths are new to the process in round 1) and meets the same steps again in round 2. Variants: sdpa with
PyTorch's cuDNN attention allowed (``WEBRL_CUDNN_ATTENTION=1``) and excluded (the default, ``models.to_device``),
sdpa with the batches padded to a multiple of 64 tokens (cuDNN allowed: few shapes), and eager attention. Each call
prints one ``RESULT`` line: steps, ms a step, tokens/s.

    usage: python infra/gpu/sft_lengths.py CONFIG_DIR [DEVICE]      (DEVICE: cuda, the default, or cpu)
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

import torch

import webrl_core.learn.sft_trainer as sft
from benchmarks.train_model import random_init, synthetic_pairs
from webrl_core.config_loader import load_config
from webrl_core.learn.models import CUDNN_ATTENTION_ENV

PAD_MULTIPLE = 64


def main(config_dir: str, device: str = "cuda") -> None:
    folder = random_init(config_dir, Path(tempfile.gettempdir()) / "webrl-sft-lengths-model")
    dtype = "bfloat16" if device == "cuda" else "float32"
    trainer_args = sft._trainer_args

    def call(label: str, pairs: list, batch: int, attention: str = "sdpa", cudnn: bool = False,
             pad_multiple: int | None = None) -> None:
        os.environ[CUDNN_ATTENTION_ENV] = "1" if cudnn else "0"
        sft._trainer_args = (trainer_args if pad_multiple is None else
                             lambda *a, **k: trainer_args(*a, **k, pad_to_multiple_of=pad_multiple))
        settings = load_config("demo", sets=[f"models.actor={folder}", f"models.device={device}",
                                             f"models.dtype={dtype}", f"actor.batch_size={batch}",
                                             f"models.attn_implementation={attention}"])
        with tempfile.TemporaryDirectory() as tmp:
            if device == "cuda":
                torch.cuda.synchronize()
            t = time.perf_counter()
            st = sft.sft_train(pairs, folder, Path(tmp) / "sft", settings, epochs=1)
            whole = time.perf_counter() - t
        backend = torch.backends.cuda.cudnn_sdp_enabled() if device == "cuda" else "-"
        print(f"RESULT {label}: batch {batch} {attention} cudnn_sdp={backend} pad_multiple={pad_multiple}: "
              f"{st['steps']} steps, train {st['train_s']:.2f}s = {st['train_s'] / st['steps'] * 1000:.0f} ms/step, "
              f"{st['tokens'] / st['train_s']:.0f} tokens/s (whole call {whole:.1f}s)", flush=True)

    call("warm-up", synthetic_pairs(2, 99), 4)
    variants = {"sdpa+cudnn": dict(cudnn=True), "sdpa-no-cudnn": dict(), "sdpa+cudnn-pad64":
                dict(cudnn=True, pad_multiple=PAD_MULTIPLE), "eager": dict(attention="eager")}
    draws = {name: synthetic_pairs(16, seed) for seed, name in enumerate(variants, start=1)}  # 64 steps each
    for rep in (1, 2):  # round 1: each variant's lengths are new to the process; round 2: seen
        for name, kw in variants.items():
            call(f"{name} round {rep}", draws[name], 4, **kw)
    for seed, (name, kw) in enumerate(list(variants.items())[:3], start=11):  # batch 32, new lengths
        call(f"{name} batch 32", synthetic_pairs(64, seed), 32, **kw)
    os.environ.pop(CUDNN_ATTENTION_ENV, None)


if __name__ == "__main__":
    main(*sys.argv[1:])

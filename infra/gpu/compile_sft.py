"""The 1B Llama's SFT on a GPU with eager and compiled decoder layers (``models.compile_layers``;
docs/benchmarks.md, "Compiled decoder layers"): `sft_train` as the pipeline calls it, bf16, all layers trained at
batch 16, on the bench's synthetic WebRL steps, in one process: eager, then compiled (the compilation included),
then compiled again (the compiled code reused by a new model). A random-init folder is built from CONFIG_DIR (a
model folder's config and tokenizer; ``benchmarks.train_model.random_init``). Each run prints one ``RESULT`` line.

    usage: python infra/gpu/compile_sft.py CONFIG_DIR [EPISODES]      (4 steps an episode; default 64)
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import webrl_core.learn.sft_trainer as sft
from benchmarks.train_model import random_init, synthetic_pairs
from webrl_core.config_loader import load_config

LLAMA_1B = dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                num_key_value_heads=8)


def main(config_dir: str, episodes: str = "64") -> None:
    folder = random_init(config_dir, Path(tempfile.gettempdir()) / "webrl-compile-sft-model", **LLAMA_1B)
    pairs = synthetic_pairs(int(episodes), 0)
    for label, flag in (("eager", "off"), ("compiled, first", "on"), ("compiled, again", "on")):
        settings = load_config("demo", sets=[f"models.actor={folder}", "models.device=cuda",
                                             f"models.compile_layers={flag}",
                                             "models.dtype=bfloat16", "actor.batch_size=16",
                                             "models.train_layers=null"])
        with tempfile.TemporaryDirectory() as tmp:
            st = sft.sft_train(pairs, folder, Path(tmp) / "sft", settings, epochs=1)
        print(f"RESULT {label}: {st['steps']} steps, train {st['train_s']:.2f}s, "
              f"{st['tokens'] / st['train_s']:.0f} tokens/s", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])

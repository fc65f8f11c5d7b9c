"""`webrl bench ...`: benchmark commands. Areas register their commands from their own modules."""

from __future__ import annotations

import importlib

import typer

app = typer.Typer(no_args_is_help=True)

# Each module defines `register(app)` adding its commands (store: lead; rollout: env; score/train: learning core).
for _mod in ("webrl_cli.bench_store", "webrl_cli.bench_rollout", "webrl_cli.bench_learn", "webrl_cli.bench_checkpoint",
             "webrl_cli.bench_faults"):
    try:
        importlib.import_module(_mod).register(app)
    except ModuleNotFoundError as _e:
        if _e.name != _mod:
            raise


@app.command("memory")
def bench_memory(model: str = typer.Option(None, help="HF model folder or config.json (default: Llama-3-8B's config)"),
                 seq: int = typer.Option(16384, help="tokens per sequence"),
                 batch: int = typer.Option(1, help="sequences per micro-batch"),
                 lora_r: int = typer.Option(16, help="LoRA rank (all-linear)"),
                 lora_dropout: float = typer.Option(0.05, help="LoRA dropout (its masks cost activation memory)"),
                 gpus: int = typer.Option(8, help="GPUs the last column shards the states over (FSDP / ZeRO-3)"),
                 markdown: bool = typer.Option(False, "--markdown", help="print a Markdown table"),
                 out: str = typer.Option(None, help="write the numbers as JSON to this file")):
    """GPU memory of actor, critic and reference for each precision / LoRA / checkpointing setting, computed from
    the model config (parameters counted on the meta device; activations itemised per decoder layer)."""
    from webrl_core.bench.memory import run

    run(model=model, seq=seq, batch=batch, lora_r=lora_r, gpus=gpus, lora_dropout=lora_dropout,
        fmt="markdown" if markdown else "table", out=out)

"""`webrl bench checkpoint`."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    @app.command("checkpoint")
    def bench_checkpoint(size_gb: float = typer.Option(2.0, min=0.001, help="size of the synthetic checkpoint folder"),
                         root: str = typer.Option(None, help="where to write it (default: the temp dir)"),
                         repeats: int = typer.Option(3, min=1, help="timings per variant (best is reported)")):
        """Flow-start cost of referencing checkpoints: full sha256 per reference vs the saved manifest."""
        from pathlib import Path

        from benchmarks.checkpoint import run
        from webrl_core.errors import MissingInput

        if root is not None and not Path(root).is_dir():
            raise MissingInput(f"--root {root}: no such folder (the benchmark writes its checkpoint in a new folder "
                               f"inside it)")
        run(size_gb=size_gb, root=root, repeats=repeats)

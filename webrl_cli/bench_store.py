"""`webrl bench store`."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    @app.command("store")
    def bench_store(steps: int = typer.Option(1_000_000, min=1, help="synthetic steps to write"),
                    phases: int = typer.Option(5, min=1, help="phases to spread episodes over"),
                    out: str = typer.Option(None, help="keep the store in this run dir (default: temp, deleted)")):
        """Time appends and the replay query over N synthetic steps with 2-4 KB observations."""
        from benchmarks.store import run
        run(n_steps=steps, phases=phases, out=out)

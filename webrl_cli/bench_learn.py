"""`webrl bench score` (and `webrl bench train`): learning-core benchmarks, ours vs the official method."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    @app.command("score")
    def bench_score(n: int = typer.Option(512, help="steps scored by both methods"),
                    batch_sizes: str = typer.Option("1,2,4,8,16", help="micro-batch sizes tried for our method"),
                    html_chars: str = typer.Option("800,6000", help="min,max characters of synthetic HTML per step"),
                    seed: int = typer.Option(0, help="seed of the synthetic steps and the model"),
                    threads: int = typer.Option(0, help="torch threads (0: torch's default)"),
                    out: str = typer.Option(None, help="write the numbers as JSON to this file")):
        """Perplexity (1/PPL of the action) and ORM P(YES) scoring: batched vs the official one-at-a-time method,
        same embedded tiny Llama and the same steps, in one process."""
        from webrl_core.bench.score import run
        run(n=n, batch_sizes=[int(b) for b in batch_sizes.split(",") if b.strip()],
            html_chars=tuple(int(x) for x in html_chars.split(",")), seed=seed, threads=threads, out=out)

    @app.command("train")
    def bench_train(episodes: int = typer.Option(16, help="synthetic episodes (half successful)"),
                    steps: int = typer.Option(4, help="steps per episode"),
                    html_chars: str = typer.Option("1500,4000", help="min,max characters of synthetic HTML per step"),
                    batch_size: int = typer.Option(8, help="our samples per optimizer step (the official: 2, batch 1 x GA 2)"),
                    micro_batch_size: int = typer.Option(0, help="our samples per forward pass (0: the default, 1 on CPU)"),
                    seed: int = typer.Option(0, help="seed of the synthetic data and the model"),
                    threads: int = typer.Option(0, help="torch threads (0: torch's default)"),
                    out: str = typer.Option(None, help="write the numbers as JSON to this file")):
        """WebRL actor-training stage: our precompute + batched epoch vs the official per-sample recomputation
        of reference and critic values; wall times, ratio and MFU against a measured fp32 matmul peak."""
        from webrl_core.bench.train import run as run_train
        run_train(episodes=episodes, steps=steps, html_chars=tuple(int(x) for x in html_chars.split(",")),
                  batch_size=batch_size, micro_batch_size=micro_batch_size or None, seed=seed,
                  threads=threads, out=out)

"""`webrl bench score` (and `webrl bench train`): learning-core benchmarks, ours vs the official method."""

from __future__ import annotations

import typer


def _print_comparison(name: str, ref: dict, ours: dict) -> list[dict]:
    """The table of ``ref``'s and this checkout's tokens/s per stage; its rows (``compare_ref.stage_ratios``)."""
    from rich.console import Console
    from rich.table import Table

    from benchmarks.compare_ref import stage_ratios

    rows = stage_ratios(ref, ours)
    t = Table(title=f"{name} ({ref['ref']}) then this checkout, back to back on {ours['cpu']}")
    for col in ("stage", f"{name} tokens/s", "now tokens/s", "now / ref"):
        t.add_column(col, justify="left" if col == "stage" else "right")
    for r in rows:
        t.add_row(r["stage"], f"{r['ref_tokens_per_s']:.0f}", f"{r['tokens_per_s']:.0f}", f"{r['ratio']:.2f}x")
    Console().print(t)
    return rows


def register(app: typer.Typer) -> None:
    @app.command("score")
    def bench_score(n: int = typer.Option(512, min=1, help="steps scored by both methods"),
                    batch_sizes: str = typer.Option("1,2,4,8,16", help="micro-batch sizes tried for our method"),
                    html_chars: str = typer.Option("800,6000", help="min,max characters of synthetic HTML per step"),
                    seed: int = typer.Option(0, min=0, help="seed of the synthetic steps and the model"),
                    threads: int = typer.Option(0, min=0, help="torch threads (0: torch's default)"),
                    out: str = typer.Option(None, help="write the numbers as JSON to this file")):
        """Perplexity (1/PPL of the action) and ORM P(YES) scoring: batched vs the official one-at-a-time method,
        same embedded tiny Llama and the same steps, in one process."""
        from benchmarks.score import run
        run(n=n, batch_sizes=[int(b) for b in batch_sizes.split(",") if b.strip()],
            html_chars=tuple(int(x) for x in html_chars.split(",")), seed=seed, threads=threads, out=out)

    @app.command("train")
    def bench_train(model: str = typer.Option(None, help="HF causal-LM folder or short name (smollm2-135m-instruct): "
                                              "measure the SFT, critic and actor stages on it; without: the "
                                              "actor stage on the embedded tiny model, ours vs official"),
                    config: str = typer.Option("demo", help="--model: config whose models/actor/critic/bootstrap "
                                               "settings are used"),
                    set_: list[str] = typer.Option([], "--set", "-s", help="--model: section.key=value overrides"),
                    official: bool = typer.Option(True, help="--model: also run the official per-sample actor "
                                                  "stage for the ratio"),
                    episodes: int = typer.Option(None, min=1, help="synthetic episodes, half successful (default 16; "
                                                 "--model: 8)"),
                    steps: int = typer.Option(None, min=1, help="steps per episode (default 4; --model: 2)"),
                    html_chars: str = typer.Option("1500,4000", help="min,max characters of synthetic HTML per step"),
                    batch_size: int = typer.Option(8, min=1, help="our samples per optimizer step (the official: 2, batch 1 x GA 2)"),
                    micro_batch_size: int = typer.Option(0, min=0, help="our samples per forward pass (0: the default, 1 on CPU)"),
                    seed: int = typer.Option(0, min=0, help="seed of the synthetic data and the model"),
                    threads: int = typer.Option(0, min=0, help="torch threads (0: torch's default)"),
                    out: str = typer.Option(None, help="write the numbers as JSON to this file"),
                    compare: str = typer.Option(None, help="--model: a git revision (1b32fed, HEAD~3, a tag) whose "
                                                "code measures the same stages first, back to back with this "
                                                "checkout's; prints both and the ratio per stage "
                                                "(benchmarks/compare_ref.py)"),
                    profile: bool = typer.Option(False, help="--model: run each stage under torch.profiler and print "
                                                 "where its time goes (matmul, attention, conversion and copies, "
                                                 "elementwise, optimizer, Python) and its distance from the box's "
                                                 "limit (benchmarks/op_profile.py)")):
        """Training throughput. With --model: SFT, critic and actor stages on that model, tokens/s and share of the
        matmul peak (in the run's dtype) measured in the same run, peak RSS per stage; last line
        `tokens/s=<n> peak=<p>%`. Without: the WebRL actor stage, our precompute + batched epoch vs the official
        per-sample recomputation, on the embedded tiny model (fp32)."""
        chars = tuple(int(x) for x in html_chars.split(","))
        if model:
            from benchmarks.train_model import run as run_model

            ref = None
            if compare:
                from benchmarks.compare_ref import reference_run

                argv = ["--model", model, "--config", config, *[a for v in set_ for a in ("--set", v)],
                        "--episodes", str(episodes or 8), "--steps", str(steps or 2), "--html-chars", html_chars,
                        "--seed", str(seed), "--threads", str(threads), "--official" if official else "--no-official"]
                ref = reference_run(compare, argv)
            result = run_model(model, config, sets=set_, episodes=episodes or 8, steps=steps or 2, html_chars=chars,
                               official=official, seed=seed, threads=threads, out=out, profile=profile)
            last = f"tokens/s={result['tokens_per_s']:.0f} peak={100 * result['peak_share']:.0f}%"
            if ref is not None:
                rows = _print_comparison(compare, ref, result)
                last += f" ref_tokens/s={ref['tokens_per_s']:.0f} " + " ".join(
                    f"{r['stage']}={r['ratio']:.2f}x" for r in rows)
            print(last)
            return
        from benchmarks.train import run as run_train
        run_train(episodes=episodes or 16, steps=steps or 4, html_chars=chars,
                  batch_size=batch_size, micro_batch_size=micro_batch_size or None, seed=seed,
                  threads=threads, out=out)

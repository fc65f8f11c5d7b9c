"""`webrl bench rollout`: env steps/s, observation latency and memory of the rollout engine per n_envs."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    @app.command("rollout")
    def rollout_cmd(
        target: str = typer.Option("miniwob", help="miniwob | embedded"),
        n_envs: str = typer.Option("1,4,8,16", "--n-envs", help="comma-separated n_envs values to measure"),
        episodes: int = typer.Option(40, min=1, help="timed episodes per n_envs (after a warm-up round)"),
        config: str | None = typer.Option(None, "--config", "-c", help="config file for the env section"),
        set_: list[str] = typer.Option([], "--set", help="section.key=value overrides"),
    ) -> None:
        """Measure the rollout engine with a scripted policy (no model): the browser side alone."""
        from rich.console import Console
        from rich.table import Table

        from webrl_core.bench.rollout import bench_rollout
        from webrl_core.config import load_config

        settings = load_config(config, sets=set_ or ())
        cfg = settings.env
        try:
            ns = [int(x) for x in n_envs.split(",") if x.strip()]
        except ValueError:
            raise typer.BadParameter(f"--n-envs {n_envs!r}: expected comma-separated integers") from None
        from webrl_core.env.browser import chromium_executable

        console = Console()
        console.print(f"target={target}, {episodes} timed episodes per setting, "
                      f"contexts_per_browser={cfg.contexts_per_browser}, batch_wait_s={cfg.batch_wait_s}, "
                      f"sites.workers={settings.sites.workers}, chromium={chromium_executable(cfg)}")
        rows = bench_rollout(target, ns, episodes, cfg=cfg, sites_workers=settings.sites.workers,
                             on_row=lambda r: console.print(f"  n_envs={r['n_envs']}: {r['steps_per_s']:.1f} steps/s"))
        table = Table(title=f"webrl bench rollout ({target}, scripted policy)", padding=(0, 0))
        # short headers: the table must fit an 80-column terminal
        cols = [("n_envs", "n_envs", "{}"), ("eps", "episodes", "{}"), ("steps", "steps", "{}"),
                ("steps/s", "steps_per_s", "{:.1f}"), ("eps/s", "episodes_per_s", "{:.2f}"),
                ("obs p50", "obs_p50_ms", "{:.0f}ms"), ("obs p95", "obs_p95_ms", "{:.0f}ms"),
                ("act p50", "action_p50_ms", "{:.0f}ms"), ("succ", "success", "{:.2f}"),
                ("err", "errors", "{}"), ("PSS MB", "chromium_pss_mb", "{:.0f}"),
                ("py MB", "python_rss_mb", "{:.0f}")]
        for name, _, _ in cols:
            table.add_column(name, justify="right")
        for r in rows:
            table.add_row(*[fmt.format(r[key]) for _, key, fmt in cols])
        console.print(table)
        best = max(rows, key=lambda r: r["steps_per_s"])
        console.print(f"best: {best['steps_per_s']:.1f} env steps/s at n_envs={best['n_envs']} "
                      f"(target >= 10 steps/s)")

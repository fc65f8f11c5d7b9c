"""`webrl bench faults`: the fault matrix (benchmarks/faults/), one row per injected fault."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    @app.command("faults")
    def bench_faults(
        faults: str = typer.Option("", "--faults", help="comma-separated fault names (default: all): "
                                   "generate, rollout, orm, replay, critic, actor, eval, chromium, sites, sites-eval"),
        root: str = typer.Option("", "--root", help="work folder (default: a new temporary one); a root that "
                                 "holds a bootstrap for the same config reuses it"),
        bootstrap: str = typer.Option("", "--bootstrap", help="an existing run dir whose phase 0 the rows fork "
                                      "instead of a bootstrap of their own"),
        keep: bool = typer.Option(False, "--keep", help="keep every row's run directory (failed rows are always kept)"),
        config: str = typer.Option("smoke", "--config", "-c", help="config the phases run with"),
        set_: list[str] = typer.Option([], "--set", "-s", help="section.key=value overrides for every run"),
        fraction: float = typer.Option(0.5, min=0.0, help="a stage is killed this fraction of its clean duration "
                                       "after it started"),
        weight_tol: float = typer.Option(0.0, min=0.0, help="largest absolute weight difference accepted for the "
                                         "critic and actor (0: bit-identical)"),
        timeout_s: float = typer.Option(1800.0, min=1.0, help="limit for one `webrl` command"),
        out: str = typer.Option("", help="write the rows as JSON to this file"),
    ) -> None:
        """Kill the flow (kill -9) in each stage of a phase, or one Chromium / the sites' server mid-rollout; re-run
        the same `webrl phase` command; check against a clean run: no episode lost or doubled, no stale row,
        the same artifacts. Exit code 1 when a row fails."""
        import shutil
        import tempfile
        from pathlib import Path

        from rich.console import Console
        from rich.table import Table

        from benchmarks.faults import as_json, recovery, run_matrix, select, summarize

        console = Console()
        try:
            chosen = select(faults)
        except ValueError as e:
            raise typer.BadParameter(str(e)) from None
        own = not root
        work = Path(root or tempfile.mkdtemp(prefix="webrl-faults-"))
        console.print(f"fault matrix on config {config!r} in {work}: "
                      + (f"phase 0 of {bootstrap}" if bootstrap else "bootstrap once")
                      + f", a clean phase 1, then {len(chosen)} fault(s), each from the same phase 0")

        def on_row(r: dict) -> None:
            mark = "[green]PASS[/]" if r["ok"] else f"[red]FAIL[/] {r['why']}"
            console.print(f"  {r['fault']}: {r['injected']}; {recovery(r)}; {mark}")

        res = run_matrix(work, chosen, config=config, sets=set_, keep=keep, fraction=fraction,
                         weight_tol=weight_tol, timeout_s=timeout_s, log=console.print, on_row=on_row,
                         bootstrap_from=bootstrap or None)
        table = Table(title=f"webrl bench faults ({config}; clean phase 1: {res['clean_s']:.0f} s)", show_lines=True)
        for name in ("fault", "injected", "recovery", "checks", "result"):
            table.add_column(name, overflow="fold")
        for r in res["rows"]:
            table.add_row(f"{r['fault']}: {r['title']}", r["injected"], recovery(r), summarize(r),
                          "[green]PASS[/]" if r["ok"] else f"[red]FAIL[/]: {r['why']}")
        console.print(table)
        if out:
            Path(out).write_text(as_json(res))
        console.print(f"{res['passed']} passed, {res['failed']} failed ({res['total_s'] / 60:.0f} min)")
        if own and not keep and res["failed"] == 0:
            shutil.rmtree(work, ignore_errors=True)
        elif res["failed"]:
            console.print(f"failed rows' run directories and logs: {work}")
        raise typer.Exit(1 if res["failed"] else 0)

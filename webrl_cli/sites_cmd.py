"""`webrl sites ...`: serve the embedded sites, check a policy on them, measure observation sizes."""

from __future__ import annotations

import json
import time

import typer

app = typer.Typer(no_args_is_help=True)


def _tasks(split: str, n: int | None, seed: int, data_seed: int) -> list[dict]:
    from webrl_core.sites.tasks import test_set, train_tasks

    if split == "test":
        tasks = test_set(data_seed)
        if n is not None and n < len(tasks):
            from webrl_core.pipeline.task_sets import stratified

            tasks = stratified(tasks, n)
        return tasks
    if split == "train":
        return train_tasks(n or 54, seed=seed, data_seed=data_seed)
    raise typer.BadParameter(f"--split {split!r}: allowed 'test' or 'train'")


@app.command()
def serve(data_seed: int = typer.Option(0, min=0, help="seed of the generated site data"),
          host: str = typer.Option("127.0.0.1", help="loopback interface to bind")) -> None:
    """Start the five sites, print their URLs and logins, run until Ctrl-C (or SIGTERM)."""
    import signal
    import threading

    from webrl_core.sites.server import SITE_APPS, EmbeddedSites

    stop_requested = threading.Event()
    stop_signals = (signal.SIGINT, signal.SIGTERM)

    def stop(signum, frame):
        # only a flag: an exception raised wherever the signal lands (inside an echo, during the sites' start or
        # stop) would escape the loop's handler; the loop below notices the flag within its tick. Further signals
        # are ignored so that a second Ctrl-C cannot cut the sites' stop short (Python restores the default
        # handlers while it exits; an ignore stays)
        for s in stop_signals:
            signal.signal(s, signal.SIG_IGN)
        stop_requested.set()

    # installed explicitly: a process started with SIGINT ignored (a `&` job of a script, a pytest-xdist worker's
    # child) inherits the ignore, and Ctrl-C or `kill -INT` would never reach the loop below
    for sig in stop_signals:
        signal.signal(sig, stop)
    with EmbeddedSites(data_seed=data_seed, host=host) as sites:
        for site, url in sites.urls.items():
            accounts = SITE_APPS[site].accounts
            login = ", ".join(f"{u} / {p}" for u, p in accounts.items()) or "no login"
            typer.echo(f"{site:15s} {url}   ({SITE_APPS[site].placeholder}; {login})")
        typer.echo("Serving; press Ctrl-C to stop.")
        while not stop_requested.is_set():
            time.sleep(0.2)  # the handler runs between sleeps; Event.wait is not safe to wake from a handler
        typer.echo("stopping")


@app.command()
def check(policy: str = typer.Option("oracle", help="oracle or random"),
          split: str = typer.Option("test", help="test: the fixed held-out set; train: a sample of training tasks"),
          n: int = typer.Option(None, min=1, help="number of tasks (test: stratified subset; train: sample size)"),
          n_envs: int = typer.Option(2, min=1, help="browser contexts at once"),
          seed: int = typer.Option(0, min=0, help="sampling seed (train split) and random-policy seed"),
          data_seed: int = typer.Option(0, min=0, help="seed of the generated site data"),
          show_failures: int = typer.Option(5, min=0, help="print the steps of this many failed episodes")) -> None:
    """Run a policy through the env's rollout and print success per site and per family."""
    from rich.console import Console
    from rich.table import Table

    from webrl_core.sites.check import check as run_check
    from webrl_core.sites.check import per_family, per_site

    tasks = _tasks(split, n, seed, data_seed)
    t0 = time.perf_counter()
    eps = run_check(policy, tasks, n_envs=n_envs, data_seed=data_seed, seed=seed)
    wall = time.perf_counter() - t0
    console = Console()
    for title, rows in (("site", per_site(eps)), ("family", per_family(eps, tasks))):
        table = Table(title=f"{policy} on {split} ({len(tasks)} tasks, {wall:.0f}s) per {title}")
        table.add_column(title)
        table.add_column("success", justify="right")
        table.add_column("rate", justify="right")
        for k, (ok, tot) in rows.items():
            table.add_row(k, f"{ok}/{tot}", f"{ok / tot:.0%}")
        ok, tot = sum(v[0] for v in rows.values()), sum(v[1] for v in rows.values())
        table.add_row("ALL", f"{ok}/{tot}", f"{ok / max(tot, 1):.0%}")
        console.print(table)
    failed = [e for e in eps if not e.get("success")][:show_failures]
    for ep in failed if policy == "oracle" else []:
        console.print(f"[red]FAIL[/] {ep['task_id']}: {ep['intent']} -> {ep['status']} {ep['final_answer']!r} "
                      f"{ep['error'] or ''}")
        for s in ep["steps"]:
            console.print(f"   {s['url']} | {s['response'].splitlines()[-1]} | {s.get('error') or ''}")


@app.command("obs-stats")
def obs_stats(split: str = typer.Option("test", help="test or train"),
              n: int = typer.Option(55, min=1, help="tasks whose oracle episodes are measured (stratified)"),
              n_envs: int = typer.Option(2, min=1, help="browser contexts at once"),
              seed: int = typer.Option(0, min=0, help="sampling seed (train split)"),
              as_json: bool = typer.Option(False, "--json", help="print JSON instead of a table")) -> None:
    """Characters per simplified-HTML observation along oracle episodes: p50/p95/max per site."""
    from rich.console import Console
    from rich.table import Table

    from webrl_core.sites.check import check as run_check
    from webrl_core.sites.check import obs_stats as stats_of

    eps = run_check("oracle", _tasks(split, n, seed, 0), n_envs=n_envs, seed=seed)
    stats = stats_of(eps)
    if as_json:
        typer.echo(json.dumps(stats, indent=1))
        return
    table = Table(title=f"observation characters ({sum(s['n'] for s in stats.values())} observations)")
    for col in ("site", "n", "p50", "p95", "max"):
        table.add_column(col, justify="left" if col == "site" else "right")
    for site, s in stats.items():
        table.add_row(site, str(s["n"]), str(s["p50"]), str(s["p95"]), str(s["max"]))
    Console().print(table)

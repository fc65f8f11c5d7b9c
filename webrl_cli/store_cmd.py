"""`webrl store ...`: inspect, query, export and import trajectories."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

app = typer.Typer(no_args_is_help=True)


def _no_store(run_dir: str) -> None:
    """A MissingInput naming the folder when ``run_dir`` has no store (nothing is created)."""
    from webrl_core.errors import MissingInput

    if not (Path(run_dir) / "store").is_dir():
        raise MissingInput(f"no store at {Path(run_dir) / 'store'} (is {run_dir!r} a run directory?)")


def _store(run_dir: str):
    """The run's store (its errors, a StoreError or a missing store, are printed by webrl_cli.main); refreshes
    ``store/webrl.duckdb`` for the duckdb CLI when the files or the run dir's place changed."""
    from webrl_core.runs.store import TrajectoryStore

    _no_store(run_dir)
    store = TrajectoryStore(run_dir)
    store.ensure_duckdb_file()
    return store


@app.command("migrate")
def migrate(run_dir: str = typer.Argument(..., help="run directory whose store an older webrl wrote")):
    """Upgrade a store written by an earlier schema version in place (every row is kept)."""
    from webrl_core.runs.store import TrajectoryStore

    _no_store(run_dir)
    out = TrajectoryStore(run_dir, check_version=False).migrate()
    typer.echo(f"store {Path(run_dir) / 'store'}: schema v{out['from']} -> v{out['to']}, {out['episodes']} episodes updated")


@app.command("stats")
def stats(run_dir: str = typer.Argument(..., help="run directory (contains store/)")):
    """Row counts and per-phase episodes, steps, success rate and errors."""
    from rich.console import Console
    from rich.table import Table

    st = _store(run_dir).stats()
    console = Console()
    console.print(f"store {st['root']} (schema v{st['schema_version']}): tasks={st['tasks']} episodes={st['episodes']} "
                  f"steps={st['steps']} scores={st['scores']}")
    t = Table()
    cols = ("phase", "purpose", "policy_digest", "episodes", "steps", "success_rate", "errors")
    for c in cols:
        t.add_column(c)
    for r in st["by_phase"]:
        t.add_row(*(f"{r[c]:.3f}" if isinstance(r[c], float) else str(r[c])[:24] for c in cols))
    console.print(t)


@app.command("query")
def query(run_dir: str = typer.Argument(..., help="run directory"),
          sql: str = typer.Argument(..., help="SQL over the views tasks, episodes, steps, scores"),
          limit: int = typer.Option(50, min=1, help="rows to print"),
          csv: Optional[str] = typer.Option(None, help="write all rows to this CSV instead")):
    """Run SQL against the store's DuckDB views."""
    import duckdb
    from rich.console import Console
    from rich.table import Table

    from webrl_core.errors import BadInput

    store = _store(run_dir)
    con = store.connect()
    try:
        rel = con.sql(sql)
    except duckdb.Error as e:
        raise BadInput(f"query failed: {e}") from None
    if rel is None:
        return
    if csv:
        rel.write_csv(csv)
        typer.echo(f"wrote {csv}")
        return
    rows = rel.limit(limit).fetchall()
    t = Table()
    for c in rel.columns:
        t.add_column(c, overflow="fold", max_width=60)
    for r in rows:
        t.add_row(*(str(v)[:300] for v in r))
    Console().print(t)


@app.command("export")
def export(run_dir: str = typer.Argument(..., help="run directory"),
           phase: int = typer.Option(..., min=0, help="phase to export"),
           format: str = typer.Option("jsonl", help="webrl-pt (official process_data.py records, torch.save) | jsonl"),
           out: Optional[str] = typer.Option(None, help="output path (default: <run_dir>/export/phase=N.<ext>)"),
           gamma: float = typer.Option(0.9, min=0.0, max=1.0, help="discount for mc_return")):
    """Export a phase's trajectories (official stage-1 record format or JSON lines)."""
    import json

    from webrl_core.learn.transitions import episode_transitions, export_official

    from webrl_core.errors import BadInput

    if format not in ("webrl-pt", "jsonl"):
        raise typer.BadParameter(f"--format {format!r}: allowed values are webrl-pt, jsonl")
    store = _store(run_dir)
    episodes = [e for e in store.episodes(phase) if e["status"] != "error"]
    if not episodes:
        phases = [r["phase"] for r in store.sql("SELECT DISTINCT phase FROM episodes WHERE status <> 'error' "
                                                "ORDER BY phase")]
        raise BadInput(f"--phase {phase}: the store {store.root} has no episode of phase {phase} (phases with "
                       f"episodes: {', '.join(map(str, phases)) or 'none'}; `webrl eval` stores its episodes as phase "
                       f"100); nothing written")
    steps = store.steps(phase)
    ext = "pt" if format == "webrl-pt" else "jsonl"
    path = Path(out or Path(run_dir) / "export" / f"phase={phase}.{ext}")
    path.parent.mkdir(parents=True, exist_ok=True)
    by_ep: dict[str, list[dict]] = {}
    for s in steps:
        by_ep.setdefault(s["episode_id"], []).append(s)
    pairs = [(e, by_ep[e["episode_id"]]) for e in episodes
             if by_ep.get(e["episode_id"]) and any(e.get(k) is not None for k in ("success", "orm_score", "env_score"))]
    if format == "webrl-pt":
        stage1, filt = export_official(pairs, path, gamma=gamma)
        typer.echo(f"wrote {len(pairs)} trajectories to {stage1} and the flat step list to {filt}")
        return
    with open(path, "w") as fh:
        for e, st in pairs:
            fh.write(json.dumps({"episode": e, "steps": episode_transitions(e, st, gamma)}, default=str) + "\n")
    typer.echo(f"wrote {len(pairs)} trajectories ({sum(len(st) for _, st in pairs)} steps) to {path}")


@app.command("import-traces")
def import_traces(traces_dir: str = typer.Argument(..., help="VAB result dir (with traces/*.jsonl) or the traces/ dir"),
                  run_dir: str = typer.Option(..., "--run-dir", help="run directory to import into"),
                  phase: int = typer.Option(0, min=0, help="phase to file the episodes under")):
    """Import VAB-WebArena-Lite `traces/*.jsonl` (+ actions/<id>.json scores) as episodes and steps."""
    from webrl_core.runs.store import TrajectoryStore
    from webrl_core.learn.transitions import import_vab_traces

    items = import_vab_traces(traces_dir, phase=phase)
    n = TrajectoryStore(run_dir).write_episodes(items)
    typer.echo(f"imported {n} episodes ({sum(len(s) for _, s in items)} steps) into {run_dir}")


@app.command("schema")
def schema():
    """Print the tables, their columns and the schema version."""
    from webrl_core.runs.store import COLUMN_DOCS, SCHEMA_VERSION, SCHEMAS

    typer.echo(f"schema version {SCHEMA_VERSION}")
    for name, sch in SCHEMAS.items():
        typer.echo(f"\n{name}: {COLUMN_DOCS[name]}")
        for f in sch:
            typer.echo(f"  {f.name:16s} {f.type}")


@app.command("compare")
def compare_cmd(a: str = typer.Argument(..., help="evaluation A: <run>/eval/<name>.json or <run dir>:<name> "
                                                  "(phase=0 is the SFT start); a bare run dir compares its phases in turn"),
                b: Optional[str] = typer.Argument(None, help="evaluation B, the same forms (another run's too)"),
                actions: bool = typer.Option(False, "--actions", help="also list each lost or gained task's actions "
                                                                      "under A and under B")):
    """Paired test outcomes of two evaluations: tasks lost and gained, with the two-sided sign test."""
    from rich.console import Console
    from rich.table import Table

    from webrl_core.errors import BadInput
    from webrl_core.pipeline import compare as C

    if b is None:
        if not (Path(a) / "eval").is_dir():
            raise BadInput(f"{a!r}: give two evaluations, or a run dir with eval/ to compare its phases in turn")
        names = C.evaluation_names(a)
        if len(names) < 2:
            raise BadInput(f"{a}: {len(names)} phase evaluation(s) in {Path(a) / 'eval'}; two are needed")
        pairs = [(f"{a}:{x}", f"{a}:{y}") for x, y in zip(names, names[1:])]
    else:
        pairs = [(a, b)]
    console = Console()
    for x, y in pairs:
        fa, fb = C.resolve_evaluation(x), C.resolve_evaluation(y)
        cmp = C.compare(fa, fb)
        sa, sb = cmp.solved
        console.print(f"[bold]{x}[/] -> [bold]{y}[/]: solved {sa} -> {sb} of {cmp.paired} paired tasks, "
                      f"lost {len(cmp.lost)}, gained {len(cmp.gained)} (sign test p = {cmp.p_value:.3f})"
                      + (f", {cmp.unpaired} unpaired (errored, unscored or on one side only)" if cmp.unpaired else ""))
        t = Table()
        for col in ("", "site", "task", "intent") + (("actions under A", "actions under B") if actions else ()):
            t.add_column(col, overflow="fold")
        changed = [("lost", ta, tb) for ta, tb in cmp.lost] + [("gained", ta, tb) for ta, tb in cmp.gained]
        if actions:
            under_a = C.episode_actions(fa, [ta.episode_id for _, ta, _ in changed])
            under_b = C.episode_actions(fb, [tb.episode_id for _, _, tb in changed])
        for mark, ta, tb in changed:
            extra = ("\n".join(under_a[ta.episode_id]), "\n".join(under_b[tb.episode_id])) if actions else ()
            t.add_row(mark, ta.site, ta.task_id, ta.intent, *extra)
        if changed:
            console.print(t)

"""The `webrl` command line. Each command group lives in its own module and imports heavy libraries lazily."""

from __future__ import annotations

import importlib

import typer

app = typer.Typer(help="webrl: WebRL web-agent training as cached Prefect flows.", no_args_is_help=True,
                  pretty_exceptions_show_locals=False)

# (group name, module, help). Modules define `app = typer.Typer(...)`.
_GROUPS = [
    ("config", "webrl_cli.config_cmd", "Show and check configs."),
    ("store", "webrl_cli.store_cmd", "Query, export and import the trajectory store."),
    ("bench", "webrl_cli.bench_cmd", "Benchmarks that print numbers."),
    ("env", "webrl_cli.env_cmd", "Browser environments: embedded sites, MiniWoB++, interactive play."),
    ("tasks", "webrl_cli.tasks_cmd", "Task sets: WebArena-Lite export, embedded families, test set."),
    ("sites", "webrl_cli.sites_cmd", "The embedded WebArena-style sites: serve, oracle checks, observation sizes."),
    ("serve", "webrl_cli.serve_cmd", "Start local servers (MLflow UI, Prefect server + worker)."),
]

for _name, _mod, _help in _GROUPS:
    try:
        _m = importlib.import_module(_mod)
    except ModuleNotFoundError as _e:  # a group not built yet
        if _e.name != _mod:
            raise
        continue
    app.add_typer(_m.app, name=_name, help=_help)

# Top-level commands (demo, phase, train, eval, reproduce) live in webrl_cli/run_cmd.py.
try:
    importlib.import_module("webrl_cli.run_cmd")  # registers commands on `app`
except ModuleNotFoundError as _e:
    if _e.name != "webrl_cli.run_cmd":
        raise

if __name__ == "__main__":
    app()

"""`webrl bench ...`: benchmark commands. Areas register their commands from their own modules."""

from __future__ import annotations

import importlib

import typer

app = typer.Typer(no_args_is_help=True)

# Each module defines `register(app)` adding its commands (store: lead; rollout: env; score/train: learning core).
for _mod in ("webrl_cli.bench_store", "webrl_cli.bench_rollout", "webrl_cli.bench_learn", "webrl_cli.bench_checkpoint",
             "webrl_cli.bench_faults"):
    try:
        importlib.import_module(_mod).register(app)
    except ModuleNotFoundError as _e:
        if _e.name != _mod:
            raise

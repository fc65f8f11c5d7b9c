"""The `webrl` command line. Each command group lives in its own module and imports heavy libraries lazily."""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path

import typer

# Errors that mean "the input is bad" (each names the file, the field or the value): printed without a traceback.
INPUT_ERRORS = {"ConfigError", "TaskFileError", "StoreError", "ModelFolderError", "BadInputError"}
_OWN_DIRS = tuple(str(Path(__file__).resolve().parent.parent / d) + os.sep
                  for d in ("webrl_core", "webrl_cli", "flows", "tasks"))
TRACEBACK_ENV = "WEBRL_TRACEBACK"


def _raised_by_webrl(e: BaseException) -> bool:
    """The innermost frame of the traceback is webrl's own code: a deliberate ``raise`` with a message."""
    tb = e.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    return str(Path(tb.tb_frame.f_code.co_filename).resolve()).startswith(_OWN_DIRS)


def known_error(e: BaseException) -> int | None:
    """Exit code for an error to print as one message (2: bad input, 1: a failure webrl explained), None for
    everything else (a bug: keep the traceback)."""
    if any(c.__name__ in INPUT_ERRORS and c.__module__.startswith("webrl_core") for c in type(e).__mro__):
        return 2
    if isinstance(e, OSError) and (e.filename or _raised_by_webrl(e)):
        return 1  # the message names the path (no such file, not a directory, read-only file system, ...)
    if isinstance(e, (ValueError, RuntimeError, TimeoutError)) and not isinstance(e, NotImplementedError) \
            and _raised_by_webrl(e):
        return 1
    return None


class WebrlTyper(typer.Typer):
    """``typer.Typer`` that prints known errors (``known_error``) as ``webrl: error: ...`` without a traceback;
    set WEBRL_TRACEBACK=1 to get the traceback anyway. Unexpected errors keep typer's traceback."""

    def __call__(self, *args, **kwargs):
        try:
            return super().__call__(*args, **kwargs)
        except Exception as e:
            code = known_error(e)
            if code is None or os.environ.get(TRACEBACK_ENV, "") not in ("", "0"):
                raise
            name = "" if code == 2 or type(e) in (ValueError, RuntimeError) else f"{type(e).__name__}: "
            typer.secho(f"webrl: error: {name}{e}", fg=typer.colors.RED, err=True)
            typer.echo(f"({TRACEBACK_ENV}=1 shows the traceback)", err=True)
            sys.exit(code)


app = WebrlTyper(help="webrl: WebRL web-agent training as cached Prefect flows.", no_args_is_help=True,
                 pretty_exceptions_show_locals=False)


@app.callback()
def _options(verbose: bool = typer.Option(
        False, "--verbose", "-v", help="Also show third-party output: transformers, datasets and TRL progress bars "
        "and logs, the Trainers' metric panels, library deprecation warnings (or set WEBRL_VERBOSE=1).")) -> None:
    from webrl_core.logs import quiet_libraries

    quiet_libraries(verbose or None)

# (group name, module, help). Modules define `app = typer.Typer(...)`.
_GROUPS = [
    ("config", "webrl_cli.config_cmd", "Show and check configs."),
    ("models", "webrl_cli.models_cmd", "Pretrained models: import a GGUF file, set up a known model."),
    ("store", "webrl_cli.store_cmd", "Query, export and import the trajectory store."),
    ("bench", "webrl_cli.bench_cmd", "Benchmarks that print numbers."),
    ("env", "webrl_cli.env_cmd", "Browser environments: embedded sites, MiniWoB++, interactive play."),
    ("tasks", "webrl_cli.tasks_cmd", "Task sets: WebArena-Lite export, embedded families, test set."),
    ("sites", "webrl_cli.sites_cmd", "The embedded WebArena-style sites: serve, oracle checks, observation sizes."),
    ("serve", "webrl_cli.serve_cmd", "Start local servers (MLflow UI, Prefect server + worker)."),
    ("webarena", "webrl_cli.webarena_cmd", "Real WebArena sites: log in and save the storage states."),
]

for _name, _mod, _help in _GROUPS:
    try:
        _m = importlib.import_module(_mod)
    except ModuleNotFoundError as _e:  # a group not built yet
        if _e.name != _mod:
            raise
        continue
    app.add_typer(_m.app, name=_name, help=_help)

# Top-level commands (demo, train, bootstrap, phase, eval, reproduce) live in webrl_cli/run_cmd.py.
app.registered_commands += importlib.import_module("webrl_cli.run_cmd").app.registered_commands

if __name__ == "__main__":
    app()

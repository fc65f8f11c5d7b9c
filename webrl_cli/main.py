"""The `webrl` command line. Each command group lives in its own module and imports heavy libraries lazily."""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path

import typer

try:  # typer 0.29 carries its own copy of click, and its commands raise that copy's exceptions
    from typer._click import exceptions as click_errors
except ImportError:  # pragma: no cover - a typer that uses the click package
    from click import exceptions as click_errors

TRACEBACK_ENV = "WEBRL_TRACEBACK"
_OWN_DIRS = tuple(str(Path(__file__).resolve().parent.parent / d) + os.sep
                  for d in ("webrl_core", "webrl_cli", "flows", "tasks"))


def _raised_by_webrl(e: BaseException) -> bool:
    """The innermost frame of the traceback is webrl's own code: a deliberate ``raise`` with a message."""
    tb = e.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    return str(Path(tb.tb_frame.f_code.co_filename).resolve()).startswith(_OWN_DIRS)


def known_error(e: BaseException) -> int | None:
    """The exit code of an error to print as one message, None for everything else (a bug: keep the traceback).

    2: bad input (``webrl_core.errors.BadInput``: configs, task files, the store, model folders, ...; a command-line
    usage error; a ``ValueError`` that webrl's own code raised about a value). 1: a missing file or folder
    (``MissingInput``, an ``OSError`` naming its path) or another failure webrl explains (``WebrlError``, a
    ``RuntimeError`` or ``TimeoutError`` raised by webrl's own code)."""
    from webrl_core.errors import exit_code

    code = exit_code(e)
    if code is not None:
        return code
    if isinstance(e, click_errors.UsageError):
        return 2
    if isinstance(e, OSError) and (e.filename or _raised_by_webrl(e)):
        return 1  # the message names the path (no such file, not a directory, read-only file system, ...)
    if isinstance(e, ValueError) and _raised_by_webrl(e):
        return 2
    if isinstance(e, (RuntimeError, TimeoutError)) and not isinstance(e, NotImplementedError) and _raised_by_webrl(e):
        return 1
    return None


def error_message(e: BaseException) -> str:
    """The one message of a known error (``known_error``), without the ``webrl: error:`` prefix."""
    from webrl_core.errors import WebrlError

    if isinstance(e, click_errors.UsageError):
        where = e.ctx.command_path if e.ctx is not None else "webrl"
        return f"{where}: {e.format_message()} (see {where} --help)"
    if isinstance(e, WebrlError) or type(e) in (ValueError, RuntimeError) or known_error(e) == 2:
        return str(e)
    if isinstance(e, OSError) and e.filename and e.strerror:
        return f"{e.filename}: {e.strerror}"
    return f"{type(e).__name__}: {e}"  # e.g. "RunDirBusy: ...": the kind of failure tells what to do


def report_error(e: BaseException) -> int | None:
    """Print a known error as ``webrl: error: <message>`` on stderr and return its exit code; None (nothing printed)
    for any other error, and for every error when WEBRL_TRACEBACK=1 asks for the traceback."""
    code = known_error(e)
    wants_traceback = os.environ.get(TRACEBACK_ENV, "") not in ("", "0")
    if code is None or (wants_traceback and not isinstance(e, click_errors.UsageError)):
        return None
    typer.secho(f"webrl: error: {error_message(e)}", fg=typer.colors.RED, err=True)
    from webrl_core.errors import BadInput, MissingInput

    if code == 1 and not isinstance(e, (MissingInput, OSError, BadInput)):
        typer.echo(f"({TRACEBACK_ENV}=1 shows the traceback)", err=True)
    return code


class WebrlTyper(typer.Typer):
    """The `webrl` command (the console script and ``python -m webrl_cli.main`` call it): the one place that turns
    errors into the documented message and exit code. Known errors (``known_error``), a command-line usage error
    included, print ``webrl: error: ...`` without a traceback and exit with 2 (bad input) or 1 (a missing file,
    another explained failure); set WEBRL_TRACEBACK=1 for the traceback. Any other exception is a bug and keeps its
    traceback. (typer's CliRunner calls the command's ``main`` instead, so tests there see the exception itself.)"""

    def __call__(self, *args, **kwargs):
        try:
            rv = super().__call__(*args, standalone_mode=False, **kwargs)
        except click_errors.NoArgsIsHelpError as e:  # `webrl store`: the group's help, as click shows it
            e.show()
            sys.exit(e.exit_code)
        except typer.Abort:
            typer.echo("Aborted!", err=True)
            sys.exit(1)
        except SystemExit as e:
            # `webrl ... | head`: the reader closed the pipe, having what it wanted; rich and typer turn the EPIPE into
            # exit 1 (stdout already pointed at /dev/null or pacified), but a closed pipe is no error of the command
            if e.code == 1 and isinstance(e.__context__, BrokenPipeError):
                sys.exit(0)
            raise
        except Exception as e:
            code = report_error(e)
            if code is None:
                raise
            sys.exit(code)
        sys.exit(rv if isinstance(rv, int) else 0)  # a command's typer.Exit(code) comes back as its code


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

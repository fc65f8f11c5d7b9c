"""`webrl serve ...`: local servers, bound to 127.0.0.1.

Stopping: Ctrl-C (SIGINT), SIGTERM (kill, systemd, docker) and SIGHUP (the terminal closed) all take the same orderly
path: the children are stopped (for Prefect the worker first, then the server), each through its whole process
group, and `webrl serve` exits with 0 once nothing it started is left. A further signal during that stop is ignored
(the stop is bounded: it SIGKILLs what does not exit in time). If the server exits on its own the exit code is
non-zero. A watchdog process stops the children if `webrl serve` itself is killed with SIGKILL (see
webrl_cli.prefect_stack.watchdog).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import typer

app = typer.Typer(no_args_is_help=True)

_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _stop_on_signals() -> None:
    """SIGTERM and SIGHUP raise KeyboardInterrupt, as Ctrl-C does, so that all three run the same `finally`. The
    default actions would end this process at once and leave the children, which are in sessions of their own and
    so receive nothing, running, orphaned."""

    def handler(signum, frame):
        _ignore_signals()
        try:
            typer.echo(f"{signal.Signals(signum).name}: stopping ...", err=True)
        except OSError:  # after SIGHUP the terminal may be gone; the stop matters, not the message
            pass
        raise KeyboardInterrupt

    for s in _STOP_SIGNALS:
        signal.signal(s, handler)


def _ignore_signals() -> None:
    """While stopping: a further signal must not cut the stop short and leave half the children running."""
    for s in _STOP_SIGNALS:
        signal.signal(s, signal.SIG_IGN)


@app.command("mlflow")
def serve_mlflow(run_dir: str = typer.Option("runs/demo", help="run directory whose mlflow.db to serve"),
                 port: int = typer.Option(5000, min=1, max=65535, help="port on 127.0.0.1")):
    """MLflow UI on 127.0.0.1 with a low memory footprint (1 worker, job execution off). Ctrl-C, SIGTERM or SIGHUP
    stops it (exit code 0)."""
    import subprocess

    from webrl_cli.prefect_stack import watchdog

    from webrl_core.errors import MissingInput
    from webrl_core.scale.processes import descendants, stop_group, terminate

    run = Path(run_dir).resolve()
    if not run.is_dir():  # a typo would otherwise serve an empty UI from a new folder
        raise MissingInput(f"--run-dir {run_dir}: no such run directory (`webrl demo`, `webrl train` or "
                           f"`webrl bootstrap` make one)")
    env = dict(os.environ, MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false")
    cmd = [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
           "--backend-store-uri", f"sqlite:///{run / 'mlflow.db'}", "--artifacts-destination", str(run / "mlartifacts")]
    code = 0
    with watchdog():
        proc = None
        try:
            _stop_on_signals()
            typer.echo(f"MLflow UI: http://127.0.0.1:{port}  (Ctrl-C stops it)")
            # its own session: Ctrl-C reaches only this process, and the server's group (it and its uvicorn) can be
            # stopped as a whole
            proc = subprocess.Popen(cmd, env=env, start_new_session=True)
            code = proc.wait()
            typer.echo(f"the MLflow server exited with {code}", err=True)
            code = code or 1
        except KeyboardInterrupt:
            pass
        finally:
            _ignore_signals()
            if proc is not None:
                tree = descendants(proc.pid)
                stop_group(proc, signal.SIGTERM, timeout=30)
                terminate(tree)  # anything that left the group
    raise typer.Exit(code)


@app.command("prefect")
def serve_prefect(port: int = typer.Option(4200, min=1, max=65535, help="Prefect server port on 127.0.0.1"),
                  home: str = typer.Option("runs/.prefect", help="PREFECT_HOME (server DB, logs)"),
                  run_root: str = typer.Option("runs", envvar="WEBRL_RUN_ROOT",
                                               help="where the worker's flow runs put run dirs (each with its task "
                                               "cache) when the config does not set run.root")):
    """Prefect server + process work pool + deployments (infra/prefect.yaml) + a worker; Ctrl-C, SIGTERM or SIGHUP
    stops them, the worker first (exit code 0). The worker's flow runs use the checkout $WEBRL_REPO names (default:
    the one webrl is installed from) and the run root given here."""
    from webrl_cli.prefect_stack import PrefectStack, watchdog

    code = 0
    with watchdog():
        stack = PrefectStack(home, port, run_root=run_root)
        try:
            _stop_on_signals()
            typer.echo("starting the Prefect server ...")
            stack.start_server()
            typer.echo("deploying webrl-phase/default, webrl-train/demo and webrl-eval/oracle to pool webrl-pool ...")
            stack.deploy()
            stack.start_worker()
            typer.echo(f"Prefect UI: http://127.0.0.1:{port}\n"
                       f"run a phase: PREFECT_API_URL={stack.api} prefect deployment run 'webrl-phase/default' "
                       "--param phase=2\n"
                       "Ctrl-C stops the worker, then the server.")
            while True:
                time.sleep(1)
                if stack.server.poll() is not None:
                    typer.echo(f"the server exited with {stack.server.returncode}", err=True)
                    code = 1
                    break
        except KeyboardInterrupt:
            pass
        finally:
            _ignore_signals()
            stack.stop()
    raise typer.Exit(code)

"""`webrl serve ...`: local servers, bound to 127.0.0.1."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import typer

app = typer.Typer(no_args_is_help=True)


@app.command("mlflow")
def serve_mlflow(run_dir: str = typer.Option("runs/demo", help="run directory whose mlflow.db to serve"),
                 port: int = typer.Option(5000, help="port on 127.0.0.1")):
    """MLflow UI on 127.0.0.1 with a low memory footprint (1 worker, job execution off)."""
    run = Path(run_dir).resolve()
    run.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false")
    cmd = [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
           "--backend-store-uri", f"sqlite:///{run / 'mlflow.db'}", "--artifacts-destination", str(run / "mlartifacts")]
    typer.echo(f"MLflow UI: http://127.0.0.1:{port}  (Ctrl-C stops it)")
    proc = subprocess.Popen(cmd, env=env)
    try:
        proc.wait()
    except KeyboardInterrupt:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)


@app.command("prefect")
def serve_prefect(port: int = typer.Option(4200, help="Prefect server port on 127.0.0.1"),
                  home: str = typer.Option("runs/.prefect", help="PREFECT_HOME (server DB, logs)"),
                  run_root: str = typer.Option("runs", help="where runs and cached task results live")):
    """Prefect server + process work pool + deployments (infra/prefect.yaml) + a worker; Ctrl-C stops them (workers first)."""
    from webrl_cli.prefect_stack import PrefectStack

    stack = PrefectStack(home, port, run_root=run_root)
    try:
        typer.echo("starting the Prefect server ...")
        stack.start_server()
        typer.echo("deploying webrl-phase/default and webrl-train/demo to pool webrl-pool ...")
        stack.deploy()
        stack.start_worker()
        typer.echo(f"Prefect UI: http://127.0.0.1:{port}\n"
                   f"run a phase: PREFECT_API_URL={stack.api} prefect deployment run 'webrl-phase/default' --param phase=2\n"
                   "Ctrl-C stops the worker, then the server.")
        while True:
            time.sleep(1)
            if stack.server.poll() is not None:
                typer.echo("the server exited", err=True)
                break
    except KeyboardInterrupt:
        pass
    finally:
        stack.stop()

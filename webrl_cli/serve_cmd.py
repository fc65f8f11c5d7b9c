"""`webrl serve ...`: local servers, bound to 127.0.0.1."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
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

"""MLflow tracking helpers: one MLflow run per flow run, nested runs for sub-flows.

Where: ``MLFLOW_TRACKING_URI`` if set, else ``tracking.mlflow_uri`` from the config, else a SQLite store
``<run_dir>/mlflow.db`` (MLflow 3.17 refuses the file store by default) with artifacts under
``<run_dir>/mlartifacts`` (set at experiment creation, so they never land in the cwd).
What: the resolved config flattened to params (``section.key``), metrics per phase/stage, artifacts
(plots, viewer, tables); models are logged as artifact folders.
Which run: a flow names its MLflow run by a key (``start_run(key=...)``; flows/context.py digests the flow, its
parameters, the config, the code, the run dir's identity and the flow's results into it). A later call with the same
key continues that MLflow run instead of opening another and leaves out metric values the run already holds:
re-running a finished phase from the cache adds no MLflow run.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any, Iterator

os.environ.setdefault("MLFLOW_ENABLE_ASYNC_LOGGING", "false")

RUN_KEY_TAG = "webrl.run_key"
_continued: set[str] = set()  # MLflow runs of this process that continue an earlier flow run (same key)


def tracking_uri(run_dir: str | Path, configured: str | None = None) -> str:
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return os.environ["MLFLOW_TRACKING_URI"]
    if configured:
        return configured
    return f"sqlite:///{(Path(run_dir).resolve() / 'mlflow.db').as_posix()}"


def flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(flatten(v, key + "."))
        else:
            out[key] = json.dumps(v) if isinstance(v, (list, dict)) else v
    return out


def setup(run_dir: str | Path, experiment: str = "webrl", configured_uri: str | None = None) -> str:
    """Point MLflow at the run's store and make sure the experiment exists with its artifact root in the run dir."""
    import mlflow

    uri = tracking_uri(run_dir, configured_uri)
    mlflow.set_tracking_uri(uri)
    client = mlflow.MlflowClient(uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        art = (Path(run_dir).resolve() / "mlartifacts").as_uri() if uri.startswith("sqlite") else None
        try:
            client.create_experiment(experiment, artifact_location=art)
        except Exception:  # created concurrently by another process
            pass
    mlflow.set_experiment(experiment)
    return uri


def run_with_key(key: str, experiment: str = "webrl") -> str | None:
    """The id of the latest MLflow run tagged with ``key`` in ``experiment`` (after ``setup``), or None."""
    import mlflow

    exp = mlflow.get_experiment_by_name(experiment)
    if exp is None:
        return None
    runs = mlflow.MlflowClient().search_runs([exp.experiment_id], f"tags.`{RUN_KEY_TAG}` = '{key}'", max_results=1,
                                             order_by=["attributes.start_time DESC"])
    return runs[0].info.run_id if runs else None


@contextlib.contextmanager
def start_run(run_dir: str | Path, name: str, *, experiment: str = "webrl", config: dict | None = None,
              tags: dict | None = None, configured_uri: str | None = None,
              nested: bool | None = None, run_id: str | None = None, key: str | None = None,
              started_at: float | None = None) -> Iterator[Any]:
    """Open an MLflow run (nested automatically if one is active) and log the flattened config as params. With
    ``key``: continue the run of an earlier call with the same key if there is one (see the module docstring).
    ``started_at`` (seconds since the epoch): the new run's start time, for a run opened after its work."""
    import mlflow

    setup(run_dir, experiment, configured_uri)
    if nested is None:
        nested = mlflow.active_run() is not None
    earlier = run_with_key(key, experiment) if key and run_id is None else None
    fresh = run_id is None and earlier is None
    if fresh and key:
        tags = {**(tags or {}), RUN_KEY_TAG: key}
    created = None
    if fresh and started_at is not None:  # created with its start time, then opened like any existing run
        parent = mlflow.active_run() if nested else None
        created = mlflow.MlflowClient().create_run(
            mlflow.get_experiment_by_name(experiment).experiment_id, start_time=int(started_at * 1000), run_name=name,
            tags={**(tags or {}), **({"mlflow.parentRunId": parent.info.run_id} if parent else {})}).info.run_id
    held = mlflow.MlflowClient().get_run(earlier).info if earlier else None
    with mlflow.start_run(run_name=name, nested=nested, run_id=run_id or earlier or created,
                          tags=None if earlier or created else tags) as run:
        if earlier:
            _continued.add(run.info.run_id)
        if config and fresh:
            params = flatten(config)
            items = list(params.items())
            for i in range(0, len(items), 100):  # MLflow caps params per batch
                mlflow.log_params({k: ("" if v is None else str(v)[:6000]) for k, v in items[i:i + 100]})
        yield run
    if held is not None and held.status == "FINISHED":  # the continued run keeps its own duration
        mlflow.MlflowClient().set_terminated(earlier, "FINISHED", end_time=held.end_time)


def log_metrics(metrics: dict[str, Any], step: int | None = None) -> None:
    """Numbers become metrics; strings (e.g. which task filter ran) become tags."""
    import mlflow

    clean = {k.replace(" ", "_"): float(v) for k, v in metrics.items()
             if isinstance(v, (int, float)) and not isinstance(v, bool)}
    run = mlflow.active_run()
    if clean and run is not None and run.info.run_id in _continued:  # what the continued run already holds
        held = mlflow.MlflowClient().get_run(run.info.run_id).data.metrics
        clean = {k: v for k, v in clean.items() if held.get(k) != v}
    if clean:
        mlflow.log_metrics(clean, step=step)
    for k, v in metrics.items():
        if isinstance(v, str):
            mlflow.set_tag(k if step is None else f"{k}.{step}", v[:5000])


def log_artifact(path: str | Path, artifact_path: str | None = None) -> None:
    import mlflow

    p = Path(path)
    if p.is_dir():
        mlflow.log_artifacts(str(p), artifact_path=artifact_path)
    elif p.exists():
        mlflow.log_artifact(str(p), artifact_path=artifact_path)


def log_dict(obj: Any, name: str) -> None:
    import mlflow

    mlflow.log_dict(obj, name)

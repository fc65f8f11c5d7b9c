"""The plumbing around a flow body, kept out of the flows so they read like the paper's Algorithm 1."""

from __future__ import annotations

import contextlib
import hashlib
import json
import time
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Iterator

from prefect import get_run_logger

from tasks.stages import StageRun, task_for
from webrl_core.pipeline import validate
from webrl_core.runs import runlock, tracking
from webrl_core.artifacts import ArtifactRef
from webrl_core.config import WebRLSettings
from webrl_core.config_loader import load_config
from webrl_core.logs import quiet_libraries
from webrl_core.runs.code_identity import CodeIndex
from webrl_core.runs.rundir import library_source_digest, model_ref, results_dir, run_dir_of, run_identity


@dataclass(frozen=True)
class RunContext:
    """One run of a flow: the resolved settings, the run directory and its run id.

    ``run(stage, *args)`` calls the Prefect task of a stage (a ``webrl_core.pipeline`` function; tasks/stages.py
    declares its task) with what it gets of the run (the config sections the stage declares, run dir, run id);
    ``run.submit(stage, *args)`` does the same concurrently and returns the future.
    The task's result, and so its cache, is stored in the run dir (``<run_dir>/.prefect-results``): whichever
    process runs the flow (the CLI, a worker started anywhere) finds the cache of the run dir it works on.
    ``with run.record(*results):`` is the flow's MLflow run (see ``record``)."""

    settings: WebRLSettings
    run_dir: str
    run_id: str
    run_name: str = ""
    params: dict = field(default_factory=dict)
    started: float = field(default_factory=time.time)

    def __call__(self, stage: Callable, *args: Any, **kwargs: Any) -> Any:
        return self._task(stage)(self.stage_run(stage), *args, **kwargs)

    def submit(self, stage: Callable, *args: Any, **kwargs: Any) -> Any:
        return self._task(stage).submit(self.stage_run(stage), *args, **kwargs)

    def _task(self, stage: Callable) -> Any:
        # the stage's cached task, its result kept in the run dir (a Path: a local folder)
        return task_for(stage).with_options(result_storage=results_dir(self.run_dir))

    def stage_run(self, stage: Callable) -> StageRun:
        return StageRun.of(self.settings, self.run_dir, self.run_id, task_for(stage).stage)

    def model(self, phase: int, name: str) -> ArtifactRef:
        """The published model ``name`` (actor, critic, orm) of a phase of this run."""
        return model_ref(self.run_dir, phase, name)

    @contextlib.contextmanager
    def record(self, *results: Any) -> Iterator[Any]:
        """The flow's MLflow run (params: the resolved config), opened once ``results`` (artifact refs, metrics) are
        known, with the flow's start time; sub-flows opened inside it nest under it.

        One MLflow run per result: its key digests the flow, its parameters, the config, the code, the run dir's
        identity and ``results`` (refs by content). A flow run with the key of an earlier one continues that MLflow
        run and adds only values it does not hold yet (``tracking.start_run``), so re-running a finished phase from
        the cache, from the CLI or a deployment, writes no new MLflow run and no new model version."""
        resolved = self.settings.model_dump(mode="json")
        key = hashlib.sha256(json.dumps(
            [self.run_name, self.params, resolved, code_digest(), self.run_id,
             [getattr(r, "sha256", r) for r in results]], sort_keys=True, default=str).encode()).hexdigest()
        with tracking.start_run(self.run_dir, self.run_name, config=resolved, key=key, started_at=self.started,
                                experiment=self.settings.tracking.experiment,
                                configured_uri=self.settings.tracking.mlflow_uri) as mlflow_run:
            yield mlflow_run


@lru_cache(maxsize=1)
def code_digest() -> str:
    """The code a flow runs: the library, the task wrappers and the flows (their definitions, wherever they live:
    ``code_identity``)."""
    here = Path(__file__).resolve().parent
    flows, tasks = (CodeIndex(d).library_identity() for d in (here, here.parent / "tasks"))
    return hashlib.sha256(f"{library_source_digest()}:{flows}:{tasks}".encode()).hexdigest()


@contextlib.contextmanager
def open_run(config: str, overrides: list[str] | None, run_dir: str | None, flow: str, run_name: str,
             phase: int | None = None, model: str | None = None, params: dict | None = None) -> Iterator[RunContext]:
    """Resolve the config and the run dir (``run_dir_of``: ``run_dir``, else the run root and ``run.name``); check
    every input before any work (``validate.preflight``: run dir, test set, store, endpoint, checkpoints); hold the
    run dir's lock (a second flow on the same run dir is refused, never run twice; ``runlock``); record the config
    (an earlier, different one is kept). The MLflow run is the flow's ``run.record(...)``; ``phase``, ``model`` and
    ``params`` are the flow's parameters that its key includes."""
    started = time.time()
    quiet_libraries()  # a flow run started by a Prefect worker gets the CLI's quiet defaults too
    settings = load_config(config, sets=overrides or [])
    rd = str(run_dir_of(settings, run_dir))
    runlock.check_free(rd, f"webrl-{flow}", phase)  # busy: say so, not what the running flow has yet to write
    for warning in validate.preflight(settings, rd, model=model, phase=phase, flow=flow):
        get_run_logger().warning(warning)
    with runlock.hold(rd, flow=f"webrl-{flow}", phase=phase):
        validate.record_config(rd, settings)
        yield RunContext(settings, rd, run_identity(rd), run_name,
                         {"flow": flow, "phase": phase, "model": model, **(params or {})}, started)

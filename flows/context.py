"""The plumbing around a flow body, kept out of the flows so they read like the paper's Algorithm 1."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from prefect import get_run_logger

from tasks.stages import StageRun
from webrl_core.pipeline import validate
from webrl_core.runs import runlock, tracking
from webrl_core.artifacts import ArtifactRef
from webrl_core.config import WebRLSettings, load_config
from webrl_core.logs import quiet_libraries
from webrl_core.runs.rundir import model_ref, run_identity


@dataclass(frozen=True)
class RunContext:
    """One run of a flow: the resolved settings, the run directory and its run id.

    ``run(task, *args)`` calls a stage's Prefect task with what it gets of the run (the config sections its stage
    declares, run dir, run id); ``run.submit(task, *args)`` does the same concurrently and returns the future."""

    settings: WebRLSettings
    run_dir: str
    run_id: str

    def __call__(self, stage_task: Any, *args: Any, **kwargs: Any) -> Any:
        return stage_task(self.stage_run(stage_task), *args, **kwargs)

    def submit(self, stage_task: Any, *args: Any, **kwargs: Any) -> Any:
        return stage_task.submit(self.stage_run(stage_task), *args, **kwargs)

    def stage_run(self, stage_task: Any) -> StageRun:
        return StageRun.of(self.settings, self.run_dir, self.run_id, stage_task.stage)

    def model(self, phase: int, name: str) -> ArtifactRef:
        """The published model ``name`` (actor, critic, orm) of a phase of this run."""
        return model_ref(self.run_dir, phase, name)


@contextlib.contextmanager
def open_run(config: str, overrides: list[str] | None, run_dir: str | None, flow: str, run_name: str,
             phase: int | None = None, model: str | None = None) -> Iterator[RunContext]:
    """Resolve the config; check every input before any work (``validate.preflight``: run dir, test set, store,
    endpoint, checkpoints); hold the run dir's lock (a second flow on the same run dir is refused, never run
    twice; ``runlock``); record the config (an earlier, different one is kept); open the MLflow run."""
    quiet_libraries()  # a flow run started by a Prefect worker gets the CLI's quiet defaults too
    settings = load_config(config, sets=overrides or [])
    rd = str(Path(run_dir or settings.run_dir()).resolve())
    runlock.check_free(rd, f"webrl-{flow}", phase)  # busy: say so, not what the running flow has yet to write
    for warning in validate.preflight(settings, rd, model=model, phase=phase, flow=flow):
        get_run_logger().warning(warning)
    with runlock.hold(rd, flow=f"webrl-{flow}", phase=phase):
        validate.record_config(rd, settings)
        with tracking.start_run(rd, run_name, config=settings.model_dump(mode="json"),
                                experiment=settings.tracking.experiment, configured_uri=settings.tracking.mlflow_uri):
            yield RunContext(settings, rd, run_identity(rd))

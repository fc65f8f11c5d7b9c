"""One cached Prefect task per WebRL stage, declared in one line each (``webrl_core.pipeline`` holds the logic;
each stage declares the config sections it reads).

A task receives a ``StageRun`` (only the config sections its stage declares, the run dir, and the run id: a UUID
stored in the run dir, so a deleted and re-created run dir never hits stale results), then the stage's own
arguments: content-addressed ``ArtifactRef``s and plain values. ``rerun_when`` is an argument the stage never
reads: a digest of something the stage's inputs do not show (the labels of the episodes it reads), given only so
that its change re-runs the task. The cache key (tasks/caching.py) is the task's name, the identity of the code
its stage runs and these inputs: changing one knob re-runs exactly the tasks whose stages read it and those whose
inputs then change.
"""

from __future__ import annotations

import inspect
import sys
from typing import Any, Callable

from prefect import task
from pydantic import BaseModel

from tasks.caching import StageCode
from webrl_core.config import WebRLSettings
from webrl_core.pipeline import bootstrap, evaluation, experience, generation, task_sets, updates
from webrl_core.pipeline.stage import config_for


class StageRun(BaseModel):
    """What a stage's task gets of the run: the config sections the stage declares, the run dir and run id."""

    config: dict[str, Any]
    run_dir: str
    run_id: str

    @classmethod
    def of(cls, settings: WebRLSettings, run_dir: str, run_id: str, stage_fn: Callable) -> "StageRun":
        return cls(config=config_for(settings, stage_fn), run_dir=run_dir, run_id=run_id)

    def settings(self) -> WebRLSettings:
        return WebRLSettings.model_validate(self.config)


def stage_task(stage_fn: Callable, name: str, rerun_when: bool = False, hide: tuple[str, ...] = (),
               **options: Any) -> Any:
    """The cached Prefect task ``name`` that runs ``stage_fn(settings, run_dir, *args)`` (``settings`` only if
    the stage takes it). Its parameters are ``run: StageRun``, the stage's own, less those in ``hide`` (left at
    their defaults), then ``rerun_when`` if asked for. ``task.stage`` is the stage."""
    signature = inspect.signature(stage_fn)
    takes_settings = "settings" in signature.parameters
    own = [p for n, p in signature.parameters.items() if n not in ("settings", "run_dir", *hide)]
    extra = [inspect.Parameter("rerun_when", inspect.Parameter.KEYWORD_ONLY, annotation=Any)] if rerun_when else []
    run_param = inspect.Parameter("run", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=StageRun)

    def run_stage(run: StageRun, *args: Any, rerun_when: Any = None, **kwargs: Any) -> Any:
        # looked up at call time: the fault harness wraps a stage in its module (benchmarks/faults/probes.py)
        fn = getattr(sys.modules[stage_fn.__module__], stage_fn.__name__)
        head = (run.settings(), run.run_dir) if takes_settings else (run.run_dir,)
        return fn(*head, *args, **kwargs)

    run_stage.__name__ = run_stage.__qualname__ = stage_fn.__name__
    run_stage.__doc__ = stage_fn.__doc__
    run_stage.__signature__ = signature.replace(parameters=[run_param, *own, *extra])
    run_stage.stage = stage_fn
    t = task(name=name, cache_policy=StageCode(), persist_result=True, **options)(run_stage)
    t.stage = stage_fn
    TASKS[_qualified(stage_fn)] = t
    return t


TASKS: dict[str, Any] = {}
"""``module.name`` of a stage function -> its task."""


def _qualified(fn: Callable) -> str:
    return f"{fn.__module__}.{fn.__name__}"


def task_for(stage_fn: Callable) -> Any:
    """The task of a stage function (the flows name stages by their library function; a wrapper that keeps its
    name and module, as the fault harness's probes do, finds the same task)."""
    try:
        return TASKS[_qualified(stage_fn)]
    except KeyError:
        raise KeyError(f"{_qualified(stage_fn)} has no Prefect task: declare one in tasks/stages.py") from None


train_pool = stage_task(task_sets.train_task_pool, "task-pool")
seed_tasks = stage_task(task_sets.seed_task_set, "seed-tasks")
test_set = stage_task(task_sets.test_task_set, "test-set")
rollout_shard = stage_task(experience.rollout, "rollout-shard", retries=1)
label_with_env = stage_task(experience.label_with_env, "label-with-env")
build_tokenizer = stage_task(bootstrap.build_tokenizer, "build-tokenizer")
init_embedded_actor = stage_task(bootstrap.init_embedded_actor, "init-embedded-actor")
sft_actor = stage_task(bootstrap.sft_actor, "sft-actor")
adopt_actor = stage_task(bootstrap.adopt_actor, "adopt-actor")
sft_from_data = stage_task(bootstrap.sft_from_data, "sft-from-data")
train_orm = stage_task(bootstrap.train_orm, "train-orm")
init_critic = stage_task(bootstrap.init_critic, "init-critic")
# rerun_when: a digest of the previous phase's labelled episodes (new failures, new tasks)
generate_tasks = stage_task(generation.generate_tasks, "generate-tasks", rerun_when=True, retries=2)
filter_tasks = stage_task(generation.filter_tasks, "filter-tasks")
materialise_tasks = stage_task(task_sets.materialise_tasks, "materialise-tasks")
orm_label = stage_task(experience.orm_label, "orm-label")
judge_label = stage_task(experience.judge_label, "judge-label")
# rerun_when: the ORM stage's result (relabelled episodes)
phase_transitions = stage_task(experience.phase_transitions, "build-transitions", rerun_when=True)
replay_transitions = stage_task(experience.replay_transitions, "replay-selection")
update_critic = stage_task(updates.update_critic, "train-critic")
update_actor = stage_task(updates.update_actor, "train-actor")
evaluate = stage_task(evaluation.evaluate, "evaluate", hide=("purpose",))

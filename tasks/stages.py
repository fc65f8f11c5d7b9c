"""One cached Prefect task per WebRL stage (``webrl_core.pipeline`` holds the logic; each stage declares the
config sections it reads).

Caching: ``INPUTS + TASK_SOURCE`` (+ the library's source digest) with persisted results. Each task receives a
``StageRun``: only the config sections its stage declares, the run dir, and the run id (a UUID stored in the run
dir, so a deleted and re-created run dir never hits stale results); its other inputs are content-addressed
``ArtifactRef``s. Changing one knob re-runs exactly the tasks whose stages read it and those whose inputs then
change.
"""

from __future__ import annotations

from typing import Any, Callable

from prefect import task
from prefect.cache_policies import INPUTS, TASK_SOURCE, CacheKeyFnPolicy
from pydantic import BaseModel

from webrl_core.config import WebRLSettings
from webrl_core.pipeline import bootstrap, evaluation, experience, generation, task_sets, updates
from webrl_core.pipeline.stage import config_for
from webrl_core.runs.rundir import library_source_digest


LIBRARY_SOURCE = CacheKeyFnPolicy(cache_key_fn=lambda ctx, params: library_source_digest())
CACHED = dict(cache_policy=INPUTS + TASK_SOURCE + LIBRARY_SOURCE, persist_result=True)


def stage_task(stage_fn: Callable, name: str, **options) -> Callable[[Callable], Any]:
    """The cached Prefect task named ``name`` that runs ``stage_fn``; ``task.stage`` names the stage, whose declared
    config sections make up the task's ``StageRun``."""
    def wrap(fn: Callable):
        t = task(name=name, **CACHED, **options)(fn)
        t.stage = stage_fn
        return t
    return wrap


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


@stage_task(task_sets.train_task_pool, "task-pool")
def train_pool(run: StageRun, n: int, seed_offset: int, name: str):
    return task_sets.train_task_pool(run.settings(), run.run_dir, n, seed_offset, name)


@stage_task(task_sets.seed_task_set, "seed-tasks")
def seed_tasks(run: StageRun, seed_ref):
    return task_sets.seed_task_set(run.settings(), run.run_dir, seed_ref)


@stage_task(task_sets.test_task_set, "test-set")
def test_set(run: StageRun):
    return task_sets.test_task_set(run.settings(), run.run_dir)


@stage_task(experience.rollout, "rollout-shard", retries=1)
def rollout_shard(run: StageRun, phase: int, purpose: str, tasks_ref, actor_ref, temperature: float, shard: int,
                  n_shards: int, samples_per_task: int = 1):
    return experience.rollout(run.settings(), run.run_dir, phase, purpose, tasks_ref, actor_ref, temperature, shard,
                              n_shards, samples_per_task)


@stage_task(experience.label_with_env, "label-with-env")
def label_with_env(run: StageRun, rollouts: dict):
    return experience.label_with_env(run.run_dir, rollouts)


@stage_task(bootstrap.build_tokenizer, "build-tokenizer")
def build_tokenizer(run: StageRun, demos: dict):
    return bootstrap.build_tokenizer(run.settings(), run.run_dir, demos)


@stage_task(bootstrap.init_embedded_actor, "init-embedded-actor")
def init_embedded_actor(run: StageRun, tokenizer_ref):
    return bootstrap.init_embedded_actor(run.settings(), run.run_dir, tokenizer_ref)


@stage_task(bootstrap.sft_actor, "sft-actor")
def sft_actor(run: StageRun, init_ref, demos: dict):
    return bootstrap.sft_actor(run.settings(), run.run_dir, init_ref, demos)


@stage_task(bootstrap.adopt_actor, "adopt-actor")
def adopt_actor(run: StageRun, actor_ref):
    return bootstrap.adopt_actor(run.run_dir, actor_ref)


@stage_task(bootstrap.sft_from_data, "sft-from-data")
def sft_from_data(run: StageRun, base_ref, data_ref):
    return bootstrap.sft_from_data(run.settings(), run.run_dir, base_ref, data_ref)


@stage_task(bootstrap.train_orm, "train-orm")
def train_orm(run: StageRun, rollouts: list, base_ref):
    return bootstrap.train_orm(run.settings(), run.run_dir, rollouts, base_ref)


@stage_task(bootstrap.init_critic, "init-critic")
def init_critic(run: StageRun, actor_ref):
    return bootstrap.init_critic(run.settings(), run.run_dir, actor_ref)


@stage_task(generation.generate_tasks, "generate-tasks", retries=2)
def generate_tasks(run: StageRun, phase: int, seed_purpose: str, seed_state: str):
    # seed_state: a digest of the previous phase's labelled episodes, so new failures invalidate the cache
    return generation.generate_tasks(run.settings(), run.run_dir, phase, seed_purpose)


@stage_task(generation.filter_tasks, "filter-tasks")
def filter_tasks(run: StageRun, phase: int, candidates_ref, critic_ref, trained_critic: bool, orm_ref):
    return generation.filter_tasks(run.settings(), run.run_dir, phase, candidates_ref, critic_ref, trained_critic,
                                   orm_ref)


@stage_task(task_sets.materialise_tasks, "materialise-tasks")
def materialise_tasks(run: StageRun, phase: int, tasks_ref):
    return task_sets.materialise_tasks(run.run_dir, phase, tasks_ref)


@stage_task(experience.orm_label, "orm-label")
def orm_label(run: StageRun, phase: int, rollouts: dict, orm_ref):
    return experience.orm_label(run.settings(), run.run_dir, phase, rollouts, orm_ref)


@stage_task(experience.phase_transitions, "build-transitions")
def phase_transitions(run: StageRun, phase: int, rollouts: dict, labels: dict):
    # labels: the ORM stage's result, so relabelled episodes invalidate the cache
    return experience.phase_transitions(run.settings(), run.run_dir, phase, rollouts)


@stage_task(experience.replay_transitions, "replay-selection")
def replay_transitions(run: StageRun, phase: int, actor_ref, samples_ref):
    return experience.replay_transitions(run.settings(), run.run_dir, phase, actor_ref, samples_ref)


@stage_task(updates.update_critic, "train-critic")
def update_critic(run: StageRun, phase: int, samples_ref, replay_ref, backbone_ref, prev_critic_ref):
    return updates.update_critic(run.settings(), run.run_dir, phase, samples_ref, replay_ref, backbone_ref,
                                 prev_critic_ref)


@stage_task(updates.update_actor, "train-actor")
def update_actor(run: StageRun, phase: int, samples_ref, replay_ref, actor_ref, critic_ref):
    return updates.update_actor(run.settings(), run.run_dir, phase, samples_ref, replay_ref, actor_ref, critic_ref)


@stage_task(evaluation.evaluate, "evaluate")
def evaluate(run: StageRun, phase: int, actor_ref, test_ref, name: str | None = None):
    return evaluation.evaluate(run.settings(), run.run_dir, phase, actor_ref, test_ref, name=name)

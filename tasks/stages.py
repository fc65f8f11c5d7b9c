"""One cached Prefect task per WebRL stage (webrl_core.stages holds the logic).

Caching: ``INPUTS + TASK_SOURCE`` (+ the library's source digest) with persisted results. Each task receives only the config sections its
stage reads (``cfg``), the run id (a UUID stored in the run dir, so a deleted and re-created run dir never
hits stale results), and content-addressed ``ArtifactRef`` inputs: changing one knob re-runs exactly the
tasks that read it and those whose inputs then change.
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

from prefect import task
from prefect.cache_policies import INPUTS, TASK_SOURCE, CacheKeyFnPolicy

import webrl_core
from webrl_core import stages
from webrl_core.config import WebRLSettings


@functools.lru_cache(maxsize=1)
def library_source_digest() -> str:
    """sha256 of webrl_core's Python sources: a task's "source" is its wrapper AND the library code it calls."""
    h = hashlib.sha256()
    root = Path(webrl_core.__file__).parent
    for f in sorted(root.rglob("*.py")):
        h.update(f.relative_to(root).as_posix().encode() + b"\0" + f.read_bytes())
    return h.hexdigest()


LIBRARY_SOURCE = CacheKeyFnPolicy(cache_key_fn=lambda ctx, params: library_source_digest())
CACHED = dict(cache_policy=INPUTS + TASK_SOURCE + LIBRARY_SOURCE, persist_result=True)

# config sections each stage reads (the rest stay at defaults inside the task and are never used)
SECTIONS = {
    "pool": ("run",),
    "test": ("run", "eval", "sites"),
    "rollout": ("run", "sites", "env", "policy", "models", "prompt", "rollout"),
    "tokenizer": ("run", "models", "orm"),
    "sft": ("run", "models", "actor", "training"),
    "orm_train": ("run", "models", "orm", "training"),
    "critic_init": ("run", "models", "critic"),
    "generate": ("run", "curriculum", "policy"),
    "filter": ("run", "sites", "env", "models", "critic", "curriculum", "orm"),
    "orm_label": ("models", "orm"),
    "samples": ("actor",),
    "replay": ("run", "models", "replay", "actor", "policy"),
    "train": ("run", "models", "actor", "critic", "training"),
    "eval": ("run", "sites", "env", "policy", "models", "prompt", "eval", "rollout"),
}


def cfg_for(settings: WebRLSettings, stage: str) -> dict:
    full = settings.model_dump(mode="json")
    return {k: full[k] for k in SECTIONS[stage]}


def _s(cfg: dict) -> WebRLSettings:
    return WebRLSettings.model_validate(cfg)


@task(name="task-pool", **CACHED)
def train_pool(cfg: dict, run_dir: str, run_id: str, n: int, seed_offset: int, name: str):
    return stages.train_task_pool(_s(cfg), run_dir, n, seed_offset, name)


@task(name="test-set", **CACHED)
def test_set(cfg: dict, run_dir: str, run_id: str):
    return stages.test_task_set(_s(cfg), run_dir)


@task(name="rollout-shard", retries=1, **CACHED)
def rollout_shard(cfg: dict, run_dir: str, run_id: str, phase: int, purpose: str, tasks_ref, actor_ref,
                  temperature: float, shard: int, n_shards: int):
    return stages.rollout(_s(cfg), run_dir, phase, purpose, tasks_ref, actor_ref, temperature, shard, n_shards)


@task(name="label-with-env", **CACHED)
def label_with_env(run_dir: str, run_id: str, rollouts: dict):
    return stages.label_with_env(run_dir, rollouts)


@task(name="build-tokenizer", **CACHED)
def build_tokenizer(cfg: dict, run_dir: str, run_id: str, demos: dict):
    return stages.build_tokenizer(_s(cfg), run_dir, demos)


@task(name="sft-actor", **CACHED)
def sft_actor(cfg: dict, run_dir: str, run_id: str, tokenizer_ref, demos: dict):
    return stages.sft_actor(_s(cfg), run_dir, tokenizer_ref, demos)


@task(name="train-orm", **CACHED)
def train_orm(cfg: dict, run_dir: str, run_id: str, rollouts: list, base_ref):
    return stages.train_orm_stage(_s(cfg), run_dir, rollouts, base_ref)


@task(name="init-critic", **CACHED)
def init_critic(cfg: dict, run_dir: str, run_id: str, actor_ref):
    return stages.init_critic(_s(cfg), run_dir, actor_ref)


@task(name="generate-tasks", retries=2, **CACHED)
def generate_tasks(cfg: dict, run_dir: str, run_id: str, phase: int, seed_purpose: str, seed_state: str):
    # seed_state: a digest of the previous phase's labelled episodes, so new failures invalidate the cache
    return stages.generate_tasks(_s(cfg), run_dir, phase, seed_purpose)


@task(name="filter-tasks", **CACHED)
def filter_tasks(cfg: dict, run_dir: str, run_id: str, phase: int, candidates_ref, critic_ref, trained_critic: bool,
                 orm_ref):
    return stages.filter_tasks(_s(cfg), run_dir, phase, candidates_ref, critic_ref, trained_critic, orm_ref)


@task(name="materialise-tasks", **CACHED)
def materialise_tasks(run_dir: str, run_id: str, phase: int, tasks_ref):
    return stages.materialise_tasks(run_dir, phase, tasks_ref)


@task(name="orm-label", **CACHED)
def orm_label(cfg: dict, run_dir: str, run_id: str, phase: int, rollouts: dict, orm_ref):
    return stages.orm_label(_s(cfg), run_dir, phase, rollouts, orm_ref)


@task(name="build-transitions", **CACHED)
def build_samples(cfg: dict, run_dir: str, run_id: str, phase: int, rollouts: dict, labels: dict):
    return stages.build_samples(_s(cfg), run_dir, phase, rollouts)


@task(name="replay-selection", **CACHED)
def select_replay(cfg: dict, run_dir: str, run_id: str, phase: int, actor_ref, samples_ref):
    return stages.select_replay(_s(cfg), run_dir, phase, actor_ref, samples_ref)


@task(name="train-critic", **CACHED)
def train_critic(cfg: dict, run_dir: str, run_id: str, phase: int, samples_ref, replay_ref, backbone_ref,
                 prev_critic_ref):
    return stages.train_critic_stage(_s(cfg), run_dir, phase, samples_ref, replay_ref, backbone_ref, prev_critic_ref)


@task(name="train-actor", **CACHED)
def train_actor(cfg: dict, run_dir: str, run_id: str, phase: int, samples_ref, replay_ref, actor_ref, critic_ref):
    return stages.train_actor_stage(_s(cfg), run_dir, phase, samples_ref, replay_ref, actor_ref, critic_ref)


@task(name="evaluate", **CACHED)
def evaluate(cfg: dict, run_dir: str, run_id: str, phase: int, actor_ref, test_ref, name: str | None = None):
    return stages.evaluate(_s(cfg), run_dir, phase, actor_ref, test_ref, name=name)

"""Task sets: training pools sampled from the embedded task families, the held-out test set (embedded or a
WebArena-Lite task file), and a phase's kept tasks written out as one WebArena-Lite config per task."""

from __future__ import annotations

import json
from pathlib import Path

from webrl_core.pipeline import validate
from webrl_core.artifacts import ArtifactRef, read_json, write_json
from webrl_core.env.webarena import load_webarena_tasks, to_task_row
from webrl_core.pipeline.stage import stage
from webrl_core.runs.rundir import phase_dir, write_json_version
from webrl_core.sites.tasks import test_set, train_tasks
from webrl_core.runs.store import TrajectoryStore


def stratified(tasks: list[dict], n: int | None) -> list[dict]:
    """Every k-th task per site so a subset keeps the per-site mix."""
    if n is None or n >= len(tasks):
        return tasks
    by_site: dict[str, list[dict]] = {}
    for t in tasks:
        by_site.setdefault(t["sites"][0], []).append(t)
    out: list[dict] = []
    i = 0
    while len(out) < n:
        for site in sorted(by_site):
            if i < len(by_site[site]) and len(out) < n:
                out.append(by_site[site][i])
        i += 1
    return out


@stage("run", "sites")
def train_task_pool(settings, run_dir: str, n: int, seed_offset: int, name: str) -> ArtifactRef:
    """Sample n tasks from the embedded training families (deterministic from the run seed)."""
    tasks = train_tasks(n, seed=settings.run.seed * 1000 + seed_offset, data_seed=settings.sites.data_seed)
    TrajectoryStore(run_dir).write_tasks([to_task_row(t, 0, "train", family=t.get("family")) for t in tasks])
    return write_json(tasks, phase_dir(run_dir, "tasks", 0) / f"{name}.json")


@stage("eval", "sites")
def test_task_set(settings, run_dir: str) -> ArtifactRef:
    """The held-out test set: the embedded one, or a WebArena-Lite raw file with URLs substituted."""
    if settings.eval.test_set == "embedded":
        tasks = test_set(data_seed=settings.sites.data_seed)
    elif settings.sites.mode == "embedded":  # placeholders stay: the embedded sites fill them per episode
        tasks = load_webarena_tasks(settings.eval.test_set, {}, missing="keep")
    else:
        tasks = load_webarena_tasks(settings.eval.test_set, settings.sites.urls, missing="error")
    tasks = stratified(tasks, settings.eval.max_tasks)
    validate.check_test_set(tasks, f"eval.test_set {settings.eval.test_set}")
    TrajectoryStore(run_dir).write_tasks([to_task_row(t, 0, "test", family=t.get("family")) for t in tasks])
    return write_json(tasks, Path(run_dir) / "tasks" / "test.json")


@stage("sites")
def seed_task_set(settings, run_dir: str, seed_ref: ArtifactRef) -> ArtifactRef:
    """``curriculum.seed_tasks``: a WebArena-Lite-format task file whose tasks the phase-0 actor rolls out, so that
    phase 1 has failures to evolve from (WebRL issue #34: the SFT model on the original training tasks)."""
    if settings.sites.mode == "embedded":  # placeholders stay: the embedded sites fill them per episode
        tasks = load_webarena_tasks(seed_ref.path, {}, missing="keep")
    else:
        tasks = load_webarena_tasks(seed_ref.path, settings.sites.urls, missing="error")
    if not tasks:
        raise ValueError(f"curriculum.seed_tasks {seed_ref.path}: no tasks")
    TrajectoryStore(run_dir).write_tasks([to_task_row(t, 0, "seed", family=t.get("family")) for t in tasks])
    return write_json(tasks, phase_dir(run_dir, "tasks", 0) / "seed_tasks.json")


@stage()
def materialise_tasks(run_dir: str, phase: int, tasks_ref: ArtifactRef) -> ArtifactRef:
    """Record the phase's tasks in the store and write one WebArena-Lite config per task."""
    tasks = read_json(tasks_ref)
    folder = phase_dir(run_dir, "tasks", phase) / "configs"
    folder.mkdir(parents=True, exist_ok=True)
    for t in tasks:
        (folder / f"{t['task_id']}.json").write_text(json.dumps(t, indent=1))
    TrajectoryStore(run_dir).write_tasks([to_task_row(t, phase, "generated", t.get("parent_task_id"), t.get("family"))
                                          for t in tasks])
    return write_json_version(tasks, phase_dir(run_dir, "tasks", phase) / "tasks.json", tasks_ref.sha256[:12])


def count_sites(tasks: list[dict]) -> dict[str, int]:
    """Tasks per (first) site."""
    out: dict[str, int] = {}
    for t in tasks:
        out[t["sites"][0]] = out.get(t["sites"][0], 0) + 1
    return out

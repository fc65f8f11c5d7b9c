"""The run directory: where a run's stages write, and how an output is named by what produced it.

Layout: ``tasks/phase=k/*.json``, ``data/phase=k/*.jsonl``, ``models/phase=k/{actor,critic,orm}``, ``store/``,
``eval/phase=k.json`` (or ``eval/model=<digest12>.json``), ``mlflow.db``, ``.run-id``, ``.prefect-results/`` (the
flows' cached task results: the cache travels with the run dir it caches, whichever process or worker reads it).

Where: ``--run-dir`` (a flow's ``run_dir``) if given, else ``<run root>/<run.name>``, the run root being the config's
``run.root`` when it sets one, else ``$WEBRL_RUN_ROOT`` (``webrl serve prefect --run-root`` sets it for its worker),
else ``runs``; relative paths are relative to the working directory (``run_dir_of``).

Versioned outputs: a stage writes ``<dir>/.versions/<name>@<key><ext>``, where ``key`` digests the stage's
settings and inputs, then points ``<dir>/<name>`` (a relative symlink, replaced atomically) at it. Outputs of
different inputs never overwrite each other, so a cached result (which references its own version) stays valid
after a run with another knob value, while ``<dir>/<name>`` names the latest one.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

from webrl_core.artifacts import ArtifactRef, write_json
from webrl_core.runs.code_identity import library_index
from webrl_core.runs.store import TrajectoryStore


RUN_ROOT_ENV = "WEBRL_RUN_ROOT"
RESULTS_DIR = ".prefect-results"


def run_root(settings: Any) -> Path:
    """The folder that holds run dirs: ``run.root`` if the config sets it, else ``$WEBRL_RUN_ROOT``, else the default
    ``runs``, resolved against the working directory."""
    env = os.environ.get(RUN_ROOT_ENV)
    explicit = "root" in settings.run.model_fields_set
    return Path(settings.run.root if explicit or not env else env).resolve()


def run_dir_of(settings: Any, run_dir: str | Path | None = None) -> Path:
    """A flow's run dir: ``run_dir`` if given, else ``<run_root(settings)>/<run.name>``; absolute."""
    return Path(run_dir).resolve() if run_dir else run_root(settings) / settings.run.name


def results_dir(run_dir: str | Path) -> Path:
    """Where the flows keep the run's cached task results (Prefect's result storage for its stages)."""
    return Path(run_dir) / RESULTS_DIR


@functools.lru_cache(maxsize=1)
def library_source_digest() -> str:
    """The library's code: every definition of webrl_core, wherever it lives (``code_identity``: docstrings,
    comments, imports and file layout excluded). What a stage runs is its wrapper AND the library code it calls."""
    return library_index().library_identity()


def output_key(settings: Any, *inputs: Any) -> str:
    """Key of a stage's output: the config sections the stage reads, its inputs (artifact refs by content) and
    the library's code identity: after a code change a re-run writes a new version, and the version a cached
    result (or an ablation's fork) points at is never rewritten in place."""
    blob = json.dumps([settings.model_dump(mode="json"), [getattr(i, "sha256", i) for i in inputs],
                       library_source_digest()], sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def versioned(path: Path, key: str) -> Path:
    """Where to write the version ``key`` of output ``path``; ``publish`` then points ``path`` at it."""
    real = path.parent / ".versions" / f"{path.stem}@{key}{path.suffix}"
    real.parent.mkdir(parents=True, exist_ok=True)
    if real.is_dir():
        shutil.rmtree(real)  # a half-written folder of a killed run
    return real


def publish(path: Path, real: Path) -> Path:
    """Point ``path`` at the version ``real`` (atomic: readers see the old or the new one, never neither)."""
    tmp = path.parent / f".{path.name}.link.tmp"
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    os.symlink(os.path.relpath(real, path.parent), tmp)
    if path.exists() and not path.is_symlink() and path.is_dir():
        shutil.rmtree(path)
    os.replace(tmp, path)
    return real


def phase_dir(run_dir: str | Path, kind: str, phase: int) -> Path:
    """``<run_dir>/<kind>/phase=<phase>``, created."""
    p = Path(run_dir) / kind / f"phase={phase}"
    p.mkdir(parents=True, exist_ok=True)
    return p


def write_json_version(obj: Any, path: Path, key: str) -> ArtifactRef:
    """Write ``obj`` as version ``key`` of ``path`` and publish it."""
    real = versioned(path, key)
    ref = write_json(obj, real)
    publish(path, real)
    return ref


def write_jsonl_version(rows: list[dict], path: Path, key: str) -> ArtifactRef:
    """Write ``rows`` (one JSON object per line) as version ``key`` of ``path`` and publish it."""
    real = versioned(path, key)
    tmp = real.with_suffix(real.suffix + ".tmp")
    with open(tmp, "w") as fh:
        for r in rows:
            fh.write(json.dumps(r, sort_keys=True, default=str) + "\n")
    os.replace(tmp, real)
    publish(path, real)
    return ArtifactRef.of(real, "dataset")


def run_identity(run_dir: str | Path) -> str:
    """A UUID stored in the run dir; part of every cache key, so a re-created run dir never reuses stale results."""
    p = Path(run_dir) / ".run-id"
    if not p.exists():
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(uuid.uuid4().hex)
    return p.read_text().strip()


def model_ref(run_dir: str | Path, phase: int, name: str) -> ArtifactRef:
    """The published model ``name`` (actor, critic, orm) of a phase."""
    p = Path(run_dir) / "models" / f"phase={phase}" / name
    if not p.exists():
        raise FileNotFoundError(f"{p} does not exist: run phase {phase} (or the bootstrap) first")
    return ArtifactRef.of(p, "model")


def labelled_state(run_dir: str | Path, phase: int, policy_digest: str | None = None) -> str:
    """Digest of a phase's episode labels (the seeds of the next generation), of one policy's episodes if given."""
    q = "SELECT episode_id, success FROM episodes WHERE phase = $p"
    args: dict = {"p": phase}
    if policy_digest is not None:
        q, args["pd"] = q + " AND policy_digest = $pd", policy_digest
    rows = TrajectoryStore(run_dir).sql(q + " ORDER BY episode_id", args)
    return hashlib.sha256(json.dumps(rows, default=str).encode()).hexdigest()

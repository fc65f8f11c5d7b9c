"""How a stage's Prefect task finds its cached result.

    key(task) = hash(task name, identity(stage's code), inputs)

``identity`` (webrl_core/runs/code_identity.py) digests the library definitions the stage can run, wherever they
live: moving or splitting a module, editing a docstring or renaming a file keeps a stored run's results valid,
and a change to code the stage runs re-runs it (and, through the content-addressed outputs, what depends on it).
The inputs are the stage's config sections, the run dir and run id (``StageRun``) and its artifact refs.

Run dirs stored before this key existed were keyed by the bytes of the whole library and of the task's source
(``TASK_SOURCE`` and a library digest). ``cache_lineage.json`` records, for such a code version, each task's old
source key and the identity its stage's code had then (recomputed from that revision by
tests/pipeline/test_stage.py); where a stage's code is still the same, the old key is looked up when the new one
has no result, so those runs come back from the cache too.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from prefect.cache_policies import CachePolicy, Inputs
from prefect.utilities.hashing import hash_objects

from webrl_core.runs.code_identity import stage_identity
from webrl_core.runs.rundir import results_dir

LINEAGE = Path(__file__).with_name("cache_lineage.json")


@dataclass
class StageCode(CachePolicy):
    """The cache key of a stage task (see the module docstring)."""

    def compute_key(self, task_ctx: Any, inputs: dict[str, Any], flow_parameters: dict[str, Any],
                    **kwargs: Any) -> Optional[str]:
        task = task_ctx.task
        stage = task.fn.stage
        identity = stage_identity(stage)
        key = hash_objects(task.name, identity, Inputs().compute_key(task_ctx, inputs, flow_parameters),
                           raise_on_failure=True)
        run = inputs.get("run")
        if run is None or (results_dir(run.run_dir) / key).exists():
            return key
        for old in legacy_keys(task.name, identity, inputs):
            if (results_dir(run.run_dir) / old).exists():
                return old
        return key


def legacy_keys(name: str, identity: str, inputs: dict[str, Any]) -> list[str]:
    """The keys the recorded older code versions gave these inputs, for those whose stage code was ``identity``."""
    out = []
    for version in _lineage():
        task = version["tasks"].get(name)
        if not task or task["stage_identity"] != identity:
            continue
        renamed = {task.get("renamed", {}).get(k, k): v for k, v in inputs.items()}
        if set(renamed) != set(task["parameters"]):
            continue
        out.append(hash_objects(task["task_source_key"], version["library_source_digest"],
                                Inputs().compute_key(None, renamed, {}), raise_on_failure=True))
    return out


@functools.lru_cache(maxsize=1)
def _lineage() -> list[dict]:
    # read once per process: it is looked up on every cache miss of every task
    return json.loads(LINEAGE.read_text())["versions"] if LINEAGE.exists() else []

"""How a stage's Prefect task finds its cached result.

    key(task) = hash(task name, identity(stage's code), inputs)

``identity`` (webrl_core/runs/code_identity.py) digests the library definitions the stage can run, wherever they
live: moving or splitting a module, editing a docstring or renaming a file keeps a stored run's results valid,
and a change to code the stage runs re-runs it (and, through the content-addressed outputs, what depends on it).
The inputs are the stage's config sections, the run dir and run id (``StageRun``) and its artifact refs.

Run dirs stored before this key existed were keyed by the bytes of the whole library and of the task's source
(``TASK_SOURCE`` and a library digest). ``cache_lineage.json`` records, for such a code version, each task's old
source key and the identity its stage's code had then; where a stage's code is still the same, the old key is
looked up when the new one has no result, so those runs come back from the cache too.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from prefect.cache_policies import CachePolicy, Inputs
from prefect.utilities.hashing import hash_objects

from webrl_core.runs.code_identity import CodeIndex, stage_identity
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


def _lineage() -> list[dict]:
    return json.loads(LINEAGE.read_text())["versions"] if LINEAGE.exists() else []


LEGACY_KEYS_SCRIPT = """
import inspect
import json
from prefect.utilities.hashing import hash_objects
from tasks import stages
from webrl_core.runs.rundir import library_source_digest
tasks = {}
for t in vars(stages).values():
    if hasattr(t, "stage") and hasattr(t, "submit"):
        tasks[t.name] = {"task_source_key": hash_objects(t.source_code, raise_on_failure=True),
                         "parameters": list(inspect.signature(t.fn).parameters),
                         "stage": [t.stage.__module__, t.stage.__name__]}
print(json.dumps({"library_source_digest": library_source_digest(), "tasks": tasks}))
"""


def record_version(commit: str, renamed: dict[str, dict[str, str]]) -> dict:
    """The lineage entry of ``commit`` (a revision keyed the old way): each task's old source key and parameters,
    and its stage's identity computed on that revision's library by this checkout's code_identity. ``renamed``:
    task name -> {new parameter: old parameter}."""
    repo = Path(__file__).resolve().parents[1]
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "tree"
        subprocess.run(["git", "-C", str(repo), "worktree", "add", "--detach", str(tree), commit], check=True,
                       capture_output=True)
        try:
            out = subprocess.run([sys.executable, "-c", LEGACY_KEYS_SCRIPT], cwd=tree, check=True,
                                 capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(tree)})
            version = json.loads(out.stdout)
            index = CodeIndex(tree / "webrl_core")
        finally:
            subprocess.run(["git", "-C", str(repo), "worktree", "remove", "--force", str(tree)], capture_output=True)
    commit_id = subprocess.run(["git", "-C", str(repo), "rev-parse", commit], check=True, capture_output=True,
                               text=True).stdout.strip()
    for name, task in version["tasks"].items():
        task["stage_identity"] = index.identity(*task.pop("stage"))
        if name in renamed:
            task["renamed"] = renamed[name]
    return {"commit": commit_id, **version}

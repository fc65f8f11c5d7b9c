"""Stages declare the config sections they read (webrl_core/pipeline/stage.py): reading another one fails."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pytest
from prefect.cache_policies import Inputs
from prefect.utilities.hashing import hash_objects

from tasks import caching, stages
from tasks.caching import StageCode
from webrl_core.runs.code_identity import CodeIndex, stage_identity
from webrl_core.config_loader import load_config
from webrl_core.pipeline import stage as S
from webrl_core.pipeline import task_sets


@S.stage("run")
def _reads_env_without_declaring(settings) -> int:
    return settings.env.n_envs


@S.stage("run", "env")
def _declares_env(settings) -> int:
    return settings.env.n_envs + _reads_env_without_declaring(settings)


def test_a_stage_reading_an_undeclared_section_fails_naming_both():
    s = load_config("smoke")
    with pytest.raises(S.UndeclaredConfigSection, match=r"stage '_reads_env_without_declaring' reads config section "
                                                         r"'env' but declares only \['run'\]"):
        _reads_env_without_declaring(s)
    # not an AttributeError: getattr(settings, "env", default) cannot hide it behind a default
    with pytest.raises(S.UndeclaredConfigSection):
        getattr(S.scope(s, ("run",), "x"), "env", None)
    # a declared section reads through; a stage called by a stage sees what both declare
    assert S.scope(s, ("env",), "x").env.n_envs == s.env.n_envs
    with pytest.raises(S.UndeclaredConfigSection, match=r"called by _declares_env"):
        _declares_env(s)


def test_the_view_dumps_only_declared_sections_and_survives_pickling():
    s = load_config("smoke", sets=["env.n_envs=3"])
    view = S.scope(s, ("run", "env"), "x")
    assert set(view.model_dump(mode="json")) == {"run", "env"}
    back = pickle.loads(pickle.dumps(view))  # Ray ships a stage's settings to its workers
    assert back.env.n_envs == 3
    with pytest.raises(S.UndeclaredConfigSection):
        back.policy
    assert json.loads(view.model_dump_json())["env"]["n_envs"] == 3


def test_unknown_sections_are_refused_at_declaration():
    with pytest.raises(ValueError, match=r"unknown config section\(s\) \['envv'\]"):
        S.stage("envv")


def test_every_prefect_task_gets_exactly_its_stages_sections(tmp_path):
    s = load_config("smoke")
    tasks = [t for t in vars(stages).values() if hasattr(t, "stage") and hasattr(t, "submit")]
    assert len(tasks) == 22
    for t in tasks:
        run = stages.StageRun.of(s, str(tmp_path), "rid", t.stage)
        assert tuple(run.config) == t.stage.config_sections, t.name
        assert t.stage.__name__ in S.STAGES


def test_a_real_stage_runs_on_its_declared_sections(tmp_path):
    s = load_config("smoke", sets=["sites.data_seed=0"])
    ref = task_sets.train_task_pool(s, str(tmp_path), 5, 1, "pool")
    assert len(json.loads(open(ref.path).read())) == 5


def test_every_task_rebuilds_its_settings_from_its_sections_under_the_cross_section_rules(tmp_path):
    """A task validates its sections alone (``StageRun.settings``): a rule that ties two sections (the list shuffle
    needs a compact ``prompt.observation``) must find both in the stages it constrains, or the task refuses a valid
    config (``sft-actor`` once dropped ``prompt`` and read the layout as the default 'html')."""
    s = load_config("demo", sets=["prompt.observation=compact_id_after", "bootstrap.sft_list_shuffle=0.5"])
    for t in [t for t in vars(stages).values() if hasattr(t, "stage") and hasattr(t, "submit")]:
        run = stages.StageRun.of(s, str(tmp_path), "rid", t.stage)
        back = run.settings()
        for section in t.stage.config_sections:
            if section in run.config and set(run.config[section]) != set(type(getattr(s, section)).model_fields):
                for field in run.config[section]:  # a stage that declares some fields of the section
                    assert getattr(getattr(back, section), field) == getattr(getattr(s, section), field)
                continue
            assert getattr(back, section) == getattr(s, section), (t.name, section)


@S.stage("run", "actor.batch_size")
def _reads_one_actor_field(settings) -> int:
    return settings.actor.batch_size


@S.stage("run", "actor.batch_size")
def _reads_an_undeclared_actor_field(settings) -> float:
    return settings.actor.lr


def test_a_stage_declaring_fields_reads_those_and_is_keyed_by_those_alone():
    s = load_config("smoke", sets=["actor.batch_size=6"])
    assert _reads_one_actor_field(s) == 6
    with pytest.raises(S.UndeclaredConfigSection, match=r"reads config field actor\.lr but declares only "
                                                         r"\['actor\.batch_size'\]"):
        _reads_an_undeclared_actor_field(s)
    key = S.config_for(s, _reads_one_actor_field)
    assert key == {"run": s.run.model_dump(mode="json"), "actor": {"batch_size": 6}}
    assert S.config_for(load_config("smoke", sets=["actor.batch_size=6", "actor.lr=0.5"]), _reads_one_actor_field) == key
    assert S.config_for(load_config("smoke", sets=["actor.batch_size=2"]), _reads_one_actor_field) != key
    # a stage called by a stage sees what both declare; a view survives pickling with its fields
    view = pickle.loads(pickle.dumps(S.scope(s, ("run", "actor"), "outer")))
    inner = S.scope(view, ("actor.batch_size", "actor.lr"), "inner")
    assert inner.actor.lr == s.actor.lr and inner.actor.batch_size == 6
    with pytest.raises(S.UndeclaredConfigSection):
        S.scope(S.scope(s, ("actor.lr",), "outer"), ("actor",), "inner").actor.batch_size
    with pytest.raises(ValueError, match=r"section 'actor' has no field 'lrr'"):
        S.stage("actor.lrr")


def test_a_phase_knob_of_the_actor_keeps_phase_0_and_the_critic_update_cached():
    """``actor.lr`` / ``actor.epochs`` (a sweep of the phase's update) key the actor update, never the SFT or the
    critic update; the actor's batch shape still keys the SFT (it trains the same model with it)."""
    from webrl_core.pipeline import bootstrap, updates
    base = load_config("demo")
    swept = load_config("demo", sets=["actor.lr=1e-5", "actor.epochs=2", "actor.beta=0.5"])
    for fn in (bootstrap.sft_actor, bootstrap.sft_from_data, updates.update_critic):
        assert S.config_for(base, fn) == S.config_for(swept, fn), fn.__name__
    assert S.config_for(base, updates.update_actor) != S.config_for(swept, updates.update_actor)
    assert S.config_for(base, bootstrap.sft_actor) != S.config_for(load_config("demo", sets=["actor.batch_size=8"]),
                                                                   bootstrap.sft_actor)


def test_the_recorded_cache_lineage_is_what_its_revision_computes():
    """tasks/cache_lineage.json holds, per task, the old key's ingredients and the stage's code identity at that
    revision: recomputed here from the revision itself (a git worktree), so the file can only say what is true."""

    recorded = json.loads(caching.LINEAGE.read_text())["versions"]
    repo = Path(caching.__file__).resolve().parents[1]
    for version in recorded:
        if subprocess.run(["git", "-C", str(repo), "cat-file", "-e", f"{version['commit']}^{{commit}}"]).returncode:
            pytest.skip(f"revision {version['commit'][:12]} is not in this clone (shallow?)")
        renamed = {n: t["renamed"] for n, t in version["tasks"].items() if "renamed" in t}
        assert _record_version(version["commit"], renamed) == version


def test_a_stage_task_key_is_its_name_code_and_inputs(tmp_path):
    s = load_config("smoke")
    t = stages.update_actor
    inputs = {"run": stages.StageRun.of(s, str(tmp_path), "rid", t.stage), "phase": 1}
    key = StageCode().compute_key(SimpleNamespace(task=t), inputs, {})
    assert key == hash_objects(t.name, stage_identity(t.stage), Inputs().compute_key(None, inputs, {}))
    assert key != StageCode().compute_key(SimpleNamespace(task=t), {**inputs, "phase": 2}, {})
    other = stages.update_critic
    assert key != StageCode().compute_key(SimpleNamespace(task=other), inputs, {})


_LEGACY_KEYS_SCRIPT = """
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


def _record_version(commit: str, renamed: dict[str, dict[str, str]]) -> dict:
    """The lineage entry of ``commit`` (a revision keyed the old way): each task's old source key and parameters,
    and its stage's identity computed on that revision's library by this checkout's code_identity. ``renamed``:
    task name -> {new parameter: old parameter}."""
    repo = Path(caching.__file__).resolve().parents[1]
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "tree"
        subprocess.run(["git", "-C", str(repo), "worktree", "add", "--detach", str(tree), commit], check=True,
                       capture_output=True)
        try:
            out = subprocess.run([sys.executable, "-c", _LEGACY_KEYS_SCRIPT], cwd=tree, check=True,
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

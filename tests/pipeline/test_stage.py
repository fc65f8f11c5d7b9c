"""Stages declare the config sections they read (webrl_core/pipeline/stage.py): reading another one fails."""

from __future__ import annotations

import json
import pickle

import pytest

from tasks import stages as T
from webrl_core.config import load_config
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
    tasks = [t for t in vars(T).values() if hasattr(t, "stage") and hasattr(t, "submit")]
    assert len(tasks) == 21
    for t in tasks:
        run = T.StageRun.of(s, str(tmp_path), "rid", t.stage)
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
    for t in [t for t in vars(T).values() if hasattr(t, "stage") and hasattr(t, "submit")]:
        run = T.StageRun.of(s, str(tmp_path), "rid", t.stage)
        back = run.settings()
        for section in t.stage.config_sections:
            assert getattr(back, section) == getattr(s, section), (t.name, section)

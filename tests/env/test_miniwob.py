"""MiniWoB++ through our observation + grammar: oracle agents reach the tasks' own JS rewards; random does not crash."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from conftest import small_cfg
from webrl_core.env.miniwob import ORACLE_TASKS, MiniWoBHooks, MiniWoBOracle, miniwob_tasks
from webrl_core.env.rollout import rollout
from webrl_core.env.scripted import RandomPolicy


def test_oracles_solve_their_tasks(aloop, miniwob_server):
    tasks = miniwob_tasks(list(ORACLE_TASKS), 2, seed=3)
    eps = aloop.run(rollout(tasks, MiniWoBOracle(), 4, cfg=small_cfg(max_steps=10),
                            hooks=MiniWoBHooks(miniwob_server), progress=False))
    failed = [(e["task_id"], e["intent"], [s["response"] for s in e["steps"]]) for e in eps if not e["success"]]
    assert not failed
    assert all(e["intent"] and e["status"] == "done" for e in eps)


def test_wrong_answer_scores_zero(aloop, miniwob_server):
    class Wrong(MiniWoBOracle):
        def respond(self, ctx):  # click a button that is not the requested one when there is one
            from webrl_core.env.observation import labelled_elements
            want = ctx.task["intent"].split('"')[1]
            others = [e for e in labelled_elements(ctx.html) if e.tag == "button" and e.text != want]
            return f'do(action="Click", element="{others[0].id}")' if others else 'exit(message="none")'
    eps = aloop.run(rollout(miniwob_tasks(["click-button"], 3, seed=5), Wrong(), 2, cfg=small_cfg(),
                            hooks=MiniWoBHooks(miniwob_server), progress=False))
    assert all(e["env_score"] == 0.0 and e["success"] is False for e in eps)


def test_random_policy_runs(aloop, miniwob_server):
    tasks = miniwob_tasks(["click-button", "enter-text", "click-checkboxes"], 2, seed=1)
    eps = aloop.run(rollout(tasks, RandomPolicy(0), 3, cfg=small_cfg(max_steps=5),
                            hooks=MiniWoBHooks(miniwob_server), progress=False))
    assert len(eps) == 6
    assert all(e["status"] in ("done", "max_steps", "early_stop") for e in eps)
    assert all(e["env_score"] in (0.0, 1.0) and 1 <= e["n_steps"] <= 5 for e in eps)


def test_unknown_task_name_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown MiniWoB"):
        miniwob_tasks(["click-buton"], 1)


def test_cli_prints_a_success_table():
    from webrl_cli.main import app
    res = CliRunner().invoke(app, ["env", "miniwob", "--tasks", "click-button,focus-text", "--episodes", "2",
                                   "--n-envs", "2"])
    assert res.exit_code == 0, res.output
    assert "click-button" in res.output and "focus-text" in res.output and "ALL" in res.output
    assert "1.00" in res.output

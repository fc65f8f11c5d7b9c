"""``EarlyExitOraclePolicy``: the oracle that quits; its episodes are labelled by the sites' evaluators."""

from __future__ import annotations

import asyncio

import pytest

from webrl_core.config_loader import load_config
from webrl_core.env.rollout import rollout
from webrl_core.sites.oracle import EarlyExitOraclePolicy, OraclePolicy
from webrl_core.sites.tasks import train_tasks


def _run(tasks, policy, sites):
    cfg = load_config().env.model_copy(update={"n_envs": 4})
    return asyncio.run(rollout(tasks, policy, 4, cfg=cfg, hooks=sites, purpose="early-exit", progress=False))


def test_quits_early_reproducibly_and_the_evaluators_judge_it(sites):
    tasks = train_tasks(12, seed=3)
    full = {e["task_id"]: e for e in _run(tasks, OraclePolicy(), sites)}
    assert all(e["env_score"] == 1.0 for e in full.values())
    cut = _run(tasks, EarlyExitOraclePolicy(seed=0, p_exit=0.5), sites)
    again = _run(tasks, EarlyExitOraclePolicy(seed=0, p_exit=0.5), sites)
    def by_task(eps):  # episodes come back in the order they finish
        return {e["task_id"]: [s["response"] for s in e["steps"]] for e in eps}

    assert by_task(cut) == by_task(again) and len(by_task(cut)) == len({t["task_id"] for t in tasks})
    shorter = 0
    for e in cut:
        demo = [s["response"] for s in full[e["task_id"]]["steps"]]
        acts = [s["response"] for s in e["steps"]]
        # the same steps as the demonstration until it quits with "Done"
        assert acts[:-1] == demo[:len(acts) - 1] and len(acts) <= len(demo)
        if acts != demo:
            shorter += 1
            assert acts[-1] == 'exit(message="Done")'
        assert e["env_score"] in (0.0, 1.0)
    failed = [e for e in cut if e["env_score"] == 0.0]
    assert shorter >= 4 and failed, "p_exit=0.5 over 12 tasks: several quit, and quitting early fails some"
    # a quit that still reaches the goal (a navigation task's final page) is a success, as the evaluator says
    assert all(e["env_score"] == 1.0 for e in cut if [s["response"] for s in e["steps"]]
               == [s["response"] for s in full[e["task_id"]]["steps"]])


def test_p_exit_is_checked():
    with pytest.raises(ValueError, match="p_exit"):
        EarlyExitOraclePolicy(p_exit=0)

"""Every task family's evaluator, end to end in real Chromium through the env's rollout and the WebArena
evaluators (official ``evaluation_harness/evaluators.py``): the oracle's final state scores 1; a wrong final state
scores 0.

The wrong final state is made by a decoy: the oracle of ANOTHER instantiation of the same family (another
product, another price, another forum ...) acts, while the episode is scored with the original task.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json

from webrl_core.config_loader import load_config
from webrl_core.env.rollout import rollout
from webrl_core.sites.data import site_data
from webrl_core.sites.families import FAMILIES
from webrl_core.sites.oracle import OraclePolicy, oracle_response
from webrl_core.sites.tasks import _pools, make_task
from webrl_core.sites.tasks import test_set as held_out_set


class DecoyPolicy:
    """Acts as the oracle of ``decoys[task_id]`` (same family, different instantiation)."""

    policy_id = "decoy"

    def __init__(self, decoys: dict[str, dict]):
        self.decoys = decoys

    async def act(self, prompts, contexts=None):
        return [oracle_response(dataclasses.replace(c, task=self.decoys[str(c.task["task_id"])])) for c in contexts]


def _decoy_for(task: dict) -> dict:
    fam = FAMILIES[task["family"]]
    for inst in _pools(0)[fam.name][1]:
        if fam.build(inst, site_data(0))["eval"] != task["eval"]:
            return make_task(fam, inst, 0, "train", "decoy", 0)
    raise AssertionError(f"no decoy for {task['family']}")


def test_oracle_right_and_decoy_wrong_for_every_family(sites):
    one = {}
    for t in held_out_set():
        one.setdefault(t["family"], t)
    assert set(one) == set(FAMILIES)
    right = list(one.values())
    wrong = [{**t, "task_id": f"wrong-{t['task_id']}"} for t in right]
    decoys = {t["task_id"]: _decoy_for(t) for t in wrong}
    cfg = load_config().env.model_copy(update={"n_envs": 4})

    async def main():
        r = rollout(right, OraclePolicy(), 4, cfg=cfg, hooks=sites, purpose="oracle", progress=False)
        return await r

    async def main_wrong():
        return await rollout(wrong, DecoyPolicy(decoys), 4, cfg=cfg, hooks=sites, purpose="decoy", progress=False)

    ok = asyncio.run(main())
    bad = asyncio.run(main_wrong())
    fam = {t["task_id"]: t["family"] for t in right + wrong}
    failures = [(fam[e["task_id"]], e["status"], e["final_answer"], e["error"]) for e in ok if e["env_score"] != 1.0]
    assert not failures, json.dumps(failures, indent=1)
    leaks = [(fam[e["task_id"]], e["final_answer"]) for e in bad if e["env_score"] != 0.0]
    assert not leaks, leaks
    # the oracle's episodes are short, as the tiny model needs, and look like a good agent's responses
    for e in ok:
        assert 1 <= e["n_steps"] <= 9, (fam[e["task_id"]], e["n_steps"])
        assert all(s["response"].startswith("# ") for s in e["steps"])

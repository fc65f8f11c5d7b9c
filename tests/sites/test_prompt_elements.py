"""On every held-out task, the element each oracle step acts on is in the prompt the policy sees, with its id:
the compact page (``prompt.observation: compact`` and ``compact_id_after``) and the simplified HTML, within the
prompt budget; and name grounding (``agent.grounding``) leaves every oracle step as written."""

from __future__ import annotations

import asyncio

import pytest

from webrl_core.agent.grounding import ground_response
from webrl_core.config_loader import load_config
from webrl_core.env.actions import parse_action
from webrl_core.env.rollout import rollout
from webrl_core.prompts import PromptFormat, build_prompt
from webrl_core.sites.oracle import OraclePolicy
from webrl_core.sites.tasks import test_set as held_out_set


@pytest.mark.slow
def test_every_held_out_oracle_element_is_in_the_prompt_the_policy_sees(sites):
    """The oracle on all 165 held-out tasks, prompts in the compact format: each step that acts on an element
    finds ``[id]`` in the current page of its prompt and of the id-after format's prompt, and ``id="N"`` in the
    HTML format's prompt of that step."""
    tasks = held_out_set()
    cfg = load_config("demo").env.model_copy(update={"n_envs": 4})
    fmt = PromptFormat(observation="compact")
    id_after = PromptFormat(observation="compact_id_after")
    episodes = asyncio.run(rollout(tasks, OraclePolicy(), 4, cfg=cfg, hooks=sites, purpose="oracle",
                                   progress=False, prompt_compat=fmt))
    assert len(episodes) == len(tasks) == 165
    missing, acted, regrounded = [], 0, []
    for e in episodes:
        assert e["env_score"] == 1.0, (e["task_id"], e["error"])
        past = []
        for s in e["steps"]:
            element = parse_action(s["response"]).element
            if element is not None:
                acted += 1
                page = s["prompt"].rsplit("Round", 1)[-1]  # the current round: the page the action is taken on
                html_prompt = build_prompt(e["intent"], past, s["html"], cfg.obs_char_budget)
                after_page = build_prompt(e["intent"], past, s["html"], cfg.obs_char_budget,
                                          compat=id_after).rsplit("Round", 1)[-1]
                if (f"[{element}]" not in page or f"[{element}]" not in after_page
                        or f'id="{element}"' not in html_prompt.rsplit("Round", 1)[-1]):
                    missing.append((e["task_id"], s["idx"], element))
                if ground_response(s["response"], s["html"]) != s["response"]:
                    regrounded.append((e["task_id"], s["idx"], element))
            past.append(s["response"])
    assert acted > 300 and not missing, missing[:10]
    assert not regrounded, regrounded[:10]

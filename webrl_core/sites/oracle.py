"""``OraclePolicy``: the scripted expert of the embedded task families (a ``Policy`` that reads ``contexts``).

For each environment it looks up the task's family and asks the family oracle for the next action given the
CURRENT url and observation only (no hidden state), so every response is a valid demonstration in the agent's
grammar: ``# Element: <what>`` (and ``# Note: ...``) comment lines, then one ``do(...)`` or ``exit(...)``.
Tasks without a known family (e.g. LLM-generated ones) get ``exit(message="N/A")`` with a note.
"""

from __future__ import annotations

from webrl_core.agent_api import StepContext
from webrl_core.sites.families import FAMILIES, PageView, finish


def oracle_response(ctx: StepContext) -> str:
    fam = FAMILIES.get(ctx.task.get("family", ""))
    if fam is None:
        return finish("N/A", f"no scripted oracle for family {ctx.task.get('family')!r}")
    return fam.oracle(ctx.task["instantiation_dict"], PageView(url=ctx.url, html=ctx.html, step=ctx.step))


class OraclePolicy:
    policy_id = "oracle"
    batched = False  # instant answers: no reason to hold environments for a batch

    async def act(self, prompts: list[str], contexts: list[StepContext] | None = None) -> list[str]:
        if contexts is None or len(contexts) != len(prompts):
            raise ValueError("OraclePolicy needs one StepContext per prompt (the rollout passes them)")
        return [oracle_response(c) for c in contexts]

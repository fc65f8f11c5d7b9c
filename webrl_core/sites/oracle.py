"""``OraclePolicy``: the scripted expert of the embedded task families (a ``Policy`` that reads ``contexts``).

For each environment it looks up the task's family and asks the family oracle for the next action given the
CURRENT url and observation only (no hidden state), so every response is a valid demonstration in the agent's
grammar: ``# Element: <what>`` (and ``# Note: ...``) comment lines, then one ``do(...)`` or ``exit(...)``.
Tasks without a known family (e.g. LLM-generated ones) get ``exit(message="N/A")`` with a note.
"""

from __future__ import annotations

import random

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


class EarlyExitOraclePolicy(OraclePolicy):
    """The oracle that gives up: at each step, with probability ``p_exit`` (an RNG seeded by (seed,
    task id, step), so a re-run repeats itself), it writes ``exit(message="Done")`` instead of its next action.

    Its episodes look like demonstrations up to the point where they stop, and the sites' evaluators label them
    like any other: quitting before the goal page, or answering a question with "Done", fails; quitting on the
    goal page of a navigation task succeeds. They are the ORM's hard examples (``bootstrap.early_exit_tasks``):
    the SmolLM2 actor's commonest failure is exactly this exit (9 of phase 1's 12 failed episodes in the demo),
    and without such examples an ORM whose YES class is the oracle's learns who acted rather than what was done."""

    def __init__(self, seed: int = 0, p_exit: float = 0.35) -> None:
        if not 0 < p_exit <= 1:
            raise ValueError(f"EarlyExitOraclePolicy: p_exit must be in (0, 1], got {p_exit}")
        self.seed, self.p_exit = seed, p_exit
        self.policy_id = f"oracle-early-exit:s{seed}:p{p_exit:g}"

    async def act(self, prompts: list[str], contexts: list[StepContext] | None = None) -> list[str]:
        planned = await super().act(prompts, contexts)
        return [finish("Done") if random.Random(f"{self.seed}|{c.task.get('task_id')}|{c.step}").random() < self.p_exit
                else r for r, c in zip(planned, contexts)]

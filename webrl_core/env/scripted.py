"""Scripted policies: a reproducible random agent and the base class of oracle (hand-written) agents.

Both implement the ``Policy`` protocol (``webrl_core.agent_api``) and read the ``StepContext``s, not the prompts.
``RandomPolicy`` draws from the actions that make sense on the current observation with an RNG seeded by
(seed, episode_id, step), so a re-run repeats itself exactly regardless of batching.
"""

from __future__ import annotations

import json
import random
from abc import ABC, abstractmethod

from webrl_core.agent_api import StepContext
from webrl_core.env.observation import labelled_elements

WORDS = ["hello", "test", "apple", "blue", "search", "42", "report", "john", "order", "shirt"]


def do(action: str, element: str | None = None, argument: str | None = None) -> str:
    """Write an action in the grammar (json.dumps quotes strings the way Python reads them)."""
    parts = [f"action={json.dumps(action)}"]
    if argument is not None:
        parts.append(f"argument={json.dumps(argument, ensure_ascii=False)}")
    if element is not None:
        parts.append(f"element={json.dumps(str(element))}")
    return f"do({', '.join(parts)})"


def exit_(message: str = "") -> str:
    return f"exit(message={json.dumps(message, ensure_ascii=False)})"


class ScriptedPolicy(ABC):
    """Base of policies that decide from the context: subclasses implement ``respond(ctx) -> str``."""

    policy_id = "scripted"
    batched = False  # instant answers: holding ready environments for a batch only costs throughput

    @abstractmethod
    def respond(self, ctx: StepContext) -> str:
        """The raw response (in the action grammar) for one environment."""

    async def act(self, prompts: list[str], contexts: list[StepContext] | None = None) -> list[str]:
        if contexts is None or len(contexts) != len(prompts):
            raise ValueError(f"{type(self).__name__} needs one StepContext per prompt")
        return [self.respond(c) for c in contexts]


class RandomPolicy(ScriptedPolicy):
    """Random valid actions over the observation's ids; exits with probability ``p_exit``."""

    def __init__(self, seed: int = 0, p_exit: float = 0.05) -> None:
        self.seed, self.p_exit = seed, p_exit
        self.policy_id = f"random-s{seed}"

    def respond(self, ctx: StepContext) -> str:
        rng = random.Random(f"{self.seed}|{ctx.episode_id}|{ctx.step}")
        if rng.random() < self.p_exit:
            return exit_(rng.choice(WORDS))
        els = labelled_elements(ctx.html)
        fields = [e for e in els if e.tag == "textarea" or
                  (e.tag == "input" and e.attrs.get("type", "text") in ("text", "search", "email", "password", "number", ""))]
        selects = [e for e in els if e.tag == "select"]
        choices = ["scroll"]
        if els:
            choices += ["click"] * 6 + ["hover"]
        if fields:
            choices += ["type"] * 3
        if selects:
            choices += ["select"]
        kind = rng.choice(choices)
        if kind == "click":
            return f"# Element: random\n{do('Click', rng.choice(els).id)}"
        if kind == "hover":
            return do("Hover", rng.choice(els).id)
        if kind == "type":
            return do("Type", rng.choice(fields).id, rng.choice(WORDS))
        if kind == "select":
            return do("Select Dropdown Option", rng.choice(selects).id, rng.choice(WORDS)[:1])
        return do(rng.choice(["Scroll Down", "Scroll Up"]))

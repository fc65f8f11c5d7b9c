"""Name grounding (ours, ``policy.name_grounding``): the element an actor names wins over an id it mistyped.

The actor's grammar (``env.actions``) lets a response name its element in a comment line before the call:
``# Element: movies`` then ``do(action="Click", element="13")``. A small actor often names the right element and
writes another element's id: SmolLM2-135M after SFT on the demo's forum list writes 13 (photography) for movies,
music, gardening and technology alike (docs/notebook/grounding.md, "Name grounding"). The rule, per response:

    NAME = the text of its ``# Element:`` line,  N = the element id of its ``do(...)`` call;
    if text(N) != NAME and exactly one element E of the page has text(E) == NAME (else, case-insensitively),
    N := E;  otherwise the response stays as written,

where text() is what the compact page rendering writes for an element (``compact_page.element_texts``). The
rewritten response is what runs and what the store keeps, so a phase trains on the action that produced its
outcome. Nothing but the page and the actor's own words is used: no task, evaluator or oracle.
"""

from __future__ import annotations

import re
from typing import Any

from webrl_core.compact_page import element_texts
from webrl_core.env.actions import ActionParseError, parse_action

_NAMED = re.compile(r"^\s*# Element: *(.+?) *$", re.M)


def named_element(response: str) -> str | None:
    """The text of a response's ``# Element:`` comment line (the element it says it acts on), or None."""
    m = _NAMED.search(response)
    return m.group(1).strip() if m else None


def applies(scope: str, purpose: str) -> bool:
    """Whether grounding acts in a ``purpose`` rollout under ``policy.name_grounding`` = ``scope`` (off; phases:
    the phases' own training rollouts, purpose ``rollout``; all: every model rollout)."""
    return scope == "all" or (scope == "phases" and purpose == "rollout")


def ground_response(response: str, html: str) -> str:
    """``response`` with its element id replaced by the id of the element its ``# Element:`` line names, when
    that line names exactly one other element of the page ``html`` (module docstring); else unchanged."""
    try:
        action = parse_action(response)
    except ActionParseError:
        return response
    name = named_element(response)
    if action.element is None or name is None:
        return response
    texts = element_texts(html)
    if texts.get(action.element) == name:
        return response
    target = [i for i, t in texts.items() if t == name] or \
        [i for i, t in texts.items() if t.casefold() == name.casefold()]
    call_at = response.rfind("do(")
    if len(target) != 1 or target[0] == action.element or call_at < 0:
        return response
    head, call = response[:call_at], response[call_at:]
    new_call, n = re.subn(r"""(element\s*=\s*)(["']?)%s\2""" % re.escape(action.element),
                          lambda m: f"{m.group(1)}{m.group(2)}{target[0]}{m.group(2)}", call, count=1)
    return head + new_call if n == 1 else response


class NameGroundedPolicy:
    """A policy whose responses go through ``ground_response`` with the page each was written for; everything
    else (``policy_id``, ``generate``, ...) is the wrapped policy's. ``rewrites`` counts the changed responses."""

    def __init__(self, policy: Any) -> None:
        self.policy = policy
        self.rewrites = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.policy, name)

    async def act(self, prompts: list[str], contexts=None) -> list[str]:
        out = await self.policy.act(prompts, contexts)
        if contexts is None:
            return out
        grounded = [ground_response(r, c.html) for r, c in zip(out, contexts)]
        self.rewrites += sum(a != b for a, b in zip(out, grounded))
        return grounded

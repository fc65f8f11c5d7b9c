"""The narrow interface between the rollout engine and anything that chooses actions.

A policy is any object with an async batch method

    async def act(self, prompts: list[str], contexts: list[StepContext] | None = None) -> list[str]

that returns one raw response (in the WebRL action grammar) per prompt. The rollout engine batches
all environments that wait for an action into one call, so a GPU model or a vLLM server sees full
batches. Model policies read ``prompts`` (and, when sampling, each context's ``episode_id`` and ``step``, which seed
the action: ``identity.action_seed``); scripted policies (oracle, random) read ``contexts``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


@dataclass
class StepContext:
    """What a scripted policy may look at besides the prompt."""

    task: dict[str, Any]                 # the task config (WebArena-Lite schema)
    html: str                            # current simplified HTML observation
    url: str                             # current page URL
    step: int                            # index of the action about to be taken
    past_responses: list[str] = field(default_factory=list)
    episode_id: str = ""


@runtime_checkable
class Policy(Protocol):
    """``act`` answers a batch of prompts. A policy may set ``batched = False`` when a call costs the same for
    one prompt as for many (scripted policies): the rollout then serves each request at once instead of
    holding ready environments for busy ones (``env.batch_wait_s``)."""

    policy_id: str

    async def act(self, prompts: list[str], contexts: list[StepContext] | None = None) -> list[str]: ...

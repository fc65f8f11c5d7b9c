"""The recipes one pipeline runs, each a packaged config over ``demo`` that says what it changes and why:

    webrl  the paper's (arXiv 2411.02337): curriculum from failures, critic filter, ORM or evaluator reward,
           critic, KL-constrained actor update, perplexity replay (``demo``)
    grpo   WebAgent-R1's M-GRPO (arXiv 2505.16421): G episodes per training-pool task, group-normalised
           episode rewards, clipped ratio and KL; no critic, no curriculum, no replay (``grpo``)
    pae    PAE's (amazon-science/PAE): context-aware proposer, zero-shot judge as the reward, filtered BC (``pae``)

A recipe compared against another from one start is a variant of ``webrl ablate``: its overrides are the keys
its config file sets itself (``recipe_overrides``), applied over the ablation's config, so every other value (the
bootstrap, the seeds, the test subset, the actor's learning rate) is shared.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import yaml

if TYPE_CHECKING:
    from webrl_core.config import WebRLSettings

RECIPES: dict[str, str] = {"webrl": "demo", "grpo": "grpo", "pae": "pae"}
"""Recipe name -> its packaged config."""

NOT_RECIPE_KEYS = ("extends", "run")
"""Top-level keys of a recipe file that name the run, not the recipe."""


def _flatten(data: dict, prefix: str = "") -> list[tuple[str, Any]]:
    out = []
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.extend(_flatten(value, f"{name}."))
        else:
            out.append((name, value))
    return out


def recipe_overrides(name: str) -> list[str]:
    """``section.key=value`` overrides that turn the base config into recipe ``name`` (what its file sets, minus
    ``extends`` and ``run``); [] for ``webrl``, the base itself. ValueError naming the known recipes otherwise."""
    from webrl_core.config_loader import packaged_config

    if name not in RECIPES:
        raise ValueError(f"unknown recipe {name!r}; known: {', '.join(RECIPES)}")
    if RECIPES[name] == "demo":
        return []
    data = yaml.safe_load(packaged_config(RECIPES[name]).read_text(encoding="utf-8")) or {}
    own = {k: v for k, v in data.items() if k not in NOT_RECIPE_KEYS}
    return [f"{key}={json.dumps(value)}" for key, value in _flatten(own)]


def recipe_of(settings: "WebRLSettings") -> str:
    """The recipe a resolved config runs, by its defining knobs: grpo (actor.loss=grpo), pae (filtered BC on
    proposed tasks), webrl (a WebRL loss), else the three knobs themselves."""
    loss, generator, source = settings.actor.loss, settings.curriculum.generator, settings.reward.source
    if loss == "grpo":
        return "grpo"
    if loss == "filtered_bc" and generator == "propose":
        return "pae"
    if loss in ("paper", "official"):
        return "webrl"
    return f"actor.loss={loss}, curriculum.generator={generator}, reward.source={source}"

"""Checks of the embedded sites through the real environment: policy success per site, observation sizes.

``check_policy`` runs a policy (oracle or random) through the env's rollout on a task list and returns the
episodes; ``per_site`` turns them into {site: (successes, episodes)}. ``observation_stats`` replays the oracle on
tasks and measures the characters of every observation it saw: p50/p95/max per site.
"""

from __future__ import annotations

import asyncio
import statistics
from typing import Any

from webrl_core.config import WebRLSettings
from webrl_core.config_loader import load_config
from webrl_core.env.rollout import rollout
from webrl_core.env.scripted import RandomPolicy
from webrl_core.sites.oracle import OraclePolicy
from webrl_core.sites.server import EmbeddedSites


def _env_cfg(settings: WebRLSettings | None, n_envs: int):
    settings = settings or load_config()
    cfg = settings.env.model_copy(update={"n_envs": n_envs})
    return cfg


async def run_policy(tasks: list[dict], policy, sites, *, n_envs: int = 2, settings: WebRLSettings | None = None,
                     purpose: str = "oracle", progress: bool = True) -> list[dict]:
    """Episodes of ``policy`` on ``tasks`` in the embedded sites ``sites`` (a started EmbeddedSites)."""
    cfg = _env_cfg(settings, n_envs)
    return await rollout(tasks, policy, n_envs, cfg=cfg, hooks=sites, purpose=purpose, progress=progress)


def per_site(episodes: list[dict]) -> dict[str, tuple[int, int]]:
    out: dict[str, list[int]] = {}
    for ep in episodes:
        row = out.setdefault(ep["site"], [0, 0])
        row[0] += bool(ep.get("success"))
        row[1] += 1
    return {k: (v[0], v[1]) for k, v in sorted(out.items())}


def per_family(episodes: list[dict], tasks: list[dict]) -> dict[str, tuple[int, int]]:
    fam = {str(t["task_id"]): t.get("family", "?") for t in tasks}
    out: dict[str, list[int]] = {}
    for ep in episodes:
        row = out.setdefault(fam.get(str(ep["task_id"]), "?"), [0, 0])
        row[0] += bool(ep.get("success"))
        row[1] += 1
    return {k: (v[0], v[1]) for k, v in sorted(out.items())}


def obs_stats(episodes: list[dict]) -> dict[str, dict[str, Any]]:
    """Characters per observation, per site: n, p50, p95, max."""
    by_site: dict[str, list[int]] = {}
    for ep in episodes:
        by_site.setdefault(ep["site"], []).extend(len(s["html"] or "") for s in ep["steps"])
    out = {}
    for site, xs in sorted(by_site.items()):
        xs = sorted(xs)
        out[site] = {"n": len(xs), "p50": int(statistics.median(xs)), "p95": xs[min(len(xs) - 1, int(0.95 * len(xs)))],
                     "max": xs[-1]}
    return out


def check(policy_name: str, tasks: list[dict], *, n_envs: int = 2, data_seed: int = 0, seed: int = 0,
          progress: bool = True) -> list[dict]:
    """Start the sites, run ``oracle`` or ``random`` on ``tasks``, stop the sites; return the episodes."""
    if policy_name == "oracle":
        policy = OraclePolicy()
    elif policy_name == "random":
        policy = RandomPolicy(seed=seed)
    else:
        raise ValueError(f"policy {policy_name!r}: allowed 'oracle' or 'random'")
    with EmbeddedSites(data_seed=data_seed) as sites:
        return asyncio.run(run_policy(tasks, policy, sites, n_envs=n_envs, purpose=policy_name, progress=progress))

"""What produced an episode: content digests of the task, the policy and the settings that change behaviour.

An episode is the outcome of (task content, policy, sampling settings, environment settings, seed, attempt).
Its key is the digest of exactly those, so a stored episode is reused only for the same inputs (a resumed
rollout stays free) and any change (another checkpoint, temperature, ``env.max_steps``, a task whose intent or
evaluator changed under the same id) produces new episodes instead of silently reusing old ones::

    episode_key = sha256(purpose, phase, task_digest, policy_digest, settings_digest, seed, attempt)

* ``task_digest``: the task's whole configuration (intent, start URL, evaluator, sites, login, storage state,
  geolocation, site data seed, MiniWoB++ name/seed, ...) except its id and the bookkeeping fields the pipeline
  adds (``BOOKKEEPING_FIELDS``: parent, family, critic values, ...); an unknown extra field counts as content,
  so a task can only be re-identified by what it is.
* ``policy_digest``: ``hf:<checkpoint sha256>`` for an in-process model (the folder digest from its manifest,
  see ``artifacts``), ``openai:<model name>@<served digest>`` for a served model, ``oracle`` / ``random:s<seed>``
  for the scripted policies.
* ``settings_digest``: sampling settings (temperature, top_p, max_new_tokens, prompt style, and ``seeded`` when it
  samples with per-action seeds) for model policies, and the environment settings an agent can observe (step
  limits, observation budget, viewport, timeouts, host blocking, site data). Throughput knobs (``n_envs``,
  ``batch_wait_s``, ``batch_wait_calls``, browser build, screenshots) are left out: they change how fast episodes
  run, not what an episode is.

A sampled action draws from its own random stream, seeded by ``action_seed(episode id, step)`` (``policy.seeded``):
the episode id already holds the run seed, task, policy, settings and attempt, so the same inputs sample the same
episode whichever other requests share its batch.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

BOOKKEEPING_FIELDS = frozenset({"task_id", "family", "split", "parent_task_id", "critic_value", "critic_p1",
                                "critic_p2", "filter_top_up", "intent_template_id"})
ENV_BEHAVIOUR_FIELDS = ("max_steps", "parse_failure_limit", "repeat_action_limit", "obs_char_budget", "keep_bbox",
                        "settle_timeout_ms", "action_timeout_ms", "type_replaces", "block_other_hosts",
                        "viewport_only", "viewport_width", "viewport_height")
SAMPLING_FIELDS = ("top_p", "max_new_tokens")
SCRIPTED_POLICIES = ("oracle", "random", "early-exit")


def digest(obj: Any, n: int = 64) -> str:
    """sha256 of the canonical JSON of ``obj`` (sorted keys), hex, first ``n`` characters."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:n]


def task_digest(task: dict) -> str:
    """Digest of what a task asks and how it is judged (see module docstring); ids do not enter."""
    missing = [f for f in ("start_url", "eval") if f not in task]
    if missing:
        raise ValueError(f"task {task.get('task_id')!r} has no {', '.join(missing)}: cannot identify its content")
    return digest({k: v for k, v in task.items() if k not in BOOKKEEPING_FIELDS})


def settings_digest(env_cfg: Any, *, temperature: float | None = None, policy_cfg: Any = None,
                    prompt_style: str | None = None, sites: dict | None = None) -> str:
    """Digest of the settings that change what an episode is: the env's behaviour fields, and the sampling
    settings when a model samples (``temperature`` not None). ``seeded`` enters only where it changes the episode
    (temperature > 0 and on), so greedy and unseeded episodes keep the ids they had before the knob existed."""
    env = {f: getattr(env_cfg, f, None) for f in ENV_BEHAVIOUR_FIELDS}
    sampling = None
    if temperature is not None:
        sampling = {"temperature": float(temperature), "prompt_style": prompt_style,
                    **{f: getattr(policy_cfg, f, None) for f in SAMPLING_FIELDS}}
        if temperature > 0 and getattr(policy_cfg, "seeded", None):
            sampling["seeded"] = True
    return digest({"env": env, "sampling": sampling, "sites": sites or {}})


def episode_key(*, purpose: str, phase: int, task_digest: str, policy_digest: str, settings_digest: str,
                seed: int, attempt: int) -> str:
    return digest([purpose, int(phase), task_digest, policy_digest, settings_digest, int(seed), int(attempt)])


def episode_id(task_id: Any, *, purpose: str, phase: int, task_digest: str, policy_digest: str,
               settings_digest: str, seed: int, attempt: int) -> str:
    """Readable and unique: ``<purpose>-p<phase>-<task id>-a<attempt>-<episode key[:16]>``."""
    key = episode_key(purpose=purpose, phase=phase, task_digest=task_digest, policy_digest=policy_digest,
                      settings_digest=settings_digest, seed=seed, attempt=attempt)
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", str(task_id))[:60]
    return f"{purpose}-p{phase}-{safe}-a{attempt}-{key[:16]}"


def action_seed(episode_id: str, step: int) -> int:
    """The sampling seed of the action at ``step`` of episode ``episode_id``: the first 8 bytes of
    sha256(episode id, step), shifted to a non-negative 63-bit int (fits ``torch.Generator.manual_seed`` and the
    signed 64-bit ``seed`` of the OpenAI API as vLLM validates it)."""
    if not episode_id:
        raise ValueError("action_seed needs an episode id: without one every episode would sample alike")
    raw = hashlib.sha256(json.dumps(["action", str(episode_id), int(step)]).encode()).digest()
    return int.from_bytes(raw[:8], "big") >> 1


def generated_task_id(phase: int, task: dict) -> str:
    """Id of a generated task, derived from its content: the same intent and evaluator keep their id when
    generation is re-run, and a different task can never inherit another's id."""
    return f"p{phase}-g{task_digest(task)[:12]}"

"""Step-level training samples from stored episodes (official ``scripts/process_data.py``, stage 1).

For an episode with steps 0..T-1 and final label R (``success`` -> 1/0; else ``orm_score``; else ``env_score``)::

    observation_t      = prompt_t                      (the exact prompt the policy saw)
    next_observation_t = prompt_{t+1}, and prompt_{T-1} for the last step (official: the last item repeated)
    action_t           = response_t                    (raw policy output)
    task               = intent
    reward_t           = R on every step               (official: the final label broadcast to all steps)
    done_t             = (t == T-1)
    trajectory_reward  = 1 if R >= 0.5 else 0
    mc_return_t        = R * sum_{k=0}^{T-1-t} gamma^k  (gamma: ``transitions.gamma``, official 0.9)

Also: export to the official files (``List[List[step]]`` stage-1 ``.pt`` and the flat shuffled ``*_filter.pt``
with ``mc_return`` and, for replay items, ``rank_score``; both ``torch.save``) and import of VisualAgentBench
result folders (``traces/<id>.jsonl`` + ``actions/<id>.json``) into episode/step dicts.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable
from pathlib import Path

from webrl_core.prompts import HTML_PLACEHOLDER, build_prompt, check_compat

OFFICIAL_STEP_KEYS = ("observation", "next_observation", "task", "reward", "done", "action", "trajectory_reward")


def episode_reward(episode: dict) -> float:
    """The trajectory's final label R: success (bool) -> 1/0, else orm_score, else env_score."""
    if episode.get("success") is not None:
        return 1.0 if episode["success"] else 0.0
    for key in ("orm_score", "env_score"):
        if episode.get(key) is not None:
            return float(episode[key])
    raise ValueError(f"episode {episode.get('episode_id')!r} has no label: success, orm_score and env_score are all None")


def mc_returns(reward: float, n_steps: int, gamma: float = 0.9) -> list[float]:
    """mc_return_t = R * sum_{k=0}^{T-1-t} gamma^k for t = 0..T-1 (official ``add_mc_return``)."""
    out, acc = [0.0] * n_steps, 0.0
    for t in reversed(range(n_steps)):
        acc = 1.0 + gamma * acc
        out[t] = reward * acc
    return out


def episode_transitions(episode: dict, steps: list[dict], gamma: float = 0.9) -> list[dict]:
    """One sample per step of one episode (module docstring). Steps are ordered by ``idx``."""
    steps = sorted(steps, key=lambda s: s["idx"])
    if not steps:
        return []
    for s in steps:
        if not isinstance(s.get("prompt"), str) or not isinstance(s.get("response"), str):
            raise ValueError(f"episode {episode.get('episode_id')!r} step {s.get('idx')}: prompt and response must be strings")
    R = episode_reward(episode)
    mc = mc_returns(R, len(steps), gamma)
    out = []
    for t, s in enumerate(steps):
        last = t == len(steps) - 1
        out.append({
            "observation": s["prompt"],
            "next_observation": s["prompt"] if last else steps[t + 1]["prompt"],
            "action": s["response"],
            "task": episode.get("intent") or "",
            "reward": R,
            "done": last,
            "trajectory_reward": 1.0 if R >= 0.5 else 0.0,
            "mc_return": mc[t],
            "episode_id": episode.get("episode_id"),
            "step_idx": s["idx"],
            "phase": episode.get("phase"),
        })
    return out


def build_transitions(trajectories: Iterable[tuple[dict, list[dict]]], gamma: float = 0.9) -> list[dict]:
    """Flat list of step samples from (episode, steps) pairs; episodes without steps are skipped."""
    out: list[dict] = []
    for episode, steps in trajectories:
        out.extend(episode_transitions(episode, steps, gamma))
    return out


def _group(samples: list[dict]) -> list[list[dict]]:
    groups: dict = {}
    for i, s in enumerate(samples):
        groups.setdefault(s.get("episode_id", i), []).append(s)
    return [sorted(g, key=lambda s: s.get("step_idx", 0)) for g in groups.values()]


def export_official(trajectories, path: str | Path, gamma: float = 0.9, seed: int = 0) -> tuple[Path, Path]:
    """Write the official stage-1 file ``path`` (List[List[step]]) and the flat ``<stem>_filter.pt``.

    ``trajectories``: (episode, steps) pairs from the store, or a flat list of samples from
    :func:`build_transitions` (grouped back by episode_id). The filter file holds every step shuffled with
    ``mc_return`` (and ``rank_score`` where a sample has one), which is what ``offpolicy_train_loop`` reads.
    """
    import torch

    trajectories = list(trajectories)
    if trajectories and isinstance(trajectories[0], tuple):
        per_traj = [episode_transitions(ep, st, gamma) for ep, st in trajectories]
    else:
        per_traj = _group(trajectories)
    per_traj = [t for t in per_traj if t]
    stage1 = [[{k: s[k] for k in OFFICIAL_STEP_KEYS} for s in traj] for traj in per_traj]
    flat = []
    for traj in per_traj:
        for s in traj:
            rec = {k: s[k] for k in OFFICIAL_STEP_KEYS}
            rec["mc_return"] = float(s["mc_return"])
            if s.get("rank_score") is not None:
                rec["rank_score"] = float(s["rank_score"])
            flat.append(rec)
    random.Random(seed).shuffle(flat)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    filter_path = path.with_name(f"{path.stem}_filter{path.suffix or '.pt'}")
    torch.save(stage1, path)
    torch.save(flat, filter_path)
    return path, filter_path


def import_vab_traces(traces_dir: str | Path, phase: int = 0, policy_id: str = "vab",
                      purpose: str = "rollout", *, compat: str = "webrl") -> list[tuple[dict, list[dict]]]:
    """Read VAB ``traces/<id>.jsonl`` (+ ``../actions/<id>.json`` scores) into (episode, steps) pairs.

    Each jsonl line: trace_id, index, prompt (intent at step 0, the HTML placeholder later), html (the page
    before the action), response, target (intent); ``fixed_traces`` lines may also carry ``score``. The full
    prompt of each step is rebuilt with :func:`build_prompt` in the prompt format ``compat`` ("webrl" or "official":
    the official ``format_prompt`` byte for byte, see ``webrl_core.prompts``). The score comes
    from ``actions/<id>.json`` (``score``), else from a per-step ``score``; env_score >= 0.5 -> success.
    Steps' ``action`` is left as JSON ``null`` (VAB stores only the raw response).
    """
    check_compat(compat)
    traces_dir = Path(traces_dir)
    if not traces_dir.is_dir():
        raise FileNotFoundError(f"VAB traces folder not found: {traces_dir}")
    if (traces_dir / "traces").is_dir():  # given the VAB result dir itself
        traces_dir = traces_dir / "traces"
    files = sorted(traces_dir.glob("*.jsonl"))
    if not files:
        raise FileNotFoundError(f"{traces_dir}: no traces/*.jsonl (expected a VAB result dir or its traces/ folder)")
    actions_dir = traces_dir.parent / "actions"
    out = []
    for f in files:
        lines = []
        for n, line in enumerate(f.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                lines.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ValueError(f"{f}:{n}: not valid JSON: {e}") from None
        if not lines:
            continue
        for n, rec in enumerate(lines, 1):
            missing = [k for k in ("html", "response") if k not in rec]
            if missing:
                raise ValueError(f"{f}: step line {n} lacks field(s) {missing}")
        lines.sort(key=lambda r: int(r.get("index", 0)))
        task_id = f.stem
        intent = lines[0].get("target") or lines[0].get("prompt") or ""
        if intent == HTML_PLACEHOLDER:
            raise ValueError(f"{f}: cannot find the intent (no 'target' and step 0 'prompt' is the placeholder)")
        score = None
        act_file = actions_dir / f"{task_id}.json"
        if act_file.exists():
            try:
                score = json.loads(act_file.read_text()).get("score")
            except json.JSONDecodeError as e:
                raise ValueError(f"{act_file}: not valid JSON: {e}") from None
        if score is None and lines[-1].get("score") is not None:
            score = lines[-1]["score"]
        score = None if score is None or float(score) < 0 else float(score)  # VAB writes -1 for unfinished
        episode_id = f"{policy_id}-{phase}-{task_id}"
        past: list[str] = []
        steps = []
        for i, rec in enumerate(lines):
            steps.append({
                "episode_id": episode_id, "idx": i, "prompt": build_prompt(intent, past, rec["html"], compat=compat),
                "html": rec["html"], "response": rec["response"], "action": "null", "url": rec.get("url"),
                "reward": 0.0, "done": i == len(lines) - 1, "mc_return": None,
                "policy_s": None, "action_s": None, "obs_s": None, "error": None,
            })
            past.append(rec["response"])
        episode = {
            "episode_id": episode_id, "task_id": task_id, "phase": phase, "policy_id": policy_id,
            "purpose": purpose, "status": "done", "final_answer": None, "env_score": score, "orm_score": None,
            "success": None if score is None else score >= 0.5, "n_steps": len(steps), "started_at": None,
            "wall_s": None, "policy_s": None, "env_s": None, "error": None, "intent": intent, "site": None,
            "seed": None, "policy_digest": f"imported:{policy_id}", "settings_digest": "imported",
        }
        if episode["success"] is not None and steps:
            steps[-1]["reward"] = float(episode["success"])
        out.append((episode, steps))
    return out

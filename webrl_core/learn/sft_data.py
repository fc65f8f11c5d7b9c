"""Demonstrations for the phase-0 SFT of a real model: (prompt, action) pairs.

The official SFT baseline is trained with LLaMA-Factory (WebRL ``LLaMA-Factory/examples/train_full/
llama3_full_policy_web.yaml``, dataset ``web_policy_sft`` = ``LLaMA-Factory/data/web_policy_sft.json``, template
``llama3_web``: the user content inserted raw). Its format is ShareGPT: a JSON list whose items hold
``conversations``, a list of ``{"from": "human" | "gpt", "value": ...}`` turns; the human turn is the full WebRL
prompt of one step (task, earlier rounds, current observation) and the gpt turn the action. Each (human, gpt) pair is one SFT sample with
the loss on the gpt turn only: the actor's SFT objective, paper Eq. 1 restricted to demonstrations.

VAB-WebArena-Lite's ``traces/<id>.jsonl`` (``transitions.import_vab_traces``) are the other source: every step of a
successful trace becomes a pair, its prompt rebuilt in the run's prompt format.

``write_sharegpt`` writes the same format from stored episodes (e.g. the embedded sites' oracle demonstrations), so
a file made here trains with LLaMA-Factory too.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from webrl_core.errors import BadInput, MissingInput
from webrl_core.websites import is_success

HUMAN_ROLES = ("human", "user")
GPT_ROLES = ("gpt", "assistant")


class DemonstrationError(BadInput):
    """A demonstrations file or folder cannot be read; the message names the file, the item and the field."""


class DemonstrationMissing(DemonstrationError, MissingInput):
    """The demonstrations file does not exist."""


def read_sharegpt(path: str | Path) -> list[tuple[str, str]]:
    """(prompt, action) pairs of a ShareGPT file: every human turn followed by a gpt turn is one pair."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise DemonstrationMissing(f"{path}: demonstrations file not found") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DemonstrationError(f"{path}: not JSON ({e})") from None
    if not isinstance(data, list):
        raise DemonstrationError(f"{path}: expected a JSON list of {{'conversations': [...]}} items, got "
                                 f"{type(data).__name__}")
    pairs = []
    for i, item in enumerate(data):
        turns = item.get("conversations") if isinstance(item, Mapping) else None
        if not isinstance(turns, list) or not turns:
            raise DemonstrationError(f"{path}: item {i} has no 'conversations' list (LLaMA-Factory ShareGPT format: "
                                     f"[{{'from': 'human', 'value': <prompt>}}, {{'from': 'gpt', 'value': <action>}}])")
        for j, turn in enumerate(turns):
            if not isinstance(turn, Mapping) or not isinstance(turn.get("value"), str) or turn.get("from") not in (
                    *HUMAN_ROLES, *GPT_ROLES, "system"):
                raise DemonstrationError(f"{path}: item {i} conversations[{j}] must be {{'from': human|gpt|system, "
                                         f"'value': <text>}}, got {str(turn)[:120]!r}")
        for a, b in zip(turns, turns[1:]):
            if a["from"] in HUMAN_ROLES and b["from"] in GPT_ROLES:
                pairs.append((a["value"], b["value"]))
    if not pairs:
        raise DemonstrationError(f"{path}: no (human, gpt) turn pair in {len(data)} item(s)")
    return pairs


def read_vab_traces(traces_dir: str | Path, compat: str = "webrl") -> list[tuple[str, str]]:
    """(prompt, action) pairs of every step of the successful VAB traces in ``traces_dir``."""
    from webrl_core.learn.transitions import import_vab_traces

    pairs = []
    for episode, steps in import_vab_traces(traces_dir, compat=compat):
        if is_success(episode.get("env_score")):
            pairs += [(s["prompt"], s["response"]) for s in steps]
    if not pairs:
        raise DemonstrationError(f"{traces_dir}: no successful trace (score >= 0.5) to learn from")
    return pairs


def read_demonstrations(source: str | Path, compat: str = "webrl") -> list[tuple[str, str]]:
    """``bootstrap.sft_data``: a ShareGPT JSON file, or a VAB ``traces`` folder (prompts rebuilt in ``compat``)."""
    source = Path(source)
    if source.is_dir():
        return read_vab_traces(source, compat)
    return read_sharegpt(source)


def sharegpt_items(pairs: Iterable[tuple[str, str]]) -> list[dict]:
    """One ShareGPT item per (prompt, action) pair."""
    return [{"conversations": [{"from": "human", "value": p}, {"from": "gpt", "value": a}]} for p, a in pairs]


def episode_pairs(episodes: Sequence[Mapping], steps_by_episode: Mapping[str, Sequence[Mapping]]
                  ) -> list[tuple[str, str]]:
    """(prompt, response) of every step of the successful episodes, in step order."""
    return [(s["prompt"], s["response"]) for e in episodes if is_success(e.get("env_score"))
            for s in sorted(steps_by_episode.get(e["episode_id"], []), key=lambda s: s["idx"])]


TASK_LINE = "Task Instruction: "
"""How both prompt formats open (``prompts.build_prompt``; official ``WebRLPromptConstructor``): the intent follows,
up to the first blank line."""


def prompt_intent(prompt: str) -> str | None:
    """The intent a WebRL prompt opens with, None when it does not open like one."""
    if not prompt.startswith(TASK_LINE):
        return None
    return prompt[len(TASK_LINE):].split("\n\n", 1)[0]


def demonstration_episodes(source: str | Path, source_digest: str, compat: str = "webrl"
                           ) -> list[tuple[dict, list[dict]]]:
    """The demonstrations as stored experience of phase 0 (what the official code replays in the first phase: the
    SFT data converted to its replay format, WebRL ``scripts/webarena_lite_sft.pt``): VAB traces as their episodes;
    a ShareGPT file as successful episodes of consecutive items with the same intent (one step each; a prompt
    that does not open with the task line is an episode of its own). Their policy identity is
    ``imported:sft-data@<digest>``, which replay selection always admits (``TrajectoryStore.REPLAY_SQL``)."""
    from webrl_core.learn.transitions import import_vab_traces

    policy_id = f"sft-data@{source_digest[:16]}"
    if Path(source).is_dir():
        return import_vab_traces(source, phase=0, policy_id=policy_id, purpose="oracle", compat=compat)
    groups: list[tuple[str, list[tuple[str, str]]]] = []
    for i, (prompt, action) in enumerate(read_sharegpt(source)):
        intent = prompt_intent(prompt)
        if intent is None or not groups or groups[-1][0] != intent:
            groups.append((intent if intent is not None else f"(demonstration {i})", []))
        groups[-1][1].append((prompt, action))
    out = []
    for n, (intent, pairs) in enumerate(groups):
        episode_id = f"{policy_id}-{n}"
        steps = [{"episode_id": episode_id, "idx": i, "prompt": p, "html": None, "response": a, "action": "null",
                  "url": None, "reward": float(i == len(pairs) - 1), "done": i == len(pairs) - 1, "mc_return": None,
                  "policy_s": None, "action_s": None, "obs_s": None, "error": None} for i, (p, a) in enumerate(pairs)]
        out.append(({"episode_id": episode_id, "task_id": f"sft-{n}", "phase": 0, "policy_id": policy_id,
                     "purpose": "oracle", "status": "done", "final_answer": None, "env_score": 1.0, "orm_score": None,
                     "success": True, "n_steps": len(steps), "started_at": None, "wall_s": None, "policy_s": None,
                     "env_s": None, "error": None, "intent": intent, "site": None, "seed": None,
                     "policy_digest": f"imported:{policy_id}", "settings_digest": "imported"}, steps))
    return out


def write_sharegpt(pairs: Iterable[tuple[str, str]], path: str | Path) -> Path:
    """Write ``pairs`` as a ShareGPT file (atomically: a crash leaves no half-written file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(sharegpt_items(pairs), ensure_ascii=False, indent=1), encoding="utf-8")
    tmp.replace(path)
    return path

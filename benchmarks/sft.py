"""`webrl bench sft`: what a phase-0 setting buys, measured on a validation split of the training pool (never on
the held-out test set), so SFT settings can be chosen before a run.

For one config (and ``--set`` overrides) it runs the bootstrap's own stages in a bench run dir: oracle
demonstrations of ``demos`` training tasks (stored; a later call reuses them), the run's BPE tokenizer, the SFT
actor (``bootstrap.sft_*``, ``models.embedded.*``, ``actor.*batch*``), then greedy rollouts (``policy.eval_temperature``)
on ``val_tasks`` training-pool tasks whose intents are not among the demonstrations'. It prints and returns:

  - SFT wall seconds and trained tokens per second (tokens = the samples' lengths x epochs);
  - validation success (the sites' evaluators) and the share of steps whose response did not parse as an action;
  - ``arg_from_intent``: the share of typed arguments (``argument="..."`` of Type/Search) that occur in the task's
    intent: a model that ignores the intent types memorised strings, which no amount of grammar fixes.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

from webrl_core.artifacts import ArtifactRef, read_json, write_json
from webrl_core.env.webarena import to_task_row
from webrl_core.pipeline import bootstrap, experience, task_sets
from webrl_core.sites.tasks import train_tasks
from webrl_core.runs.store import TrajectoryStore

VAL_SEED_OFFSET = 7  # the demonstrations use the bootstrap's offset 1; a different stream, intents filtered too
ARGUMENT = re.compile(r'argument\s*=\s*"([^"]*)"')


def demo_tasks(settings, run_dir: str, demos: int) -> ArtifactRef:
    """The ``demos`` training tasks the bench's oracle demonstrates (the bootstrap's, same seed offset); validation
    tasks avoid their intents."""
    return task_sets.train_task_pool(settings, run_dir, demos, 1, f"bench_sft_demos_{demos}")


def validation_tasks(settings, run_dir: str, n: int, exclude_intents: set[str]) -> ArtifactRef:
    """n training-pool tasks whose intents are not in ``exclude_intents`` (the demonstrations')."""
    pool = train_tasks(4 * n + len(exclude_intents), seed=settings.run.seed * 1000 + VAL_SEED_OFFSET,
                       data_seed=settings.sites.data_seed)
    tasks = [t for t in pool if t["intent"] not in exclude_intents][:n]
    if len(tasks) < n:
        raise ValueError(f"bench sft: only {len(tasks)} validation tasks are left after removing the "
                         f"demonstrations' intents; ask for fewer (--val-tasks) or fewer demos")
    TrajectoryStore(run_dir).write_tasks([to_task_row(t, 0, "val", family=t.get("family")) for t in tasks])
    return write_json(tasks, Path(run_dir) / "tasks" / f"bench_sft_val_{n}.json")


def action_diagnostics(store: TrajectoryStore, episode_ids: list[str]) -> dict:
    """Unparseable-step share and the share of typed arguments found in the intent, over the episodes' steps."""
    rows = store.sql("SELECT e.intent, s.response, s.error FROM steps s JOIN episodes e USING (episode_id) "
                     "WHERE e.episode_id IN (SELECT unnest($ids))", {"ids": episode_ids})
    args = [(r["intent"], m.group(1)) for r in rows for m in [ARGUMENT.search(r["response"] or "")] if m]
    invalid = sum(1 for r in rows if str(r["error"] or "").startswith("invalid action"))
    return {"val_steps": len(rows), "invalid_share": round(invalid / max(1, len(rows)), 3),
            "typed_args": len(args),
            "arg_from_intent": round(sum(1 for i, a in args if a and a.lower() in i.lower()) / max(1, len(args)), 3)}


def run(settings, run_dir: str | Path, demos: int, val_tasks: int, out: str | None = None) -> dict:
    run_dir = str(run_dir)
    demo_ref = demo_tasks(settings, run_dir, demos)
    t0 = time.perf_counter()
    demo_roll = experience.rollout(settings, run_dir, 0, "oracle", demo_ref, None, 0.0)
    collect_s = time.perf_counter() - t0
    demo_set = {"episode_ids": demo_roll["episode_ids"]}
    if settings.models.actor:  # the pretrained model, as the bootstrap fine-tunes it
        init = ArtifactRef.of(settings.models.actor, "model")
    else:
        init = bootstrap.init_embedded_actor(settings, run_dir, bootstrap.build_tokenizer(settings, run_dir, demo_set))
    t0 = time.perf_counter()
    actor, sft = bootstrap.sft_actor(settings, run_dir, init, demo_set)
    sft_s = time.perf_counter() - t0
    intents = {t["intent"] for t in read_json(demo_ref)}
    val_ref = validation_tasks(settings, run_dir, val_tasks, intents)
    t0 = time.perf_counter()
    val = experience.rollout(settings, run_dir, 0, "eval", val_ref, actor, settings.policy.eval_temperature)
    val_s = time.perf_counter() - t0
    result = {"demos": demos, "oracle_solved": demo_roll["env_success"], "collect_s": round(collect_s, 1),
              "sft_pairs": sft.get("sft_pairs"), "params": sft.get("total_params"), "sft_s": round(sft_s, 1),
              "sft_tokens": sft.get("tokens"), "sft_tokens_per_s": round((sft.get("tokens") or 0) / max(sft_s, 1e-9)),
              "sft_loss": sft.get("train_loss"), "val_solved": val["env_success"], "val_n": val["n"],
              "val_errors": val["errors"], "val_s": round(val_s, 1), "actor": actor.path,
              **action_diagnostics(TrajectoryStore(run_dir), val["episode_ids"])}
    _print(result)
    if out:
        Path(out).write_text(json.dumps(result, indent=2))
    return result


def _print(r: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title="webrl bench sft (validation split of the training pool)")
    for col in ("demos", "SFT pairs", "params", "SFT s", "tokens/s", "val solved", "unparseable", "args from intent"):
        t.add_column(col, justify="right")
    t.add_row(str(r["demos"]), str(r["sft_pairs"]), f"{(r['params'] or 0) / 1e6:.2f}M", f"{r['sft_s']:.0f}",
              f"{r['sft_tokens_per_s']}", f"{r['val_solved']}/{r['val_n']}", f"{100 * r['invalid_share']:.0f}%",
              f"{100 * r['arg_from_intent']:.0f}% of {r['typed_args']}")
    Console().print(t)

"""Evaluation: an actor on the held-out test set at the evaluation temperature, scored by the sites' evaluators.

Per site: solved / failed / unscored / errored episodes; success rate = solved / (solved + failed). Errored
episodes are reported apart, never counted as failures (more than ``env.max_error_rate`` of them fails the
rollout); so are unscored ones: their task needs the LLM judge (fuzzy_match, the N/A reason check) and no judge was
configured (``eval.judge`` empty; ``episode.outcome``). With ``eval.judge: none`` those tasks are scored by the
deterministic fallback and the result says so (``judge``, ``judge_fallback``)."""

from __future__ import annotations

from pathlib import Path

from webrl_core.artifacts import ArtifactRef, read_json
from webrl_core.env.episode import outcome
from webrl_core.env.judge import describe_judge, needs_judge
from webrl_core.pipeline import experience
from webrl_core.pipeline.stage import stage
from webrl_core.runs.rundir import output_key, write_json_version
from webrl_core.runs.store import TrajectoryStore

_COUNTS = ("n", "success", "failed", "unscored", "errors")
_KEY = {"success": "success", "failed": "failed", "unscored": "unscored", "error": "errors"}


def tally(episodes: list[dict]) -> tuple[dict[str, dict], dict]:
    """Per-site and total counts of episode rows (``site``, ``status``, ``env_score``):
    {site: {n, success, failed, unscored, errors}}, total."""
    table: dict[str, dict] = {}
    for e in episodes:
        row = table.setdefault(e["site"], dict.fromkeys(_COUNTS, 0))
        row["n"] += 1
        row[_KEY[outcome(e["status"], e["env_score"])]] += 1
    total = {k: sum(v[k] for v in table.values()) for k in _COUNTS}
    return table, total


def judge_usage(settings, episodes: list[dict], tasks: list[dict]) -> dict:
    """What scored the test episodes whose task needs a judge: ``judge`` (``eval.judge`` in words),
    ``judge_tasks`` (such episodes that were scored) and, with ``eval.judge: none``, ``judge_fallback`` (those
    scored by the deterministic fallback)."""
    by_id = {str(t.get("task_id")): t for t in tasks}
    judged = [e for e in episodes if outcome(e["status"], e["env_score"]) in ("success", "failed")
              and needs_judge(by_id.get(str(e["task_id"])))]
    out = {"judge": describe_judge(settings), "judge_tasks": len(judged)}
    if (settings.eval.judge or "").strip().lower() == "none":
        out["judge_fallback"] = len(judged)
    return out


@stage(*experience.ROLLOUT_SECTIONS)  # ROLLOUT_SECTIONS has "eval" (the judge)
def evaluate(settings, run_dir: str, phase: int, actor_ref: ArtifactRef | None, test_ref: ArtifactRef,
             purpose: str = "eval", name: str | None = None) -> tuple[ArtifactRef, dict]:
    """Written to ``eval/<name>.json`` (``phase=k`` for a phase, ``model=<digest>`` for a checkpoint evaluated
    on its own)."""
    # experience.rollout, looked up at call time (the fault harness wraps it to watch evaluation rollouts)
    r = experience.rollout(settings, run_dir, phase, purpose, test_ref, actor_ref, settings.policy.eval_temperature)
    eps = TrajectoryStore(run_dir).sql(
        "SELECT task_id, site, env_score, status, policy_digest FROM episodes "
        "WHERE episode_id IN (SELECT unnest($ids))", {"ids": r["episode_ids"]})
    stale = {e["policy_digest"] for e in eps} - {r["policy_digest"]}
    if stale:
        raise RuntimeError(f"evaluation of {r['policy_digest']} read episodes of other policies {sorted(stale)}")
    table, total = tally(eps)
    scored = total["success"] + total["failed"]
    result = {"phase": phase, "sites": table, "total": total, "success_rate": total["success"] / max(1, scored),
              "actor": actor_ref.path if actor_ref else purpose, "policy_digest": r["policy_digest"],
              "episode_ids": r["episode_ids"], **judge_usage(settings, eps, read_json(test_ref))}
    name = name or f"phase={phase}"
    ref = write_json_version(result, Path(run_dir) / "eval" / f"{name}.json", output_key(settings, actor_ref, test_ref))
    metrics = {"test_success_rate": result["success_rate"], "test_solved": float(total["success"]),
               "test_failed": float(total["failed"]), "test_unscored": float(total["unscored"]),
               "test_errored": float(total["errors"]),
               **({"test_judge_fallback": float(result["judge_fallback"])} if "judge_fallback" in result else {}),
               **{f"test_success_{s}": v["success"] / max(1, v["success"] + v["failed"]) for s, v in table.items()}}
    return ref, metrics

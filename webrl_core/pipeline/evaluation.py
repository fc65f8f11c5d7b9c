"""Evaluation: an actor on the held-out test set at the evaluation temperature, scored by the sites' evaluators.

Per site: solved / failed / errored episodes; success rate = solved / scored (errored episodes are reported
apart, never counted as failures; more than ``env.max_error_rate`` of them fails the rollout)."""

from __future__ import annotations

from pathlib import Path

from webrl_core.artifacts import ArtifactRef
from webrl_core.pipeline import experience
from webrl_core.pipeline.stage import stage
from webrl_core.rundir import output_key, write_json_version
from webrl_core.store import TrajectoryStore
from webrl_core.websites import is_success


@stage(*experience.ROLLOUT_SECTIONS, "eval")
def evaluate(settings, run_dir: str, phase: int, actor_ref: ArtifactRef | None, test_ref: ArtifactRef,
             purpose: str = "eval", name: str | None = None) -> tuple[ArtifactRef, dict]:
    """Written to ``eval/<name>.json`` (``phase=k`` for a phase, ``model=<digest>`` for a checkpoint evaluated
    on its own)."""
    # experience.rollout, looked up at call time (the fault harness wraps it to watch evaluation rollouts)
    r = experience.rollout(settings, run_dir, phase, purpose, test_ref, actor_ref, settings.policy.eval_temperature)
    eps = TrajectoryStore(run_dir).sql(
        "SELECT site, env_score, status, policy_digest FROM episodes WHERE episode_id IN (SELECT unnest($ids))",
        {"ids": r["episode_ids"]})
    stale = {e["policy_digest"] for e in eps} - {r["policy_digest"]}
    if stale:
        raise RuntimeError(f"evaluation of {r['policy_digest']} read episodes of other policies {sorted(stale)}")
    table: dict[str, dict] = {}
    for e in eps:
        row = table.setdefault(e["site"], {"n": 0, "success": 0, "failed": 0, "errors": 0})
        row["n"] += 1
        outcome = "errors" if e["status"] == "error" else "success" if is_success(e["env_score"]) else "failed"
        row[outcome] += 1
    total = {k: sum(v[k] for v in table.values()) for k in ("n", "success", "failed", "errors")}
    scored = total["success"] + total["failed"]
    result = {"phase": phase, "sites": table, "total": total, "success_rate": total["success"] / max(1, scored),
              "actor": actor_ref.path if actor_ref else purpose, "policy_digest": r["policy_digest"],
              "episode_ids": r["episode_ids"]}
    name = name or f"phase={phase}"
    ref = write_json_version(result, Path(run_dir) / "eval" / f"{name}.json", output_key(settings, actor_ref, test_ref))
    metrics = {"test_success_rate": result["success_rate"], "test_solved": float(total["success"]),
               "test_failed": float(total["failed"]), "test_errored": float(total["errors"]),
               **{f"test_success_{s}": v["success"] / max(1, v["success"] + v["failed"]) for s, v in table.items()}}
    return ref, metrics

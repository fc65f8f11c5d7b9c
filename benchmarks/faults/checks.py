"""Facts of a finished run (store, artifacts, Prefect's task states) and the checks against the clean run:
tasks, lost, doubled, stale, artifacts."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from webrl_core.agent.rollout_policy import rollout_identity
from benchmarks.faults.probes import PHASE
from webrl_core.runs.rundir import model_ref


def _digest(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


def collect(run: str | Path) -> dict:
    """What the checks need from a finished phase-1 run directory (plain JSON)."""
    import duckdb

    from webrl_core.artifacts import ArtifactRef, read_json, sha256_path
    from webrl_core.config_loader import load_config
    from webrl_core.env.rollout import plan_episode_ids
    from webrl_core.runs.store import TrajectoryStore

    run = Path(run)
    s = load_config(run / "config.yaml")
    models = run / "models"
    a0 = ArtifactRef.of(models / "phase=0" / "actor", "model")
    a1 = ArtifactRef.of(models / f"phase={PHASE}" / "actor", "model")
    tasks = read_json(run / "tasks" / f"phase={PHASE}" / "tasks.json")
    test = read_json(run / "tasks" / "test.json")
    planned_r = plan_episode_ids(tasks, phase=PHASE, purpose="rollout", seed=s.run.seed,
                                 **rollout_identity(s, a0, s.policy.temperature, "rollout"))
    planned_e = plan_episode_ids(test, phase=PHASE, purpose="eval", seed=s.run.seed,
                                 **rollout_identity(s, a1, s.policy.eval_temperature, "eval"))
    store = TrajectoryStore(run)
    eps = store.sql("""SELECT episode_id, purpose, status, policy_digest, n_steps, env_score, orm_score, success
                       FROM episodes WHERE phase = $p ORDER BY episode_id""", {"p": PHASE})
    steps = {r["episode_id"]: r for r in store.sql(
        """SELECT episode_id, count(*) AS n, count(DISTINCT idx) AS n_idx, list(response ORDER BY idx) AS responses
           FROM steps WHERE phase = $p GROUP BY episode_id""", {"p": PHASE})}
    files = (run / "store" / "episodes" / f"phase={PHASE}").as_posix()
    con = duckdb.connect()
    try:  # every original write of an episode (updates carry '-u' in their batch)
        writes = con.execute(f"""SELECT episode_id, _batch, status FROM read_parquet('{files}/*.parquet',
                                 union_by_name=true) WHERE _batch NOT LIKE '%-u%'
                                 ORDER BY episode_id, _batch""").fetchall()
    finally:
        con.close()
    by_writes: dict[str, list] = {}
    for e, b, st in writes:
        by_writes.setdefault(e, []).append([b, st])
    # steps observed on Chromium's error page for an unreachable server: an episode that went on after its site died
    unreachable = [r["episode_id"] for r in store.sql(
        """SELECT DISTINCT episode_id FROM steps WHERE phase = $p AND (url LIKE 'chrome-error:%'
           OR regexp_matches(coalesce(html, ''), 'ERR_CONNECTION_(REFUSED|RESET|CLOSED)|ERR_EMPTY_RESPONSE'))""",
        {"p": PHASE})]
    ev = read_json(run / "eval" / f"phase={PHASE}.json")
    for e in eps:
        st = steps.get(e["episode_id"], {})
        e["steps_rows"], e["steps_idx"] = st.get("n", 0), st.get("n_idx", 0)
        e["trajectory"] = _digest([st.get("responses", []), e["env_score"], e["status"]])
    rollout_eps = [e for e in eps if e["purpose"] == "rollout"]
    return {
        "run_dir": str(run), "tasks_sha": sha256_path(run / "tasks" / f"phase={PHASE}" / "tasks.json"),
        "actor0": f"hf:{a0.sha256}", "actor1": f"hf:{a1.sha256}",
        "critic1": sha256_path(models / f"phase={PHASE}" / "critic"),
        "samples_sha": sha256_path(run / "data" / f"phase={PHASE}" / "samples.jsonl"),
        "replay_sha": sha256_path(run / "data" / f"phase={PHASE}" / "replay.jsonl"),
        "planned_rollout": sorted(planned_r), "planned_eval": sorted(planned_e), "episodes": eps,
        "writes": by_writes, "orm_threshold": s.orm.threshold, "unreachable": sorted(unreachable),
        "rollout_trajectories": _digest(sorted((e["episode_id"], e["trajectory"]) for e in rollout_eps)),
        "eval_json": {k: ev.get(k) for k in ("success_rate", "total", "policy_digest", "episode_ids")},
    }


def _ok(ok: bool, why: str = "", **info) -> dict:
    return {"ok": bool(ok), "why": "" if ok else why, **info}


def check(f: dict, c: dict, at_kill: dict, run: Path, weight_tol: float = 0.0) -> dict[str, dict]:
    """The row's checks: run facts ``f`` against the clean run's ``c`` (see module docstring)."""
    eps = {e["episode_id"]: e for e in f["episodes"]}
    roll = {i for i, e in eps.items() if e["purpose"] == "rollout"}
    evl = {i for i, e in eps.items() if e["purpose"] == "eval"}
    c_roll = {e["episode_id"] for e in c["episodes"] if e["purpose"] == "rollout"}
    c_eval = {e["episode_id"] for e in c["episodes"] if e["purpose"] == "eval"}
    out: dict[str, dict] = {}
    out["tasks"] = _ok(f["tasks_sha"] == c["tasks_sha"], "tasks/phase=1/tasks.json differs from the clean run's")

    missing = (set(f["planned_rollout"]) - roll) | (set(f["planned_eval"]) - evl)
    errored = sorted(i for i, e in eps.items() if e["status"] == "error")
    why = []
    if missing:
        why.append(f"{len(missing)} planned episode(s) not stored, e.g. {sorted(missing)[:2]}")
    if errored:
        why.append(f"{len(errored)} episode(s) left errored, e.g. {errored[:2]}")
    if roll != c_roll:
        why.append(f"rollout ids differ from the clean run's ({len(roll ^ c_roll)} not in both)")
    if len(evl) != len(c_eval) or (f["actor1"] == c["actor1"] and evl != c_eval):
        why.append(f"eval ids differ from the clean run's ({len(evl)} vs {len(c_eval)} episodes)")
    out["lost"] = _ok(not why, "; ".join(why), rollout=len(roll), eval=len(evl))

    why = []
    bad_steps = [i for i, e in eps.items() if e["status"] != "error" and
                 not (e["steps_rows"] == e["steps_idx"] == e["n_steps"])]
    if bad_steps:
        why.append(f"{len(bad_steps)} episode(s) whose steps are doubled or missing, e.g. {bad_steps[:2]}")
    rewritten = [i for i, w in f["writes"].items() if len(w) > 1 and any(st != "error" for _, st in w[:-1])]
    if rewritten:
        why.append(f"{len(rewritten)} finished episode(s) rolled out again, e.g. {rewritten[:2]}")
    last = {i: w[-1][0] for i, w in f["writes"].items()}
    redone = [i for i, b in at_kill.items() if last.get(i) != b]
    if redone:
        why.append(f"{len(redone)} of the {len(at_kill)} episodes stored before the fault were written again")
    out["doubled"] = _ok(not why, "; ".join(why), kept_from_before=len(at_kill) - len(redone),
                         rewritten_errors=sum(1 for w in f["writes"].values() if len(w) > 1))

    why = []
    extra = set(eps) - set(f["planned_rollout"]) - set(f["planned_eval"])
    if extra:
        why.append(f"{len(extra)} phase-1 episode(s) outside the planned ids, e.g. {sorted(extra)[:2]}")
    wrong_r = [i for i in roll if eps[i]["policy_digest"] != f["actor0"]]
    wrong_e = [i for i in evl if eps[i]["policy_digest"] != f["actor1"]]
    if wrong_r:
        why.append(f"{len(wrong_r)} rollout episode(s) not of the phase-0 actor")
    if wrong_e:
        why.append(f"{len(wrong_e)} eval episode(s) not of the phase-1 actor")
    ev = f["eval_json"]
    if ev["policy_digest"] != f["actor1"]:
        why.append("eval/phase=1.json names another policy than models/phase=1/actor")
    if sorted(ev["episode_ids"] or []) != sorted(f["planned_eval"]):
        why.append("eval/phase=1.json lists other episodes than the actor's planned ones")
    if f["unreachable"]:
        why.append(f"{len(f['unreachable'])} stored episode(s) with steps on an unreachable site's error page, "
                   f"e.g. {f['unreachable'][:2]}")
    unlabelled = [i for i in roll if eps[i]["status"] != "error" and (
        eps[i]["orm_score"] is None or eps[i]["success"] != (eps[i]["orm_score"] >= f["orm_threshold"]))]
    if unlabelled:
        why.append(f"{len(unlabelled)} rollout episode(s) without a current ORM label")
    out["stale"] = _ok(not why, "; ".join(why))

    out["artifacts"] = _artifacts(f, c, run, weight_tol)
    return out


def _artifacts(f: dict, c: dict, run: Path, weight_tol: float) -> dict:
    from webrl_core.experiments.reproduce import max_weight_diff

    why = []
    if f["rollout_trajectories"] == c["rollout_trajectories"]:
        mode = "vs clean"
        for k, name in (("samples_sha", "samples.jsonl"), ("replay_sha", "replay.jsonl")):
            if f[k] != c[k]:
                why.append(f"{name} differs from the clean run's")
        dw = {}
        for name in ("critic", "actor"):
            dw[name] = max_weight_diff(Path(c["dir"]) / "models" / f"phase={PHASE}" / name,
                                       run / "models" / f"phase={PHASE}" / name)
            if dw[name] > weight_tol:
                why.append(f"{name} max |dw| {dw[name]:.3g} > {weight_tol:g}")
        ft, ct = f["eval_json"]["total"], c["eval_json"]["total"]
        if (ft["success"], ft["failed"], ft["errors"]) != (ct["success"], ct["failed"], ct["errors"]):
            why.append(f"eval solved/failed/errored {ft['success']}/{ft['failed']}/{ft['errors']}, clean "
                       f"{ct['success']}/{ct['failed']}/{ct['errors']}")
        return _ok(not why, "; ".join(why), mode=mode, max_dw=max(dw.values()))
    mode = "vs recompute"
    rep = _recompute(run, f)
    why = rep["why"]
    return _ok(not why, "; ".join(why), mode=mode, max_dw=rep["max_dw"])


def _recompute(run: Path, f: dict) -> dict:
    """Recompute the phase's data-dependent outputs from the run's own stored episodes and compare."""
    from webrl_core.config_loader import load_config
    from webrl_core.learn.orm import OrmScorer, orm_prompt_for_episode
    from webrl_core.prompts import prompt_format
    from webrl_core.experiments.reproduce import reproduce_phase
    from webrl_core.runs.store import TrajectoryStore

    why: list[str] = []
    rep = reproduce_phase(run, PHASE)
    dw = 0.0
    for name, v in rep["outputs"].items():
        if "max_abs_weight_diff" in v:
            dw = max(dw, v["max_abs_weight_diff"])
        if not v["match"]:
            why.append(f"{name} differs from its recomputation"
                       + (f" (max |dw| {v['max_abs_weight_diff']:.3g})" if "max_abs_weight_diff" in v else ""))
    s = load_config(run / "config.yaml")
    store = TrajectoryStore(run)
    ids = f["planned_rollout"]
    eps, by_ep = store.finished_episodes(ids)
    eps = [e for e in eps if by_ep.get(e["episode_id"])]
    orm = model_ref(run, 0, "orm")
    fmt = prompt_format(s)
    p = OrmScorer(orm.path, s.orm, s.models).p_yes(
        [orm_prompt_for_episode(e, by_ep[e["episode_id"]], s.orm.max_html_chars, compat=fmt) for e in eps])
    off = [e["episode_id"] for e, x in zip(eps, p) if e["orm_score"] is None or abs(e["orm_score"] - float(x)) > 1e-6]
    if off:
        why.append(f"{len(off)} ORM label(s) differ from a re-scoring")
    ev = f["eval_json"]
    solved = sum(1 for e in f["episodes"] if e["purpose"] == "eval" and e["status"] != "error"
                 and (e["env_score"] or 0) >= 1.0)
    if ev["total"]["success"] != solved or ev["total"]["n"] != len(f["planned_eval"]):
        why.append("eval/phase=1.json counts differ from its stored episodes")
    return {"why": why, "max_dw": dw}

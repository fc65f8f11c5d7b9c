"""The entry point: the matrix of faults (bootstrap once, the clean phase, a row per fault) and its summaries."""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Callable

from benchmarks.faults.catalog import FAULTS, FAULT_NAMES, Fault
from benchmarks.faults.harness import Harness


def select(names: str | None) -> list[Fault]:
    if not names:
        return list(FAULTS)
    want = [n.strip() for n in names.split(",") if n.strip()]
    unknown = sorted(set(want) - set(FAULT_NAMES))
    if unknown:
        raise ValueError(f"unknown fault(s) {unknown}; known: {', '.join(FAULT_NAMES)}")
    return [f for f in FAULTS if f.name in want]


def summarize(row: dict) -> str:
    """One line of what the checks saw."""
    ch = row.get("checks") or {}
    if not ch:
        return "-"
    lost, dbl, art = ch["lost"], ch["doubled"], ch["artifacts"]
    parts = [f"{lost.get('rollout', '?')}+{lost.get('eval', '?')} episodes",
             f"{dbl.get('kept_from_before', 0)} stored before the fault kept",
             f"{dbl.get('rewritten_errors', 0)} redone after error" if dbl.get("rewritten_errors") else "",
             *[f"{p} rollout retried by Prefect x{n}" for p, n in (row.get("shard_retries") or {}).items()],
             f"artifacts {art.get('mode', '?')}"]
    return ", ".join(p for p in parts if p)


def recovery(row: dict) -> str:
    """How the phase got to its end: the re-run (its wall time, what it took from the cache and what it ran
    again) or the flow itself."""
    if row.get("rerun_wall_s") is not None:
        states = row.get("rerun_tasks") or {}
        ran = list(dict.fromkeys(states.get("Completed", [])))
        n_cached = len(states.get("Cached", []))
        return (f"re-run {row['rerun_wall_s']:.0f} s: {n_cached} tasks cached, ran "
                + (", ".join(ran) if ran else "nothing"))
    if row.get("survived"):
        return f"flow went on, finished in {row.get('first_wall_s', 0):.0f} s"
    return "-"


def run_matrix(root: str | Path, faults: list[Fault], *, config: str = "smoke", sets: list[str] | None = None,
               keep: bool = False, fraction: float = 0.5, weight_tol: float = 0.0, timeout_s: float = 1800.0,
               log: Callable[[str], None] = print, on_row: Callable[[dict], None] | None = None,
               bootstrap_from: str | Path | None = None) -> dict:
    """Bootstrap (or reuse it, or fork ``bootstrap_from``'s phase 0), the clean phase, then one row per fault.
    Returns {clean, rows, passed, failed}."""
    h = Harness(root, config=config, sets=sets, fraction=fraction, weight_tol=weight_tol, timeout_s=timeout_s,
                log=log, bootstrap_from=bootstrap_from)
    t0 = time.perf_counter()
    boot = h.bootstrap()
    clean = h.run_clean()
    rows = []
    for fault in faults:
        log(f"{fault.name}: {fault.title} ...")
        try:
            row = h.run_fault(fault, keep=keep)
        except Exception as e:  # a harness failure is a failed row, not a crash of the matrix
            row = {"fault": fault.name, "title": fault.title, "injected": "-", "ok": False,
                   "why": f"{type(e).__name__}: {e}", "checks": {}}
        rows.append(row)
        if on_row:
            on_row(row)
    passed = sum(1 for r in rows if r["ok"])
    return {"bootstrap_s": boot, "clean_s": clean["wall_s"], "rows": rows, "passed": passed,
            "failed": len(rows) - passed, "total_s": time.perf_counter() - t0, "root": str(h.root),
            "durations": h.durations}


def as_json(result: dict) -> str:
    return json.dumps(result, indent=1, default=lambda o: asdict(o) if hasattr(o, "__dataclass_fields__") else str(o))

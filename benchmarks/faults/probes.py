"""Probes: each stage function records when it starts and ends (files under a folder), and one can be held
at its end until the harness's kill lands."""

from __future__ import annotations

import functools
import sys
import time
from pathlib import Path
from typing import Callable

import webrl_core.pipeline.bootstrap  # noqa: F401 -- each stage module registers its stages in STAGES
import webrl_core.pipeline.evaluation  # noqa: F401 -- each stage module registers its stages in STAGES
import webrl_core.pipeline.experience  # noqa: F401 -- each stage module registers its stages in STAGES
import webrl_core.pipeline.generation  # noqa: F401 -- each stage module registers its stages in STAGES
import webrl_core.pipeline.task_sets  # noqa: F401 -- each stage module registers its stages in STAGES
import webrl_core.pipeline.updates  # noqa: F401 -- each stage module registers its stages in STAGES
from webrl_core.pipeline.stage import STAGES


PHASE = 1
PROBE_ENV, HOLD_ENV = "WEBRL_FAULT_PROBES", "WEBRL_FAULT_HOLD"
HOLD_S = 1800.0
PROBED = ("generate_tasks", "filter_tasks", "materialise_tasks", "rollout", "orm_label", "phase_transitions",
          "replay_transitions", "update_critic", "update_actor", "evaluate")


def _probe_name(fn: str, args: tuple, kwargs: dict) -> str:
    if fn == "rollout":  # rollout(settings, run_dir, phase, purpose, tasks_ref, actor_ref, temperature, shard, n)
        purpose = args[3] if len(args) > 3 else kwargs.get("purpose")
        shard = args[7] if len(args) > 7 else kwargs.get("shard", 0)
        return f"rollout.{purpose}.{shard}"
    return fn


def _mark(folder: Path, probe: str, event: str) -> None:
    with open(folder / f"{probe}.{event}", "a") as fh:
        fh.write(f"{time.time():.3f}\n")


def install_probes(folder: str | Path, hold: str | None = None) -> None:
    """Wrap the stage functions of ``webrl_core.pipeline`` (in their modules) so each writes ``<probe>.enter`` / ``.exit`` / ``.error``
    (a time per call) into ``folder``; a probe named by ``hold`` (or under it: ``rollout.eval`` holds every
    eval shard) then waits at its end, so the harness's kill lands before the flow records the result. Nothing
    else changes: the Prefect task wrappers, their sources and their inputs (the cache keys) are the same."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)

    def wrap(name: str, orig: Callable) -> Callable:
        @functools.wraps(orig)
        def probed(*args, **kwargs):
            probe = _probe_name(name, args, kwargs)
            _mark(folder, probe, "enter")
            try:
                out = orig(*args, **kwargs)
            except BaseException as e:
                _mark(folder, probe, "error")
                with open(folder / f"{probe}.error.txt", "a") as fh:
                    fh.write(f"{type(e).__name__}: {e}\n")
                raise
            _mark(folder, probe, "exit")
            if hold and (probe == hold or probe.startswith(hold + ".")):
                time.sleep(HOLD_S)
            return out
        return probed

    for name in PROBED:
        module = sys.modules[STAGES[name].__module__]
        setattr(module, name, wrap(name, getattr(module, name)))


def _times(folder: Path, probe: str, event: str) -> list[float]:
    """Times of a probe's event, every call of every probe under ``probe`` (``rollout.rollout`` = all shards)."""
    out: list[float] = []
    for f in folder.glob(f"{probe}*.{event}"):
        stem = f.name[: -len(event) - 1]
        if stem == probe or stem.startswith(probe + "."):
            out += [float(x) for x in f.read_text().split()]
    return sorted(out)


def stage_durations(folder: Path) -> dict[str, float]:
    """Clean duration of each probe (first enter to last exit), from a probed run."""
    out = {}
    for f in folder.glob("*.enter"):
        probe = f.name[:-6]
        enter, exit_ = _times(folder, probe, "enter"), _times(folder, probe, "exit")
        if enter and exit_:
            out[probe] = exit_[-1] - enter[0]
    for agg in ("rollout.rollout", "rollout.eval"):
        enter, exit_ = _times(folder, agg, "enter"), _times(folder, agg, "exit")
        if enter and exit_:
            out[agg] = exit_[-1] - enter[0]
    return out

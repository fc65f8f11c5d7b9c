"""Rollout-engine throughput: env steps/s, observation latency and memory per ``n_envs``, with a scripted policy.

For each n_envs: one browser pool; a warm-up round (n_envs episodes: browsers, renderers, page caches) is not
counted; then ``episodes`` episodes are timed. Reported numbers:

* steps/s = env steps of the timed round / its wall time (resets, policy, evaluation included);
* obs p50/p95 = percentiles of per-step ``obs_s`` (settle + one in-page extraction);
* peak memory = max over samples every 0.25 s of (sum of PSS of this process' chromium processes, from
  /proc/PID/smaps_rollup) and this Python process' RSS.

Targets: ``miniwob`` (MiniWoB++ oracle tasks, MiniWoB oracle) or ``embedded`` (the embedded sites' test set
and their OraclePolicy).
"""

from __future__ import annotations

import asyncio
import statistics
import time

from webrl_core.env.browser import BrowserPool, chromium_pids
from webrl_core.env.rollout import rollout


def _pss_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _rss_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def memory_mb() -> tuple[float, float]:
    """(chromium PSS MB, python RSS MB) right now."""
    import os
    return sum(_pss_kb(p) for p in chromium_pids()) / 1024, _rss_kb(os.getpid()) / 1024


def _percentile(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def _target(target: str, episodes: int, seed: int, sites_workers: str = "process"):
    """(tasks, policy, hooks, stop) for a target."""
    if target == "miniwob":
        from webrl_core.env.miniwob import ORACLE_TASKS, MiniWoBHooks, MiniWoBOracle, MiniWoBServer, miniwob_tasks
        srv = MiniWoBServer().start()
        per = -(-episodes // len(ORACLE_TASKS))
        tasks = miniwob_tasks(list(ORACLE_TASKS), per, seed)
        return tasks, MiniWoBOracle(), MiniWoBHooks(srv), srv.stop
    if target == "embedded":
        from webrl_core.sites import EmbeddedSites, OraclePolicy, test_set
        sites = EmbeddedSites(data_seed=0, workers=sites_workers).start()
        tasks = test_set(0)
        return tasks, OraclePolicy(), sites, sites.stop
    raise ValueError(f"unknown bench target {target!r}; allowed: miniwob, embedded")


async def _measure(tasks, policy, hooks, n_envs: int, episodes: int, cfg) -> dict:
    cfg = cfg.model_copy(update={"n_envs": n_envs})
    peak = {"pss": 0.0, "rss": 0.0}
    stop = asyncio.Event()

    async def sampler():
        # smaps_rollup of every Chromium process costs ~10 ms of kernel time: off the event loop, once a second
        # (at 4 Hz on the loop it blocked the rollout for a quarter of the measured time)
        while not stop.is_set():
            pss, rss = await asyncio.to_thread(memory_mb)
            peak["pss"], peak["rss"] = max(peak["pss"], pss), max(peak["rss"], rss)
            try:
                await asyncio.wait_for(stop.wait(), 1.0)
            except asyncio.TimeoutError:
                pass

    def pick(start: int, n: int) -> list[dict]:
        return [dict(tasks[(start + i) % len(tasks)]) for i in range(n)]

    async with BrowserPool(cfg) as pool:
        smp = asyncio.create_task(sampler())
        await rollout(pick(0, n_envs), policy, n_envs, cfg=cfg, hooks=hooks, pool=pool, progress=False,
                      purpose="bench-warmup")
        t0 = time.perf_counter()
        eps = await rollout(pick(n_envs, episodes), policy, n_envs, cfg=cfg, hooks=hooks, pool=pool,
                            progress=False, purpose="bench")
        wall = time.perf_counter() - t0
        stop.set()
        await smp
    steps = [s for e in eps for s in e["steps"]]
    obs = [s["obs_s"] for s in steps]
    return {"n_envs": n_envs, "episodes": len(eps), "steps": len(steps), "wall_s": wall,
            "steps_per_s": len(steps) / wall if wall > 0 else 0.0,
            "episodes_per_s": len(eps) / wall if wall > 0 else 0.0,
            "obs_p50_ms": 1000 * _percentile(obs, 0.5), "obs_p95_ms": 1000 * _percentile(obs, 0.95),
            "action_p50_ms": 1000 * (statistics.median([s["action_s"] for s in steps]) if steps else float("nan")),
            "success": sum(bool(e["success"]) for e in eps) / max(1, len(eps)),
            "errors": sum(e["status"] == "error" for e in eps),
            "chromium_pss_mb": peak["pss"], "python_rss_mb": peak["rss"]}


def bench_rollout(target: str = "miniwob", n_envs_list: list[int] = (1, 4, 8, 16), episodes: int = 40,
                  cfg=None, seed: int = 0, on_row=None, sites_workers: str = "process") -> list[dict]:
    """One row per n_envs (see module docstring)."""
    from webrl_core.config import EnvConfig
    cfg = cfg or EnvConfig()
    tasks, policy, hooks, stop = _target(target, episodes + max(n_envs_list), seed, sites_workers)
    rows = []
    try:
        for n in n_envs_list:
            row = asyncio.run(_measure(tasks, policy, hooks, n, episodes, cfg))
            row["target"] = target
            rows.append(row)
            if on_row:
                on_row(row)
    finally:
        stop()
    return rows

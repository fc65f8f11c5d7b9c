"""`webrl bench store`: append rate and replay-query latency of the trajectory store.

Writes N synthetic steps (default 1,000,000) with realistic 2-4 KB simplified-HTML observations, in
episodes of 5-15 steps spread over phases, ~30% successful, through ``TrajectoryStore.write_episodes``
(the same path rollouts use), then times the replay query (successful steps of phases < k) three ways:
ids only, ids + prompt/response materialised as Arrow, and the per-site success-rate query.
"""

from __future__ import annotations

import random
import shutil
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from webrl_core.prompts import build_prompt
from webrl_core.runs.store import TrajectoryStore
from webrl_core.websites import SITES

_WORDS = ("red blue green compact wireless organic leather steel vintage smart classic portable deluxe mini "
          "shoe lamp chair phone cable bottle jacket watch kettle speaker notebook pillow blender camera").split()


def _page(rng: random.Random, size: int) -> str:
    parts = ['<html><body><nav><a id="0">Home</a><a id="1">Cart</a><input id="2" type="text" placeholder="Search">'
             '<button id="3">Search</button></nav><main><h1>Results</h1><ul>']
    i = 4
    while sum(map(len, parts)) < size:
        name = " ".join(rng.choice(_WORDS) for _ in range(3)).title()
        parts.append(f'<li><a id="{i}">{name}</a><span>${rng.randint(3, 900)}.{rng.randint(0, 99):02d}</span>'
                     f'<span>{rng.randint(1, 5)} stars, {rng.randint(0, 999)} reviews</span></li>')
        i += 1
    parts.append("</ul></main></body></html>")
    return "".join(parts)


def run(n_steps: int = 1_000_000, phases: int = 5, batch_episodes: int = 2000, out: str | None = None,
        keep: bool = False, seed: int = 0) -> dict:
    console = Console()
    rng = random.Random(seed)
    pool = [_page(rng, rng.randint(2048, 4096)) for _ in range(400)]
    root = Path(out) if out else Path(tempfile.mkdtemp(prefix="webrl-bench-store-"))
    store = TrajectoryStore(root)
    written, ep_i, write_s = 0, 0, 0.0
    with Progress(console=console, transient=True) as prog:
        bar = prog.add_task("writing steps", total=n_steps)
        while written < n_steps:
            items = []
            for _ in range(batch_episodes):
                if written >= n_steps:
                    break
                n = min(rng.randint(5, 15), n_steps - written)
                phase = ep_i % phases
                intent = f"Find the cheapest {rng.choice(_WORDS)} {rng.choice(_WORDS)} (#{ep_i})"
                ep = {"episode_id": f"ep{ep_i:08d}", "task_id": f"t{ep_i % 50000}", "phase": phase,
                      "policy_id": "bench", "purpose": "rollout", "status": "done", "success": rng.random() < 0.3,
                      "n_steps": n, "intent": intent, "site": rng.choice(SITES), "seed": 0}
                past, steps = [], []
                for t in range(n):
                    html = f'<div data-step="{t}" data-ep="{ep_i}">' + rng.choice(pool) + "</div>"
                    resp = f'# Element: the item\ndo(action="Click", element="{rng.randint(0, 40)}")'
                    steps.append({"prompt": build_prompt(intent, past, html), "html": html, "response": resp,
                                  "action": '{"name": "Click"}', "url": "http://127.0.0.1/x", "reward": 0.0,
                                  "done": t == n - 1})
                    past.append(resp)
                items.append((ep, steps))
                written += n
                ep_i += 1
            t0 = time.perf_counter()
            store.write_episodes(items)
            write_s += time.perf_counter() - t0
            prog.update(bar, completed=written)
    k = phases - 1
    timings = {}
    for label, q, params in [
        ("replay ids (successful steps, phase < k)",
         "SELECT s.episode_id, s.idx FROM steps s JOIN episodes e USING (episode_id) WHERE e.success AND e.phase < $k",
         {"k": k}),
        # the replay stage's own query (TrajectoryStore.successful_steps), every lineage: no policy filter
        ("replay rows with prompt+response (Arrow)", TrajectoryStore.REPLAY_SQL, {"phase": k, "lineage": None}),
        ("per-site success rate per phase",
         "SELECT phase, site, avg(CASE WHEN success THEN 1.0 ELSE 0.0 END) FROM episodes GROUP BY ALL", None),
    ]:
        best, rows = float("inf"), 0
        for _ in range(3):
            t0 = time.perf_counter()
            tab = store.arrow(q, params)
            best = min(best, time.perf_counter() - t0)
            rows = tab.num_rows
        timings[label] = (best, rows)
    size_mb = sum(p.stat().st_size for p in store.root.rglob("*.parquet")) / 1e6
    table = Table(title=f"webrl bench store: {written:,} steps, {ep_i:,} episodes, {phases} phases")
    table.add_column("measure")
    table.add_column("value", justify="right")
    table.add_row("append rate (steps/s, incl. parquet+zstd)", f"{written / write_s:,.0f}")
    table.add_row("append time (s)", f"{write_s:.1f}")
    table.add_row("parquet size (MB)", f"{size_mb:.1f}")
    for label, (sec, rows) in timings.items():
        table.add_row(f"{label}: {rows:,} rows (s, best of 3)", f"{sec:.3f}")
    console.print(table)
    if not keep and not out:
        shutil.rmtree(root, ignore_errors=True)
    return {"steps": written, "episodes": ep_i, "append_steps_per_s": written / write_s, "size_mb": size_mb,
            **{k: v[0] for k, v in timings.items()}}

"""`webrl bench temperature`: how often an actor solves unseen training-pool tasks at each sampling temperature,
so ``policy.temperature`` (the training rollouts' temperature) is chosen by measurement.

A phase learns only from the successes of its own rollouts, and the curriculum aims at tasks the actor solves
sometimes (the critic band of the WebRL paper, arXiv 2411.02337, Sec. 3.2: values in [0.05, 0.75]). Sampling
hotter than the actor can bear turns a solvable task into a failure; greedy gives no spread across samples. For
each temperature T in the sweep, the actor rolls out ``samples`` attempts of each of ``val_tasks`` validation tasks
(the training pool, intents unlike the demonstrations'; never the held-out test set;
``benchmarks.sft.validation_tasks``) and the sites' evaluators score them:

    solve_rate(T) = (1 / (N * K)) * sum_{i <= N, k <= K} success(tau_{i,k} ~ pi_T)
    solved_sometimes(T) = share of tasks with 0 < successes < K        (only with K >= 2)

with its standard error sqrt(p (1 - p) / (N K)). Episodes are stored in the bench run dir, keyed by the actor and T
(``webrl_core.identity``), so a re-run reuses them.
"""

from __future__ import annotations

import math
import time
from pathlib import Path


def sweep(settings, bench_dir: str, actor_dir: Path, temperatures: list[float], val_ref, samples: int) -> list[dict]:
    """One row per temperature: solved, episodes, solve rate and its standard error, tasks solved sometimes."""
    from webrl_core.artifacts import ArtifactRef, read_json, write_json
    from webrl_core.pipeline import experience
    from webrl_core.runs.store import TrajectoryStore

    tasks = read_json(val_ref)
    if samples > 1:  # duplicates of a task are its samples (attempt numbers, env.rollout.default_attempts)
        tasks = [t for t in tasks for _ in range(samples)]
        val_ref = write_json(tasks, Path(bench_dir) / "tasks" / f"bench_temperature_{len(tasks)}x.json")
    actor = ArtifactRef.of(actor_dir, "model")
    rows = []
    for temp in temperatures:
        t0 = time.perf_counter()
        roll = experience.rollout(settings, bench_dir, 0, "eval", val_ref, actor, temp)
        eps = TrajectoryStore(bench_dir).sql(
            "SELECT task_id, success, n_steps FROM episodes WHERE episode_id IN (SELECT unnest($ids))",
            {"ids": roll["episode_ids"]})
        per_task: dict[str, list[bool]] = {}
        for e in eps:
            per_task.setdefault(str(e["task_id"]), []).append(bool(e["success"]))
        n = len(eps)
        p = roll["env_success"] / max(1, n)
        rows.append({"temperature": temp, "solved": roll["env_success"], "episodes": n, "tasks": len(per_task),
                     "solve_rate": round(p, 4), "stderr": round(math.sqrt(p * (1 - p) / max(1, n)), 4),
                     "solved_sometimes": (round(sum(0 < sum(v) < len(v) for v in per_task.values())
                                                / max(1, len(per_task)), 4) if samples > 1 else None),
                     "mean_steps": round(sum(e["n_steps"] or 0 for e in eps) / max(1, n), 2),
                     "errors": roll["errors"], "wall_s": round(time.perf_counter() - t0, 1),
                     "episode_ids": roll["episode_ids"]})
    return rows


def plot(rows: list[dict], path: Path, title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from benchmarks.publish import save_figure

    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    xs = [r["temperature"] for r in rows]
    ys = [100 * r["solve_rate"] for r in rows]
    ax.errorbar(xs, ys, yerr=[100 * r["stderr"] for r in rows], marker="o", capsize=3, label="tasks solved")
    ax.axhspan(15, 60, color="tab:green", alpha=0.1, label="15-60%")
    ax.set_xlabel("sampling temperature")
    ax.set_ylabel("% of episodes solved")
    ax.set_title(title, fontsize=8)
    ax.legend(fontsize=8)
    return save_figure(fig, path)


def run(settings, actor: str | None, run_dir: str | None, bench_dir: str, demos: int, val_tasks: int,
        temperatures: list[float], samples: int, out: str | Path) -> list[dict]:
    """Sweep the actor (``actor`` folder, or ``run_dir``'s phase-0 actor); write OUT.json, OUT.png, an MLflow
    run in the bench dir; print the table."""
    from webrl_core.artifacts import read_json
    from benchmarks.publish import publish
    from benchmarks.sft import demo_tasks, validation_tasks
    from webrl_core.errors import MissingInput
    from webrl_core.hardware import cpu_summary

    if not temperatures or any(t < 0 for t in temperatures):
        raise ValueError(f"bench temperature: --temperatures must be non-negative numbers, got {temperatures}")
    if samples < 1:
        raise ValueError(f"bench temperature: --samples must be >= 1, got {samples}")
    actor_dir = Path(actor) if actor else Path(run_dir or "") / "models" / "phase=0" / "actor"
    if not (actor_dir / "config.json").is_file():
        raise MissingInput(f"bench temperature: {actor_dir} is not a Hugging Face model folder (no config.json); "
                           "name a checkpoint (--model) or a run whose SFT actor is published (--run)")
    demo_intents = {t["intent"] for t in read_json(demo_tasks(settings, bench_dir, demos))}
    val_ref = validation_tasks(settings, bench_dir, val_tasks, demo_intents)
    rows = sweep(settings, bench_dir, actor_dir, temperatures, val_ref, samples)
    result = {"cpu": cpu_summary(), "actor": str(actor_dir), "val_tasks": val_tasks, "samples": samples,
              "rows": rows}
    publish(result, out, lambda png: plot(rows, png, f"{actor_dir.name}: {val_tasks} validation tasks x {samples}, "
                                                     f"{result['cpu']}"),
            bench_dir, f"temperature {actor_dir.name}", settings,
            [(int(round(100 * r["temperature"])), {"solve_rate": r["solve_rate"], "temperature": r["temperature"]})
             for r in rows], "temperature")
    _print(result)
    return rows


def _print(result: dict) -> None:
    from benchmarks.publish import print_table

    def sometimes(r: dict) -> str:
        return "-" if r["solved_sometimes"] is None else f"{100 * r['solved_sometimes']:.0f}%"

    print_table(f"webrl bench temperature: {result['val_tasks']} validation tasks x {result['samples']} "
                f"({result['cpu']})", ("T", "solved", "rate", "+-", "solved sometimes", "mean steps", "s"),
                ((f"{r['temperature']:g}", f"{r['solved']}/{r['episodes']}", f"{100 * r['solve_rate']:.1f}%",
                  f"{100 * r['stderr']:.1f}", sometimes(r), f"{r['mean_steps']:.1f}", f"{r['wall_s']:.0f}")
                 for r in result["rows"]))

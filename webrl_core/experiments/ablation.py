"""The paper's ablation (Fig. 5): WebRL against WebRL without the replay buffer and without both the KL-constrained
update and the replay buffer, over several phases and seeds, all variants starting from one shared bootstrap.

Variants are config overrides (``VARIANTS``): ``replay.enabled: false`` drops the perplexity-filtered replay;
``actor.kl: false`` replaces the KL-constrained objective (paper Eq. 4-5) by plain fine-tuning on the same data.
Each variant runs in its own run dir, ``<ablation dir>/seed=<s>/<variant>``, whose phase 0 is a fork of
``<ablation dir>/seed=<s>/bootstrap`` (``fork_bootstrap``): the same SFT actor, critic and ORM, the same phase-0
episodes, so every difference between the lines comes from the phases. The result is the held-out test success
of every (variant, seed, phase); the plot draws the mean over seeds per variant with the seeds' range as a band.
An existing run's phase 0 can stand in for the per-seed bootstrap (``check_shared_bootstrap``): one seed, the run's
own, and the same held-out evaluation, whose phase-0 result is every line's first point.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from webrl_core.errors import BadInput

if TYPE_CHECKING:
    from webrl_core.config import WebRLSettings

VARIANTS: dict[str, list[str]] = {
    "webrl": [],
    "no-replay": ["replay.enabled=false"],
    "no-kl-no-replay": ["replay.enabled=false", "actor.kl=false"],
}
"""Variant name -> the overrides that make it (paper Fig. 5: WebRL, w/o replay buffer, w/o KL and replay)."""

FORK_MARK = "forked_from.json"
PHASE0_FILES = ("eval/phase=0.json", "reports/phase=0.json", "tasks/test.json")


class ForkError(BadInput):
    """A variant's run dir holds a phase 0 other than the bootstrap it should share."""


def ablation_dir(settings: "WebRLSettings", run_dir: str | Path | None = None) -> Path:
    """The ablation's folder: ``run_dir`` if given, else ``<run.root>/<run.name>-ablate``; absolute."""
    from webrl_core.runs.rundir import run_dir_of

    return Path(run_dir).resolve() if run_dir else Path(f"{run_dir_of(settings)}-ablate")


def variant_overrides(name: str) -> list[str]:
    """The overrides of a known variant, or of a recipe (``recipes.RECIPES``: grpo, pae; compared from the same
    start); ValueError naming the known ones otherwise."""
    from webrl_core.experiments.recipes import RECIPES, recipe_overrides

    if name in VARIANTS:
        return list(VARIANTS[name])
    if name in RECIPES:
        return recipe_overrides(name)
    raise ValueError(f"unknown ablation variant {name!r}; known: {', '.join(VARIANTS)}; recipes: "
                     f"{', '.join(RECIPES)}")


def _phase0_models(run_dir: Path) -> dict[str, Path]:
    """Published phase-0 models (and the tokenizer) of a run: name -> resolved folder."""
    out = {}
    for link in sorted((run_dir / "models" / "phase=0").glob("*")):
        if not link.name.startswith("."):
            out[f"phase=0/{link.name}"] = link.resolve()
    tok = run_dir / "models" / "tokenizer"
    if tok.exists():
        out["tokenizer"] = tok.resolve()
    return out


def check_shared_bootstrap(bootstrap_dir: str | Path, settings: "WebRLSettings", seeds: list[int]) -> None:
    """Refuse (``ForkError``, naming the field) an existing run as the bootstrap of an ablation it does not fit: it
    needs a phase-0 actor and its resolved ``config.yaml``, exactly one seed equal to its ``run.seed``, and the same
    ``eval`` section as the ablation's config (its phase-0 evaluation is every variant's phase-0 point)."""
    from webrl_core.config_loader import load_config

    src = Path(bootstrap_dir)
    cfg_file = src / "config.yaml"
    if not (src / "models" / "phase=0" / "actor").exists() or not cfg_file.is_file():
        raise ForkError(f"--bootstrap {src}: no phase-0 actor or no config.yaml there; run its bootstrap first")
    boot = load_config(cfg_file)
    if list(seeds) != [boot.run.seed]:
        raise ForkError(f"--bootstrap {src}: its run.seed is {boot.run.seed}, so the ablation runs that one seed "
                        f"(--seeds {boot.run.seed}), not {','.join(map(str, seeds))}")
    ours, theirs = settings.eval.model_dump(), boot.eval.model_dump()
    for key in ours:
        if ours[key] != theirs.get(key):
            raise ForkError(f"--bootstrap {src}: eval.{key} is {theirs.get(key)!r} in {cfg_file} but "
                            f"{ours[key]!r} in the ablation's config; phase 0 and the phases would be scored on "
                            f"different test sets")


def fork_bootstrap(bootstrap_dir: str | Path, run_dir: str | Path) -> dict:
    """Give ``run_dir`` the phase 0 of ``bootstrap_dir``: links to its published models, its phase-0 episodes,
    steps and tasks in the store, its phase-0 evaluation and report. Idempotent; a run dir forked from a different
    bootstrap (other models) is refused with ``ForkError`` rather than mixed."""
    from webrl_core.artifacts import sha256_path
    from webrl_core.runs.store import SCHEMAS, TrajectoryStore

    src, dst = Path(bootstrap_dir).resolve(), Path(run_dir).resolve()
    models = _phase0_models(src)
    if "phase=0/actor" not in models:
        raise ForkError(f"{src} has no phase-0 actor: run its bootstrap first")
    mark = {"bootstrap": str(src), "models": {k: sha256_path(p) for k, p in models.items()}}
    mark_file = dst / FORK_MARK
    if mark_file.exists():
        old = json.loads(mark_file.read_text())
        if old["models"] != mark["models"]:
            raise ForkError(f"{dst} was forked from another phase 0 ({old['bootstrap']}); its phases would mix two "
                            f"bootstraps: use a new ablation dir, or delete {dst}")
        return old
    for name, target in models.items():  # a fork cut short is completed; a run dir with other models is refused
        link = dst / "models" / name
        if link.is_symlink() or link.exists():
            if link.resolve() != target:
                raise ForkError(f"{dst} already holds a {name} of its own ({link.resolve()}): not a fresh variant dir")
            continue
        link.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(os.path.relpath(target, link.parent), link)
    for rel in PHASE0_FILES:
        if (src / rel).exists():
            (dst / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src / rel, dst / rel)
    if (src / "tasks" / "phase=0").is_dir():
        shutil.copytree(src / "tasks" / "phase=0", dst / "tasks" / "phase=0", dirs_exist_ok=True)
    store_in, store_out = TrajectoryStore(src), TrajectoryStore(dst)

    def own(table: str, rows: list[dict]) -> list[dict]:  # the table's columns, not the views' bookkeeping
        names = set(SCHEMAS[table].names)
        return [{k: v for k, v in r.items() if k in names} for r in rows]

    episodes = own("episodes", store_in.episodes(phase=0))
    steps: dict[str, list[dict]] = {}
    for s in own("steps", store_in.steps(phase=0)):
        steps.setdefault(s["episode_id"], []).append(s)
    store_out.write_episodes([(e, steps.get(e["episode_id"], [])) for e in episodes])
    store_out.write_tasks(own("tasks", store_in.tasks(phase=0)))
    mark_file.write_text(json.dumps(mark, indent=1))
    return mark


def success_by_phase(run_dir: str | Path) -> dict[int, float]:
    """Held-out test success rate per phase of a run (``eval/phase=<k>.json``)."""
    from webrl_core.runs.report import results_table

    return {r["phase"]: r["avg"] for r in results_table(run_dir) if r["label"] == "SFT (bootstrap)"
            or r["label"].startswith("WebRL phase")}


def ablation_rows(root: str | Path, seeds: list[int], variants: list[str]) -> list[dict]:
    """[{variant, seed, phase, success}] of every variant run under ``root``."""
    rows = []
    for seed in seeds:
        for v in variants:
            for phase, rate in sorted(success_by_phase(Path(root) / f"seed={seed}" / v).items()):
                rows.append({"variant": v, "seed": seed, "phase": phase, "success": rate})
    return rows


def summarise(rows: list[dict]) -> list[dict]:
    """Per (variant, phase): mean, min and max success over seeds, and how many seeds."""
    groups: dict[tuple[str, int], list[float]] = {}
    for r in rows:
        if r["success"] is not None:
            groups.setdefault((r["variant"], r["phase"]), []).append(r["success"])
    return [{"variant": v, "phase": p, "mean": sum(xs) / len(xs), "min": min(xs), "max": max(xs), "seeds": len(xs)}
            for (v, p), xs in sorted(groups.items(), key=lambda kv: (list(VARIANTS).index(kv[0][0])
                                                                     if kv[0][0] in VARIANTS else 99, kv[0][1]))]


def markdown(summary: list[dict]) -> str:
    """Variants as rows, phases as columns: mean % (min-max over seeds); a cell with fewer seeds than the others
    (a seed's run stopped earlier) says how many."""
    phases = sorted({s["phase"] for s in summary})
    n_seeds = max((s["seeds"] for s in summary), default=0)
    head = "| variant | " + " | ".join("SFT" if p == 0 else f"phase {p}" for p in phases) + " |"
    lines = [head, "|---|" + "---|" * len(phases)]
    for v in dict.fromkeys(s["variant"] for s in summary):
        cells = []
        for p in phases:
            s = next((x for x in summary if x["variant"] == v and x["phase"] == p), None)
            cells.append("" if s is None else f"{100 * s['mean']:.1f} ({100 * s['min']:.1f}-{100 * s['max']:.1f})"
                         + (f" [{s['seeds']} of {n_seeds} seeds]" if s["seeds"] < n_seeds else ""))
        lines.append(f"| {v} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def stops_markdown(stops: list[dict]) -> str:
    """One line per (variant, seed) that stopped before the last phase: where and why (empty when none did)."""
    if not stops:
        return ""
    lines = [f"- {s['variant']}, seed {s['seed']}: stopped at phase {s['phase']} ({s['reason']})" for s in stops]
    return "\nStopped runs (their later phases are missing from the table):\n\n" + "\n".join(lines) + "\n"


def fig5_order(summary: list[dict], variants: list[str] | None = None) -> str:
    """Whether the last phase orders the variants as the paper's Fig. 5 (WebRL > w/o replay > w/o KL and replay).
    ``variants``: the ones the ablation was asked to run (default all); without all three there is no order to
    check, which is said as such rather than as a variant that fell short."""
    asked = list(VARIANTS) if variants is None else list(variants)
    if not all(v in asked for v in VARIANTS):
        return f"Fig. 5's order not checked: it needs {', '.join(VARIANTS)}; this ablation ran {', '.join(asked)}"
    last = max((s["phase"] for s in summary), default=0)
    means = {s["variant"]: s["mean"] for s in summary if s["phase"] == last}
    if not all(v in means for v in VARIANTS):
        missing = ", ".join(v for v in VARIANTS if v not in means)
        return f"incomplete: {missing} did not reach phase {last}"
    order = sorted(VARIANTS, key=lambda v: -means[v])
    holds = means["webrl"] > means["no-replay"] > means["no-kl-no-replay"]
    text = f"{order[0]} {100 * means[order[0]]:.1f}%"
    for a, b in zip(order, order[1:]):  # ties shown as ties
        text += f" {'>' if means[a] > means[b] else '='} {b} {100 * means[b]:.1f}%"
    return f"phase {last}: {text}; Fig. 5's order " + ("holds" if holds else "does not hold")


def plot(summary: list[dict], path: str | Path) -> Path:
    """Success per phase, one line per variant (mean over seeds), the seeds' range as a band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for v in dict.fromkeys(s["variant"] for s in summary):
        pts = [s for s in summary if s["variant"] == v]
        xs = [s["phase"] for s in pts]
        ax.plot(xs, [100 * s["mean"] for s in pts], marker="o", label=v)
        ax.fill_between(xs, [100 * s["min"] for s in pts], [100 * s["max"] for s in pts], alpha=0.2)
    ax.set_xticks(sorted({s["phase"] for s in summary}))  # phases are whole numbers; no 0.5 ticks
    ax.set_xlabel("phase (0 = SFT bootstrap)")
    ax.set_ylabel("test success (%)")
    ax.set_title("WebRL ablation (mean over seeds, band = range)")
    ax.legend()
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path

"""Recipes side by side from one start (``webrl ablate --variants webrl,grpo,pae``): beyond the ablation's success
table and plot, what a reader needs to choose a recipe.

- **cost per phase**: wall time (``phase_wall_s``, as first measured), rollout episodes and tokens trained (actor and
  critic), from each phase's report (``reports/phase=k.json``);
- **per site**: test success per site at the last phase, mean over seeds, beside the start's;
- **paired**: per seed, the test tasks each recipe lost and gained against the start and against every other recipe
  at the last phase, with the exact sign test (``pipeline.compare``); the gained tasks are counted per site, which
  says which recipe solves GitLab and reddit tasks the start fails.
"""

from __future__ import annotations

import json
from itertools import combinations
from pathlib import Path

from webrl_core.websites import SITES

COST_KEYS = {"wall_s": ("phase_wall_s",), "episodes": ("rollout_episodes",),
             "tokens_trained": ("actor_tokens", "critic_tokens")}
"""Cost column -> the phase report's metrics summed into it."""


def _report(run_dir: Path, phase: int) -> dict | None:
    f = run_dir / "reports" / f"phase={phase}.json"
    return json.loads(f.read_text()) if f.is_file() else None


def last_phase(run_dir: Path) -> int:
    """The last phase a run evaluated (0: only the start)."""
    phases = [int(p.stem.split("=", 1)[1]) for p in (run_dir / "eval").glob("phase=*.json")]
    return max(phases, default=0)


def cost_rows(root: str | Path, seeds: list[int], variants: list[str]) -> list[dict]:
    """[{variant, seed, phase, wall_s, episodes, tokens_trained}] of every finished phase >= 1."""
    rows = []
    for seed in seeds:
        for v in variants:
            run = Path(root) / f"seed={seed}" / v
            for k in range(1, last_phase(run) + 1):
                rep = _report(run, k)
                if rep is None:
                    continue
                row = {"variant": v, "seed": seed, "phase": k}
                for col, keys in COST_KEYS.items():
                    vals = [rep[x] for x in keys if isinstance(rep.get(x), (int, float))]
                    row[col] = sum(vals) if vals else None
                rows.append(row)
    return rows


def cost_markdown(rows: list[dict]) -> str:
    """One line per (variant, phase): the mean over seeds of each cost."""
    groups: dict[tuple[str, int], list[dict]] = {}
    for r in rows:
        groups.setdefault((r["variant"], r["phase"]), []).append(r)
    lines = ["| recipe | phase | wall time (min) | rollout episodes | tokens trained | seeds |", "|---|---|---|---|---|---|"]
    for (v, k), rs in groups.items():
        def mean(col, scale=1.0, digits=0):
            xs = [r[col] for r in rs if r[col] is not None]
            return f"{sum(xs) / len(xs) / scale:,.{digits}f}" if xs else "-"
        lines.append(f"| {v} | {k} | {mean('wall_s', 60, 1)} | {mean('episodes')} | {mean('tokens_trained')} | "
                     f"{len(rs)} |")
    return "\n".join(lines) + "\n"


def site_markdown(root: str | Path, seeds: list[int], variants: list[str]) -> str:
    """Test success per site (%), mean over seeds: the start (every variant forks the same phase 0), then each
    recipe at its last phase."""
    from webrl_core.runs.report import results_table

    def row_of(run: Path, phase: int) -> dict | None:
        if not run.is_dir():
            return None
        return next((r for r in results_table(run) if r["phase"] == phase and "policy_digest" in r
                     and not r["label"].startswith("model")), None)

    lines = ["| | " + " | ".join(SITES) + " | all |", "|---|" + "---|" * (len(SITES) + 1)]
    entries = [("start (phase 0)", [row_of(Path(root) / f"seed={s}" / variants[0], 0) for s in seeds])]
    for v in variants:
        runs = [Path(root) / f"seed={s}" / v for s in seeds]
        entries.append((v, [row_of(run, last_phase(run)) for run in runs if run.is_dir()]))
    for name, rows in entries:
        rows = [r for r in rows if r is not None]
        if not rows:
            continue
        cells = []
        for key in (*SITES, "avg"):
            xs = [r[key] for r in rows if isinstance(r.get(key), (int, float))]
            cells.append(f"{100 * sum(xs) / len(xs):.1f}" if xs else "-")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def paired_rows(root: str | Path, seeds: list[int], variants: list[str]) -> list[dict]:
    """Per seed: each recipe's last phase against the start, and every pair of recipes at their last phases:
    lost, gained, the sign test's p, and the gained tasks per site."""
    from webrl_core.pipeline.compare import compare

    rows = []
    for seed in seeds:
        evals = {}
        for v in variants:
            run = Path(root) / f"seed={seed}" / v
            k = last_phase(run) if run.is_dir() else 0
            if k:
                evals[v] = (run / "eval" / "phase=0.json", run / "eval" / f"phase={k}.json", k)
        pairs = [(f"start -> {v}", start, last) for v, (start, last, _) in evals.items()]
        pairs += [(f"{a} -> {b}", evals[a][1], evals[b][1]) for a, b in combinations(evals, 2)]
        for name, a_file, b_file in pairs:
            c = compare(a_file, b_file)
            by_site: dict[str, int] = {}
            for _, y in c.gained:
                by_site[y.site] = by_site.get(y.site, 0) + 1
            rows.append({"seed": seed, "pair": name, "lost": len(c.lost), "gained": len(c.gained),
                         "p": c.p_value, "gained_by_site": by_site, "solved": c.solved})
    return rows


def paired_markdown(rows: list[dict]) -> str:
    """One line per (seed, pair)."""
    lines = ["| seed | comparison | solved (A -> B) | lost | gained | sign test p | gained per site |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        sites = ", ".join(f"{s} {n}" for s, n in sorted(r["gained_by_site"].items())) or "-"
        lines.append(f"| {r['seed']} | {r['pair']} | {r['solved'][0]} -> {r['solved'][1]} | {r['lost']} | "
                     f"{r['gained']} | {r['p']:.3g} | {sites} |")
    return "\n".join(lines) + "\n"


def report_markdown(root: str | Path, seeds: list[int], variants: list[str]) -> str:
    """The comparison's sections (cost, per site, paired) as markdown."""
    return ("\n## Cost per phase (mean over seeds)\n\n" + cost_markdown(cost_rows(root, seeds, variants))
            + "\n## Test success per site (%), mean over seeds\n\n" + site_markdown(root, seeds, variants)
            + "\n## Tasks lost and gained (paired by test task)\n\n" + paired_markdown(paired_rows(root, seeds, variants)))

"""`webrl bench next-action`: greedy next-action accuracy of trained actors -- each phase's actor of a run
(``<run_dir>/models/phase=k/actor``, k = 0 the SFT start) and any named checkpoint folders -- on the same
validation steps, so a reader sees whether a WebRL phase kept, lifted or undid what the start knew before paying
for a test-set evaluation.

The steps are ``bench sft-curve``'s (oracle steps of validation tasks of the training pool whose intents are not
among the demonstrations'; never the held-out test set), collected once in a bench run dir and reused; each
actor answers every step greedily in the configured ``prompt.*`` format and is marked as there
(``sft_curve.score``): for a phase k and a validation step i with oracle action a_i and greedy response r_i,

    exact_k = (1/N) * sum_i [parse(r_i) == parse(a_i)]        (action, element id, argument and answer)

and likewise ``element`` (the id, on steps that act on an element), ``typed_args`` (Type/Search/Select),
``well_formed``, ``stops`` (an exit where the oracle exits) and ``grounding`` (the id, on the steps where the
response names the oracle's element). A phase that undoes the start shows as exact_k < exact_0 by more than the
sampling noise (about sqrt(p(1-p)/N): +-4.5 points at p = 0.6, N = 120). The marks are also reported per site of
the steps' tasks (``by_site``; MLflow ``exact_<site>``, ``grounding_<site>``): a start that passes on average can
still miss one site's pages, as the 2-epoch entity-swap starts ground the reddit clone's forum list
(docs/notebook/grounding.md).
"""

from __future__ import annotations

import random
import time
from pathlib import Path

from benchmarks.sft_curve import MARKS, collect, plot_marks, score, share_of, summarise

SITE_MARKS = ("exact", "grounding")
"""The marks logged per site (``exact_<site>``, ``grounding_<site>``) beside the overall ones."""


def run_actors(run_dir: str | Path) -> list[tuple[str, Path]]:
    """(label, folder) of every phase's published actor of a run, phase 0 (the SFT start) first."""
    found = []
    for d in (Path(run_dir) / "models").glob("phase=*"):
        actor = d / "actor"
        if actor.is_dir() and (actor / "config.json").is_file():
            found.append((int(d.name.split("=", 1)[1]), actor))
    return [("SFT (phase 0)" if k == 0 else f"phase {k}", a) for k, a in sorted(found)]


def model_labels(folders: list[Path]) -> list[str]:
    """The shortest trailing paths that tell the ``--model`` folders apart: three runs' ``models/phase=1/actor``
    read ``ep2/models/phase=1/actor``, ``beta05/...``, not ``actor`` three times."""
    parts = [Path(f).absolute().parts for f in folders]
    for k in range(1, max((len(p) for p in parts), default=1) + 1):
        labels = ["/".join(p[-k:]) for p in parts]
        if len(set(labels)) == len(labels):
            return labels
    return [str(f) for f in folders]


def validation_steps(settings, bench_dir: str, demos: int, val_tasks: int, n: int) -> list[dict]:
    """``n`` validation steps (sampled with the run seed + 1, so not the curve's own draw)."""
    _, val, _ = collect(settings, bench_dir, demos, val_tasks)
    return random.Random(settings.run.seed + 1).sample(val, min(n, len(val)))


def measure(settings, actor_dir: Path, steps: list[dict]) -> dict:
    """One actor's marks on ``steps`` (greedy, prompts rendered in the actor tokenizer's format)."""
    from webrl_core.agent.policy import HFPolicy
    from webrl_core.learn.models import load_tokenizer
    from webrl_core.prompts import build_prompt, prompt_format

    fmt = prompt_format(settings, load_tokenizer(actor_dir))
    prompts = [build_prompt(s["intent"], s["past"], s["html"], settings.env.obs_char_budget, compat=fmt)
               for s in steps]
    policy = HFPolicy(actor_dir, settings.policy, settings.models, temperature=0.0, style=settings.prompt.style,
                      compat=fmt)
    t0 = time.perf_counter()
    responses = policy.generate(prompts, temperature=0.0)
    marks = [score(r, s["action"]) for r, s in zip(responses, steps)]
    misses = [{"oracle": s["action"], "model": r} for r, s, m in zip(responses, steps, marks) if not m["exact"]]
    return {"actor": str(actor_dir), "steps": len(steps), "eval_s": round(time.perf_counter() - t0, 1),
            **summarise(marks), "by_site": by_site(marks, steps), "misses": misses[:5]}


def by_site(marks: list[dict], steps: list[dict]) -> dict[str, dict]:
    """The marks per site of the steps' tasks: a start can pass on average and still fail one site's pages."""
    groups: dict[str, list[dict]] = {}
    for m, s in zip(marks, steps):
        groups.setdefault(s.get("site") or "unknown", []).append(m)
    return {site: summarise(groups[site]) for site in sorted(groups)}


def run(settings, run_dir: str | None, models: list[str], bench_dir: str, demos: int, val_tasks: int,
        val_steps: int, out: str | Path) -> list[dict]:
    """Mark every phase actor of ``run_dir`` and every folder of ``models``; write OUT.json and OUT.png, log an
    MLflow run in the bench dir, print the table."""
    from rich.progress import track

    from benchmarks.publish import publish
    from webrl_core.errors import MissingInput
    from webrl_core.hardware import cpu_summary

    actors = run_actors(run_dir) if run_dir else []
    if run_dir and not actors:
        raise MissingInput(f"bench next-action: no published actor under {run_dir}/models/phase=*/actor")
    folders = [Path(m) for m in models]
    for m in folders:
        if not (m / "config.json").is_file():
            raise MissingInput(f"bench next-action: --model {m} is not a Hugging Face model folder (no config.json)")
    actors += list(zip(model_labels(folders), folders))
    if not actors:
        raise MissingInput("bench next-action: name a run (--run) or a checkpoint folder (--model)")
    steps = validation_steps(settings, bench_dir, demos, val_tasks, val_steps)
    rows = []
    for label, actor in track(actors, description="next-action"):
        rows.append({"label": label, **measure(settings, actor, steps)})
    result = {"cpu": cpu_summary(), "run_dir": str(run_dir or ""), "val_steps": len(steps), "rows": rows}
    publish(result, out, lambda png: plot_marks(rows, list(range(len(rows))), png,
                                                f"next-action accuracy on {len(steps)} validation steps, "
                                                f"{result['cpu']}", "actor", ticklabels=[r["label"] for r in rows],
                                                width=max(5, 1.2 * len(rows) + 2)),
            bench_dir, f"next-action {Path(run_dir).name if run_dir else 'models'}", settings,
            [(i, {**{k: r[k] for k in MARKS},
                  **{f"{k}_{site}": m[k] for site, m in r["by_site"].items() for k in SITE_MARKS}})
             for i, r in enumerate(rows)], "next-action")
    _print(result)
    return rows


def _print(result: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"webrl bench next-action: {result['val_steps']} validation steps, greedy ({result['cpu']})")
    for col in ("actor", "exact", "element", "typed args", "well-formed", "stops", "id when named", "s"):
        t.add_column(col, justify="right")
    for r in result["rows"]:
        t.add_row(r["label"], f"{100 * r['exact']:.1f}%", f"{100 * r['element']:.1f}%",
                  share_of(r, "typed_args"), f"{100 * r['well_formed']:.1f}%", share_of(r, "stops"),
                  share_of(r, "grounding"), f"{r['eval_s']:.0f}")
    Console().print(t)
    sites = sorted({site for r in result["rows"] for site in r.get("by_site", {})})
    t = Table(title="exact next action per site (element id when named)")
    t.add_column("actor", justify="right")
    for site in sites:
        t.add_column(site, justify="right")
    for r in result["rows"]:
        cells = []
        for site in sites:
            m = r["by_site"].get(site)
            if m is None:
                cells.append("")
            else:
                cells.append(share_of(m, "exact") + (f" (id {share_of(m, 'grounding')})" if m["grounding_n"] else ""))
        t.add_row(r["label"], *cells)
    Console().print(t)

"""`webrl bench orm`: the outcome reward model (ORM) as a data curve -- how many labelled policy episodes an ORM
needs before its YES can stand in for the sites' evaluators.

The WebRL paper (arXiv 2411.02337, Sec. 3.1) trains its ORM on labelled trajectories and lets P(YES) >= 0.5 label
each phase's rollouts. Here the labels come from the sites' evaluators of stored runs: the episodes of
``--train-run`` stores train the ORM (classes balanced as the bootstrap's ``train-orm`` stage balances them,
``pipeline.bootstrap.balance_classes``; nested draws, so a larger point contains every smaller one), from a base
model (by default the first training run's SFT actor, the backbone the bootstrap trains its ORM from), and every
point is scored on the episodes of ``--test-run`` stores that no training point saw. Only policy episodes on
training-pool tasks take part (purposes ``bootstrap``, ``random``, ``rollout``; never ``eval``, the held-out test
set). Test episodes on a task some training episode acted on are left out (``--unseen-tasks``, the default), so
a point measures the ORM on tasks it has not read.

For test episodes with evaluator label y_i and ORM decision d_i = [P(YES)_i >= orm.threshold]:

    accuracy  = (TP + TN) / N          precision = TP / (TP + FP)          recall = TP / (TP + FN)
    AUC       = (1 / (N+ N-)) * sum_{i: y_i} sum_{j: not y_j} ([p_i > p_j] + 1/2 [p_i = p_j])   (Mann-Whitney)

AUC says whether P(YES) ranks successes above failures at all; accuracy and precision say whether the decision
at the threshold can label an update. Each is also given per site of the test episodes (``by_site``), and every
test episode's P(YES) is kept (``p_yes``, aligned with ``test_episode_ids``). Each point's ORM is kept in the
bench dir under a key of what produced it (base model, training episodes, ``orm.*`` and ``models.*`` settings), so
a re-run scores it again without training.
"""

from __future__ import annotations

import hashlib
import json
import random
import shutil
import time
from pathlib import Path

POLICY_PURPOSES = ("bootstrap", "random", "rollout")
"""Episodes of a policy on training-pool tasks: the ones an ORM may learn from and be tested on."""

BAR = {"accuracy": 0.9, "precision": 0.8}
"""Where the ORM may label the update instead of the evaluators (`reward.source: orm`; docs/results.md)."""


def labelled_episodes(run_dirs: list[str | Path], purposes: tuple[str, ...] = POLICY_PURPOSES) -> list[dict]:
    """Finished, evaluator-scored episodes of ``purposes`` in the stores of ``run_dirs`` (one row per episode id,
    the first store's where runs share an episode), each with its ``steps`` in index order and ``label``."""
    from webrl_core.errors import MissingInput
    from webrl_core.runs.store import TrajectoryStore
    from webrl_core.websites import is_success

    seen: dict[str, dict] = {}
    for run_dir in run_dirs:
        if not (Path(run_dir) / "store").is_dir():
            raise MissingInput(f"bench orm: {run_dir} has no store/ (a run dir of `webrl train`, `webrl demo` or "
                               "`webrl ablate`)")
        store = TrajectoryStore(run_dir)
        rows = store.sql("SELECT episode_id FROM episodes WHERE purpose IN (SELECT unnest($p)) AND status != 'error'"
                         " AND env_score IS NOT NULL ORDER BY episode_id", {"p": list(purposes)})
        ids = [r["episode_id"] for r in rows if r["episode_id"] not in seen]
        eps, steps = store.finished_episodes(ids)
        for e in eps:
            if steps.get(e["episode_id"]):
                seen[e["episode_id"]] = {**e, "steps": steps[e["episode_id"]], "label": is_success(e["env_score"]),
                                         "run_dir": str(run_dir)}
    return [seen[k] for k in sorted(seen)]


def nested_balanced(episodes: list[dict], sizes: list[int], seed: int) -> list[list[dict]]:
    """For each size n, n // 2 successes and n // 2 failures, each the first of one seeded shuffle of its class:
    the draws are nested (a larger point holds every smaller one). A size beyond the smaller class is capped at
    twice that class (the point's real size is its list's length)."""
    rng = random.Random(seed)
    yes = [e for e in episodes if e["label"]]
    no = [e for e in episodes if not e["label"]]
    rng.shuffle(yes)
    rng.shuffle(no)
    per_class = min(len(yes), len(no))
    return [sorted(yes[:min(n // 2, per_class)] + no[:min(n // 2, per_class)], key=lambda e: e["episode_id"])
            for n in sizes]


def roc_auc(scores: list[float], labels: list[bool]) -> float:
    """P(a success scores above a failure), ties counting one half (scikit-learn's ROC AUC); NaN with only one
    class."""
    y = [bool(v) for v in labels]
    if all(y) or not any(y):
        return float("nan")
    from sklearn.metrics import roc_auc_score

    return float(roc_auc_score(y, scores))


def agreement(p_yes: list[float], labels: list[bool], threshold: float) -> dict:
    """Accuracy, precision and recall of YES (P(YES) >= threshold) against the labels, the YES rate and AUC."""
    from webrl_core.learn.orm import decision_agreement

    m = decision_agreement([p >= threshold for p in p_yes], labels)
    return {**m, "yes_rate": (m["tp"] + m["fp"]) / m["n"] if m["n"] else float("nan"), "auc": roc_auc(p_yes, labels)}


def point_key(base_sha256: str, train: list[dict], settings) -> str:
    """What a point's ORM is made of: the base model's content digest, the training episodes and their labels, the
    ORM, model and prompt settings (the prompt settings render the examples) and the run seed."""
    blob = json.dumps({"base": base_sha256, "episodes": [e["episode_id"] for e in train],
                       "labels": [e["label"] for e in train], "orm": settings.orm.model_dump(mode="json"),
                       "models": settings.models.model_dump(mode="json"),
                       "prompt": settings.prompt.model_dump(mode="json"), "seed": settings.run.seed},
                      sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def examples(episodes: list[dict], settings, fmt) -> list[dict]:
    """(prompt, YES/NO) pairs in the run's ORM prompt format."""
    from webrl_core.learn.orm import orm_examples_from_episodes

    return orm_examples_from_episodes(episodes, {e["episode_id"]: e["steps"] for e in episodes},
                                      {e["episode_id"]: e["label"] for e in episodes}, settings.orm.max_html_chars,
                                      compat=fmt)


def curve(settings, train_runs: list[str], test_runs: list[str], sizes: list[int], base: str | None,
          bench_dir: str | Path, unseen_tasks: bool = True) -> dict:
    """Train one ORM per size and score each on the test episodes; the result dict ``run`` writes."""
    from webrl_core.artifacts import ArtifactRef
    from webrl_core.errors import MissingInput
    from webrl_core.learn.models import load_tokenizer
    from webrl_core.learn.orm import OrmScorer
    from webrl_core.pretrained import resolve_model_ref
    from webrl_core.prompts import prompt_format
    from webrl_core.scale import launch

    if not train_runs or not test_runs:
        raise MissingInput("bench orm: name at least one --train-run and one --test-run")
    base_dir = Path(resolve_model_ref(base)) if base else Path(train_runs[0]) / "models" / "phase=0" / "actor"
    if not (base_dir / "config.json").is_file():
        raise MissingInput(f"bench orm: base model {base_dir} is not a Hugging Face model folder (no config.json); "
                           "name one with --base")
    train_pool = labelled_episodes(train_runs)
    train_ids = {e["episode_id"] for e in train_pool}
    test_all = [e for e in labelled_episodes(test_runs) if e["episode_id"] not in train_ids]
    points = nested_balanced(train_pool, sizes, settings.run.seed)
    used_tasks = {e["task_digest"] or e["task_id"] for e in points[-1]} if points else set()
    test = [e for e in test_all if not unseen_tasks or (e["task_digest"] or e["task_id"]) not in used_tasks]
    if not points or not points[-1] or not test:
        raise MissingInput(f"bench orm: {len(train_pool)} labelled training episodes "
                           f"({sum(e['label'] for e in train_pool)} solved) and {len(test)} test episodes left: "
                           "need both classes to train and at least one test episode")
    fmt = prompt_format(settings, load_tokenizer(base_dir))
    base_sha = ArtifactRef.of(base_dir, "model").sha256
    test_examples = examples(test, settings, fmt)
    labels = [ex["completion"] == "YES" for ex in test_examples]
    site_of = {e["episode_id"]: e.get("site") or "unknown" for e in test}
    sites: dict[str, list[int]] = {}
    for i, ex in enumerate(test_examples):
        sites.setdefault(site_of[ex["episode_id"]], []).append(i)
    rows, done = [], set()
    for train in points:
        if len(train) in done:  # a size capped to an earlier point's draw is that point
            continue
        done.add(len(train))
        out = Path(bench_dir) / "orm" / point_key(base_sha, train, settings)
        t0 = time.perf_counter()
        trained = (out / "config.json").is_file()
        if not trained:  # trained beside and renamed: a killed training never leaves a folder to reuse
            partial = out.with_name(out.name + ".partial")
            shutil.rmtree(partial, ignore_errors=True)
            launch.train_orm(examples(train, settings, fmt), base_dir, partial, settings.orm, settings.models,
                             seed=settings.run.seed, training=settings.training)
            shutil.rmtree(partial / "_trainer", ignore_errors=True)
            partial.rename(out)
        train_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        p_yes = OrmScorer(out, settings.orm, settings.models).p_yes([ex["prompt"] for ex in test_examples])
        rows.append({"train_episodes": len(train), "train_yes": sum(e["label"] for e in train),
                     "train_s": round(train_s, 1), "reused": trained, "score_s": round(time.perf_counter() - t0, 1),
                     "orm": str(out), **agreement(p_yes, labels, settings.orm.threshold),
                     "by_site": {site: agreement([p_yes[i] for i in idx], [labels[i] for i in idx],
                                                 settings.orm.threshold) for site, idx in sites.items()},
                     "p_yes": [round(p, 5) for p in p_yes]})
    return {"base": str(base_dir), "train_runs": [str(r) for r in train_runs], "test_runs": [str(r) for r in test_runs],
            "train_pool": len(train_pool), "train_pool_yes": sum(e["label"] for e in train_pool),
            "test_episodes": len(test_examples), "test_yes": sum(labels),
            "test_episode_ids": [ex["episode_id"] for ex in test_examples],
            "test_left_out_seen_tasks": len(test_all) - len(test), "threshold": settings.orm.threshold, "rows": rows}


def plot(result: dict, path: Path, title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    from benchmarks.publish import save_figure

    fig, ax = plt.subplots(figsize=(6, 3.8))
    xs = [r["train_episodes"] for r in result["rows"]]
    for key, name in (("accuracy", "accuracy"), ("precision", "precision of YES"), ("recall", "recall of YES"),
                      ("auc", "ROC AUC")):
        ax.plot(xs, [100 * r[key] for r in result["rows"]], marker="o", label=name)
    for i, (key, bar) in enumerate(BAR.items()):
        ax.axhline(100 * bar, color=f"C{i}", linestyle="--", linewidth=0.8, label=f"{key} the ORM must reach")
    ax.axhline(100 * result["test_yes"] / result["test_episodes"], color="gray", linestyle=":", linewidth=0.8,
               label="share of test episodes solved")
    ax.set_xscale("log")
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_xticks(xs, [str(x) for x in xs])
    ax.set_xlabel("training episodes (half solved)")
    ax.set_ylabel(f"% on {result['test_episodes']} test episodes")
    ax.set_ylim(-5, 105)
    ax.set_title(title, fontsize=8)
    ax.legend(fontsize=7)
    return save_figure(fig, path)


def run(settings, train_runs: list[str], test_runs: list[str], sizes: list[int], base: str | None,
        bench_dir: str, out: str | Path, unseen_tasks: bool = True) -> dict:
    """The curve; writes OUT.json and OUT.png, logs an MLflow run in the bench dir, prints the table."""
    from benchmarks.publish import publish
    from webrl_core.hardware import cpu_summary

    if not sizes or any(n < 2 for n in sizes):
        raise ValueError(f"bench orm: --sizes must be training-episode counts >= 2, got {sizes}")
    result = {"cpu": cpu_summary(), **curve(settings, train_runs, test_runs, sorted(sizes), base, bench_dir,
                                            unseen_tasks)}
    publish(result, out, lambda png: plot(result, png, f"ORM against the evaluators on {result['test_episodes']} "
                                                       f"unseen episodes, {result['cpu']}"),
            bench_dir, "orm curve", settings,
            [(r["train_episodes"], {k: r[k] for k in ("accuracy", "precision", "recall", "yes_rate", "auc", "train_s")})
             for r in result["rows"]], "orm")
    _print(result)
    return result


def _print(result: dict) -> None:
    from benchmarks.publish import print_table

    print_table(f"webrl bench orm: {result['test_episodes']} test episodes ({result['test_yes']} solved), "
                f"P(YES) >= {result['threshold']} ({result['cpu']})",
                ("train episodes", "accuracy", "precision", "recall", "YES rate", "AUC", "train s"),
                ((str(r["train_episodes"]), f"{100 * r['accuracy']:.1f}%", f"{100 * r['precision']:.1f}%",
                  f"{100 * r['recall']:.1f}%", f"{100 * r['yes_rate']:.1f}%", f"{r['auc']:.3f}",
                  "reused" if r["reused"] else f"{r['train_s']:.0f}") for r in result["rows"]))
    sites = sorted({site for r in result["rows"] for site in r["by_site"]})

    def cell(m: dict | None) -> str:
        if not m:
            return ""
        said_yes = f"{100 * m['precision']:.0f}%" if m["tp"] + m["fp"] else "no YES"
        return f"{100 * m['accuracy']:.0f}% ({said_yes}) of {m['n']}"

    print_table("per site of the test episodes: accuracy (YES precision)", ("train episodes", *sites),
                ((str(r["train_episodes"]), *(cell(r["by_site"].get(s)) for s in sites)) for r in result["rows"]))

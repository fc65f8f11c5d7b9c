"""Results people look at: the per-site success table (bootstrap vs each phase, like the paper's Table 1),
plots, and their publication to MLflow. The plots, in ``<run_dir>/plots``:

    success_per_site.png   test success per site and on average, bootstrap SFT and each phase
    losses.png             each training's loss against its optimizer steps (SFT, ORM, critic, actor panels)
    curriculum_funnel.png  per phase: generated -> kept by the filter -> kept by review -> rolled out ->
                           solved by the evaluators -> ORM YES, with the kept tasks' solve rate
    orm_agreement.png      the ORM's accuracy, precision and recall of YES against the evaluators per phase

Inputs are files the stages wrote: ``eval/phase=k.json`` (per-site counts), ``reports/phase=k.json``
(the phase's metrics) and the ``loss_history.json`` in each trained model's folder. Success rate per site =
solved / (solved + failed) episodes on the held-out test set; errored and unscored episodes (a task that needs the
LLM judge, and ``eval.judge`` was empty) are counted apart, and the summaries say how many, and when the
deterministic fallback scored fuzzy tasks (``eval.judge: none``).
"""

from __future__ import annotations

import json
from pathlib import Path

from webrl_core.runs import loss_history
from webrl_core.websites import SITE_TITLES, SITES


def _phases(run_dir: str | Path, kind: str) -> list[tuple[int, dict]]:
    out = []
    for p in sorted((Path(run_dir) / kind).glob("phase=*.json"), key=lambda p: int(p.stem.split("=")[1])):
        out.append((int(p.stem.split("=")[1]), json.loads(p.read_text())))
    return out


def _counts(v: dict) -> tuple[int, int, int, int]:
    """(solved, failed, unscored, errored) of an eval entry (files of earlier versions had no 'failed' and no
    'unscored')."""
    errors, unscored = int(v.get("errors", 0)), int(v.get("unscored", 0))
    failed = int(v["failed"]) if "failed" in v else int(v["n"]) - int(v["success"]) - errors - unscored
    return int(v["success"]), failed, unscored, errors


def _row(label: str, phase: int, ev: dict) -> dict:
    row = {"phase": phase, "label": label, "policy_digest": ev.get("policy_digest")}
    for site in SITES:
        v = ev["sites"].get(site)
        ok, bad, _, _ = _counts(v) if v else (0, 0, 0, 0)
        row[site] = ok / (ok + bad) if ok + bad else None
    row["solved"], row["failed"], row["unscored"], row["errored"] = _counts(ev["total"])
    row["avg"] = row["solved"] / max(1, row["solved"] + row["failed"])
    row["n"] = ev["total"]["n"]
    row["judge"] = ev.get("judge")
    row["judge_fallback"] = int(ev.get("judge_fallback", 0))
    return row


def results_table(run_dir: str | Path) -> list[dict]:
    """[{phase, label, policy_digest, <site>: rate, avg, solved, failed, unscored, errored, n, judge,
    judge_fallback}] from the evaluations of a run: one row per phase (``eval/phase=k.json``) and per separately
    evaluated checkpoint (``eval/model=<digest>.json``). Rates are solved / (solved + failed); errored and unscored
    episodes are counted apart. ``judge``: what scored fuzzy_match and the N/A reason check (``eval.judge``);
    ``judge_fallback``: episodes the deterministic fallback scored (``eval.judge: none``)."""
    rows = [_row("SFT (bootstrap)" if phase == 0 else f"WebRL phase {phase}", phase, ev)
            for phase, ev in _phases(run_dir, "eval")]
    for p in sorted((Path(run_dir) / "eval").glob("model=*.json")):
        ev = json.loads(p.read_text())
        where = Path(ev["actor"]).name if ev.get("actor") else "?"
        rows.append(_row(f"{where} [{str(ev.get('policy_digest'))[:15]}]", ev["phase"], ev))
    return rows


def judge_notes(row: dict) -> list[str]:
    """What a reader of a results row must know about how its fuzzy tasks were scored (``eval.judge``)."""
    out = []
    if row.get("unscored"):
        out.append(f"{row['unscored']} test episode(s) were unscored because no LLM judge is configured "
                   f"(eval.judge was empty when they were scored) and their tasks need one (fuzzy_match or the N/A "
                   f"reason check); set eval.judge to an OpenAI-compatible endpoint (e.g. http://127.0.0.1:8000/v1), "
                   f"or eval.judge: none to score them with the deterministic fallback. They are counted apart, not "
                   f"as failures.")
    if row.get("judge_fallback"):
        out.append(f"{row['judge_fallback']} test episode(s) of fuzzy tasks were scored by the deterministic fallback, "
                   f"not an LLM judge, because eval.judge is none; their scores are not comparable with VAB's "
                   f"(set eval.judge to an OpenAI-compatible endpoint for VAB's judge).")
    return out


def markdown_table(rows: list[dict]) -> str:
    head = "| model | " + " | ".join(SITE_TITLES[s] for s in SITES) + " | Avg | solved / failed / unscored / errored |"
    lines = [head, "|" + "---|" * (len(SITES) + 3)]
    for r in rows:
        cells = [f"{100 * r[s]:.1f}" if r[s] is not None else "-" for s in SITES]
        lines.append(f"| {r['label']} | " + " | ".join(cells) + f" | {100 * r['avg']:.1f} | "
                     f"{r['solved']} / {r['failed']} / {r.get('unscored', 0)} / {r['errored']} |")
    return "\n".join(lines)


def notes_markdown(rows: list[dict]) -> str:
    """The rows' ``judge_notes`` as a markdown list ("" when there are none)."""
    notes = [f"- **{r['label']}**: {n}" for r in rows for n in judge_notes(r)]
    return ("\n" + "\n".join(notes) + "\n") if notes else ""


def _figure(ncols: int = 1, nrows: int = 1, size: tuple[float, float] = (6, 4)):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(nrows, ncols, figsize=(size[0] * ncols, size[1] * nrows), squeeze=False)
    return plt, fig, axes


def _save(plt, fig, run_dir: str | Path, name: str) -> Path:
    out = Path(run_dir) / "plots" / name
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def plot_success(run_dir: str | Path) -> Path | None:
    """``plots/success_per_site.png``: test success per site and on average, bootstrap SFT and each phase."""
    rows = [r for r in results_table(run_dir) if r["label"] == "SFT (bootstrap)" or r["label"].startswith("WebRL phase")]
    if not rows:
        return None
    plt, fig, axes = _figure()
    ax = axes[0, 0]
    xs = [r["phase"] for r in rows]
    for s in SITES:
        ys = [100 * r[s] if r[s] is not None else float("nan") for r in rows]
        ax.plot(xs, ys, marker="o", label=SITE_TITLES[s])
    ax.plot(xs, [100 * r["avg"] for r in rows], marker="s", color="black", linewidth=2, label="Avg")
    ax.set_xlabel("phase (0 = SFT bootstrap)")
    ax.set_ylabel("test success rate (%)")
    ax.set_xticks(xs)
    ax.legend(fontsize=8)
    ax.set_title("Success per site across phases")
    return _save(plt, fig, run_dir, "success_per_site.png")


def loss_panels(run_dir: str | Path) -> list[tuple[str, list[dict]]]:
    """[(training kind, [its trainings' loss histories])] of a run, in the order a run trains (sft, orm, critic,
    actor), kinds without a logged loss left out (``webrl_core.runs.loss_history.run_trainings``)."""
    trainings = [t for t in loss_history.run_trainings(run_dir) if t["history"]]
    return [(kind, [t for t in trainings if t["training"] == kind]) for kind in loss_history.TRAININGS
            if any(t["training"] == kind for t in trainings)]


def plot_losses(run_dir: str | Path) -> Path | None:
    """``plots/losses.png``: each training's loss against its optimizer steps, one panel per kind of training
    (bootstrap SFT, ORM, critic, actor) and one line per training in it ("phase 2 actor"), from the
    ``loss_history.json`` in the run's model folders. None without any."""
    panels = loss_panels(run_dir)
    if not panels:
        return None
    ncols = min(2, len(panels))
    plt, fig, axes = _figure(ncols, -(-len(panels) // ncols), (5.5, 3.6))
    for ax, (kind, trainings) in zip(axes.flat, panels):
        for t in trainings:
            steps = [h["step"] for h in t["history"]]
            ax.plot(steps, [h["loss"] for h in t["history"]], marker="o" if len(steps) <= 30 else None,
                    markersize=3, label=t["label"])
        ax.set_title(f"{loss_history.TITLES[kind]} training")
        ax.set_xlabel("optimizer step")
        ax.set_ylabel("training loss")
        ax.legend(fontsize=8)
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    fig.suptitle("Training losses (each point: the mean over its logging window)", fontsize=10)
    return _save(plt, fig, run_dir, "losses.png")


FUNNEL = (("generated", "generated"), ("kept", "kept by filter"), ("kept_by_review", "kept by review"),
          ("rollout_episodes", "rolled out"), ("env_successes", "solved\n(evaluators)"), ("orm_yes", "ORM YES"))
"""The curriculum funnel's stages: (key in ``reports/phase=k.json``, bar label). ``kept``: what the critic's
filter handed on (its window, plus any top-up, at most ``curriculum.tasks_per_phase``)."""


def funnel_counts(metrics: dict) -> dict[str, int]:
    """{stage key: count} of the curriculum funnel of one phase's metrics. Reports written before the counts
    existed have the rates of the phase's scored episodes instead, from which the counts follow."""
    out = {key: int(metrics.get(key, 0)) for key, _ in FUNNEL}
    n, unscored = metrics.get("episodes", metrics.get("rollout_episodes", 0)), metrics.get("unscored", 0)
    if "env_successes" not in metrics and "env_success_rate" in metrics:
        out["env_successes"] = round(metrics["env_success_rate"] * (n - unscored))
    if "orm_yes" not in metrics and "orm_success_rate" in metrics:
        out["orm_yes"] = round(metrics["orm_success_rate"] * n)
    return out


def plot_funnel(run_dir: str | Path) -> Path | None:
    """``plots/curriculum_funnel.png``: per WebRL phase, the tasks generated -> kept by the filter -> kept by review
    -> the episodes rolled out (``curriculum.rollouts_per_task`` per kept task) -> solved by the sites' evaluators
    -> judged YES by the ORM, and the kept tasks' solve rate (solved / episodes) in each phase's legend entry. None
    before phase 1."""
    reps = [(k, m) for k, m in _phases(run_dir, "reports") if k > 0]
    if not reps:
        return None
    plt, fig, axes = _figure(size=(7, 4.2))
    ax = axes[0, 0]
    width = 0.8 / len(reps)
    for i, (k, m) in enumerate(reps):
        counts = funnel_counts(m)
        xs = [j + i * width for j in range(len(FUNNEL))]
        solve = m.get("kept_solve_rate",
                      counts["env_successes"] / max(1, counts["rollout_episodes"] or counts["kept_by_review"]))
        bars = ax.bar(xs, [counts[key] for key, _ in FUNNEL], width,
                      label=f"phase {k} (episodes on kept tasks solved: {100 * solve:.0f}%)")
        ax.bar_label(bars, fontsize=7)
    ax.set_xticks([j + width * (len(reps) - 1) / 2 for j in range(len(FUNNEL))], [l for _, l in FUNNEL], fontsize=8)
    ax.set_ylabel("tasks / episodes")
    ax.set_title("Curriculum funnel")
    ax.legend(fontsize=8)
    return _save(plt, fig, run_dir, "curriculum_funnel.png")


AGREEMENT = (("accuracy", "accuracy"), ("precision", "precision of YES"), ("recall", "recall of YES"))


def orm_agreement(run_dir: str | Path) -> list[dict]:
    """[{phase, on, n, accuracy, precision, recall}]: the ORM against the sites' evaluators, on the bootstrap's
    held-out ORM examples (phase 0, ``on`` "held-out", ``orm_heldout_*``) and on each WebRL phase's rollouts
    (``on`` "rollouts", ``orm_*`` of the orm-label stage; n = the episodes the evaluators scored)."""
    out = []
    for k, m in _phases(run_dir, "reports"):
        if k == 0 and "orm_heldout_accuracy" in m:
            out.append({"phase": 0, "on": "held-out", "n": int(m.get("orm_heldout_examples", 0)),
                        **{key: m[f"orm_heldout_{key}"] for key, _ in AGREEMENT}})
        elif k > 0 and "orm_accuracy" in m:
            out.append({"phase": k, "on": "rollouts", "n": int(m.get("episodes", 0) - m.get("unscored", 0)),
                        **{key: m[f"orm_{key}"] for key, _ in AGREEMENT}})
    return out


def plot_orm_agreement(run_dir: str | Path) -> Path | None:
    """``plots/orm_agreement.png``: ``orm_agreement`` per phase, one line per measure over the phases' rollouts;
    the bootstrap's held-out examples at phase 0 as hollow markers (other episodes, the same measure). None
    without either."""
    points = orm_agreement(run_dir)
    if not points:
        return None
    plt, fig, axes = _figure()
    ax = axes[0, 0]
    live = [p for p in points if p["on"] == "rollouts"]
    held = [p for p in points if p["on"] == "held-out"]
    for i, (key, name) in enumerate(AGREEMENT):
        if live:
            ax.plot([p["phase"] for p in live], [100 * p[key] for p in live], marker="o", color=f"C{i}", label=name)
        if held:
            ax.plot([0], [100 * held[0][key]], marker="o", markerfacecolor="none", linestyle="none", color=f"C{i}",
                    label=None if live else name)
    if held and live:  # one legend entry for the hollow markers
        ax.plot([], [], marker="o", markerfacecolor="none", linestyle="none", color="gray",
                label="hollow: bootstrap held-out examples")
    ax.set_xticks([p["phase"] for p in points], [f"{p['phase']}\n(n={p['n']})" for p in points])
    ax.set_xlabel("phase (n = episodes scored by both)")
    ax.set_ylabel("ORM vs the sites' evaluators (%)")
    ax.set_ylim(-5, 105)
    ax.set_title("ORM agreement with the evaluators")
    ax.legend(fontsize=8)
    return _save(plt, fig, run_dir, "orm_agreement.png")


def plots(run_dir: str | Path) -> list[Path]:
    """Every plot of a run that its files allow, written under ``<run_dir>/plots``."""
    return [p for p in (plot_success(run_dir), plot_losses(run_dir), plot_funnel(run_dir),
                        plot_orm_agreement(run_dir)) if p]


def models_line(run_dir: str | Path) -> str:
    """Which model the run started from and the precision it computed in (and why, for ``models.dtype: auto``),
    from the run's resolved ``config.yaml``; '' without one."""
    import yaml

    cfg_file = Path(run_dir) / "config.yaml"
    if not cfg_file.is_file():
        return ""
    models = (yaml.safe_load(cfg_file.read_text()) or {}).get("models") or {}
    start = models.get("actor") or "the embedded model, trained from scratch"
    why = f" ({models['dtype_reason']})" if models.get("dtype_reason") else ""
    layers = f"; trained layers: top {models['train_layers']}" if models.get("train_layers") else ""
    return f"Starting actor: {start}; precision: {models.get('dtype', '?')}{why}{layers}.\n\n"


def write_summary(run_dir: str | Path) -> Path:
    rows = results_table(run_dir)
    out = Path(run_dir) / "summary.md"
    out.write_text("# WebRL run summary\n\n" + models_line(run_dir)
                   + "Test-set success rate (%) per site (solved / (solved + failed)):\n\n"
                   + markdown_table(rows) + "\n" + notes_markdown(rows))
    return out


def phase_wall_time(run_dir: str | Path, phase: int, actor_digest: str, elapsed_s: float) -> float:
    """The phase's wall time as first measured: a re-run that ends with the same actor (from the cache, or a
    resumed comparison) keeps the recorded figure instead of its own few seconds."""
    rep = Path(run_dir) / "reports" / f"phase={phase}.json"
    if rep.is_file():
        old = json.loads(rep.read_text())
        if old.get("actor_digest") == actor_digest and isinstance(old.get("phase_wall_s"), (int, float)):
            return float(old["phase_wall_s"])
    return round(elapsed_s, 1)


def publish_phase(run_dir: str | Path, phase: int, metrics: dict, actor_ref=None) -> str:
    """Write the phase's metrics, plots and trajectory viewer; log them to the active MLflow run. Returns markdown."""
    from webrl_core.runs import tracking
    from webrl_core.runs.store import TrajectoryStore

    rep = Path(run_dir) / "reports" / f"phase={phase}.json"
    rep.parent.mkdir(parents=True, exist_ok=True)
    rep.write_text(json.dumps(metrics, indent=1, sort_keys=True, default=str))
    for p in plots(run_dir):
        tracking.log_artifact(p, "plots")
    viewer = None
    try:
        from webrl_core.runs.viewer import write_viewer

        viewer = write_viewer(TrajectoryStore(run_dir), Path(run_dir) / "viewer", phase=phase)
        tracking.log_artifact(Path(viewer).parent if Path(viewer).is_file() else viewer, f"viewer/phase={phase}")
    except ImportError:
        pass
    if actor_ref is not None:
        _register_model(actor_ref.path, phase)
    warnings = phase_warnings(metrics)
    for w in warnings:
        print(f"WARNING phase {phase}: {w}")
    rows = results_table(run_dir)
    md = (f"# {metrics.get('recipe', 'WebRL')} phase {phase}\n\n" + "".join(f"> **WARNING**: {w}\n>\n" for w in warnings)
          + markdown_table(rows) + "\n" + notes_markdown(rows) + "\n"
          + "\n".join(f"- **{k}**: {v:.4g}" if isinstance(v, float) else f"- **{k}**: {v}" for k, v in
                      sorted(metrics.items())) + (f"\n\nTrajectory viewer: `{viewer}`\n" if viewer else ""))
    return md


def phase_warnings(metrics: dict) -> list[str]:
    """What a reader of a phase summary must not miss: no new tasks, errors, unscored episodes."""
    out = []
    if metrics.get("unscored"):
        out.append(f"{int(metrics['unscored'])} rollout episode(s) unscored (their task needs the LLM judge, "
                   f"eval.judge is empty): left out of training and of the ORM's agreement")
    if metrics.get("rollout_episodes") == 0:
        out.append("no rollouts: the curriculum produced no tasks for this phase")
    if metrics.get("rollout_errors"):
        out.append(f"{int(metrics['rollout_errors'])} rollout episode(s) errored (stored with their errors)")
    if metrics.get("test_errored"):
        out.append(f"{int(metrics['test_errored'])} test episode(s) errored; they are not counted as failures")
    if metrics.get("test_unscored"):
        out.append(f"{int(metrics['test_unscored'])} test episode(s) were unscored because no LLM judge is configured "
                   f"(eval.judge); they are not counted as failures")
    if metrics.get("test_judge_fallback"):
        out.append(f"{int(metrics['test_judge_fallback'])} fuzzy test episode(s) were scored by the deterministic "
                   f"fallback, not an LLM judge, because eval.judge is none")
    if metrics.get("actor_n_uniform_groups"):
        out.append(f"{int(metrics['actor_n_uniform_groups'])} of {int(metrics.get('actor_n_groups', 0))} GRPO "
                   f"group(s) had one outcome for all their episodes: advantage 0, they taught the actor nothing "
                   f"(only the KL term)")
    if metrics.get("judge_unparsed"):
        out.append(f"{int(metrics['judge_unparsed'])} episode(s) got no verdict from the judge (reward.judge): "
                   f"unlabelled, left out of training")
    return out


def _register_model(path: str, phase: int) -> None:
    """Log the actor's folder and register it as a version of ``webrl-actor``. The folder is a plain HF
    checkpoint (no MLmodel file), so the version is created from its artifact URI: MLflow 3's
    ``register_model("runs:/...")`` only finds models logged through a flavour. Failures raise."""
    import mlflow

    run = mlflow.active_run()
    if run is None:
        return
    client = mlflow.MlflowClient()
    if any(v.tags.get("checkpoint") == path and v.tags.get("phase") == str(phase)
           for v in client.search_model_versions(f"run_id = '{run.info.run_id}'")):
        return  # a continued MLflow run (tracking.start_run's key) that registered this checkpoint already
    mlflow.log_artifacts(path, artifact_path="actor")
    try:
        try:
            client.create_registered_model("webrl-actor")
        except mlflow.exceptions.MlflowException as e:
            if e.error_code != "RESOURCE_ALREADY_EXISTS":
                raise
        client.create_model_version("webrl-actor", source=mlflow.get_artifact_uri("actor"), run_id=run.info.run_id,
                                    tags={"phase": str(phase), "checkpoint": path})
    except mlflow.exceptions.MlflowException as e:
        # fail the phase rather than print and move on: a missing registered model is what a user would not notice
        raise RuntimeError(f"MLflow model registry at {mlflow.get_tracking_uri()} refused phase {phase}'s actor "
                           f"({path}): {e}") from e

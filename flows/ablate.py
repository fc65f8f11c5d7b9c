"""``webrl-ablate``: the paper's Fig. 5 ablation as a flow. For each seed: one bootstrap (or the phase 0 of an existing
run, ``bootstrap_dir``), forked into one run dir per variant (``webrl_core.experiments.ablation``), then N phases
per variant, each phase the ``webrl-phase`` flow (cached like any other run). A variant whose phase has nothing to
learn from (``NoTrainingData``: e.g. without replay and without a single success) or nothing to evolve from
(``NoSeedTasks``) stops there; the table names where and why. Ends with the table (mean and range over seeds per
variant and phase), the plot, and whether Fig. 5's order holds, saved in the ablation dir, to MLflow and as Prefect
artifacts."""

from __future__ import annotations

from pathlib import Path

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact

from flows.webrl import webrl_bootstrap, webrl_phase
from webrl_core.experiments import ablation, recipe_comparison
from webrl_core.runs import tracking
from webrl_core.config_loader import load_config
from webrl_core.pipeline.generation import NoSeedTasks
from webrl_core.pipeline.updates import NoTrainingData
from webrl_core.pipeline import validate


@flow(name="webrl-ablate", log_prints=True)
def webrl_ablate(config: str = "demo", phases: int = 4, seeds: list[int] | None = None,
                 variants: list[str] | None = None, run_dir: str | None = None,
                 overrides: list[str] | None = None, bootstrap_dir: str | None = None) -> dict:
    """WebRL vs without replay vs without KL and replay (or recipes: ``variants`` webrl, grpo, pae), ``phases``
    phases, every seed in ``seeds``; with
    ``bootstrap_dir``, every variant forks that run's phase 0 instead of a bootstrap of its own."""
    seeds = [0, 1] if seeds is None else list(seeds)
    variants = list(ablation.VARIANTS) if variants is None else list(variants)
    extra = {v: ablation.variant_overrides(v) for v in variants}  # unknown names fail before any work
    overrides = list(overrides or [])
    settings = load_config(config, sets=overrides)
    validate.check_phase_count(phases)
    root = ablation.ablation_dir(settings, run_dir)
    shared = Path(bootstrap_dir).resolve() if bootstrap_dir else None
    if shared:
        ablation.check_shared_bootstrap(shared, settings, seeds)
    log = get_run_logger()
    stops: list[dict] = []
    for seed in seeds:
        seed_sets = [*overrides, f"run.seed={seed}"]
        boot = shared or root / f"seed={seed}" / "bootstrap"
        if not shared:
            webrl_bootstrap(config, str(boot), seed_sets)
        for v in variants:
            vdir = root / f"seed={seed}" / v
            ablation.fork_bootstrap(boot, vdir)
            for k in range(1, phases + 1):
                try:
                    # the variant's own knobs, then the command's --set: a --set (say a smaller phase) wins
                    webrl_phase(config, k, str(vdir), [f"run.seed={seed}", *extra[v], *overrides])
                except (NoTrainingData, NoSeedTasks) as e:  # the variant cannot go on: its line ends here
                    stops.append({"variant": v, "seed": seed, "phase": k, "reason": f"{type(e).__name__}: {e}"})
                    log.warning("seed %d, %s stopped at phase %d: %s", seed, v, k, e)
                    break
            else:
                log.info("seed %d, %s: %d phases done", seed, v, phases)
    summary = ablation.summarise(ablation.ablation_rows(root, seeds, variants))
    table = ablation.markdown(summary) + ablation.stops_markdown(stops)
    fig5 = any(v in ablation.VARIANTS and v != "webrl" for v in variants)  # else a comparison of recipes
    order = ablation.fig5_order(summary, variants) if fig5 else ""
    plot = ablation.plot(summary, root / "ablation.png")
    report = root / "ablation.md"
    source = f", phase 0 of {shared}" if shared else ""
    recipes = [v for v in variants if v not in ablation.VARIANTS or v == "webrl"]
    compared = recipe_comparison.report_markdown(root, seeds, variants) if len(recipes) > 1 else ""
    title = "WebRL ablation" if fig5 else "Recipes compared"
    report.write_text(f"# {title} ({config}, seeds {seeds}, {phases} phases{source})\n\n"
                      f"Held-out test success (%), mean over seeds (min-max):\n\n{table}\n{order}\n{compared}")
    with tracking.start_run(root, "webrl-ablate", config={"config": config, "phases": phases, "seeds": seeds,
                                                          "variants": variants, "overrides": overrides,
                                                          "bootstrap_dir": bootstrap_dir},
                            experiment=settings.tracking.experiment, configured_uri=settings.tracking.mlflow_uri):
        for s in summary:
            tracking.log_metrics({f"{s['variant']}_success_mean": s["mean"], f"{s['variant']}_success_min": s["min"],
                                  f"{s['variant']}_success_max": s["max"]}, step=s["phase"])
        tracking.log_artifact(plot, "ablation")
        tracking.log_artifact(report, "ablation")
    create_markdown_artifact(report.read_text(), key="webrl-ablation", description="WebRL ablation (paper Fig. 5)")
    return {"run_dir": str(root), "summary": summary, "order": order, "plot": str(plot), "stops": stops}

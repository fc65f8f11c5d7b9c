"""Top-level commands that run flows: demo, phase, train, eval, reproduce."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import List, Optional

import typer

from webrl_cli.prefect_stack import stops_its_tree

# the top-level commands (demo, train, bootstrap, phase, eval, reproduce); main.py puts them on `webrl` itself
app = typer.Typer()


def prefect_env(beside: str | Path) -> None:
    """Where Prefect keeps results and its local DB: ``.prefect`` and ``.prefect-results`` in ``beside`` (the folder
    that holds the run dir, never an unrelated working directory); set before prefect is imported, once the
    inputs are checked, so a refused command writes nothing."""
    root = Path(beside).resolve()
    for sub in (".prefect", ".prefect-results"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("PREFECT_RESULTS_LOCAL_STORAGE_PATH", str(root / ".prefect-results"))
    os.environ.setdefault("PREFECT_HOME", str(root / ".prefect"))
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")  # slow on a busy 2-core box
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _load(config: str, set_: list[str], flow: str | None = None, run_dir: str | None = None,
          phase: int | None = None, model: str | None = None):
    """Resolve the config and, for a flow, check its inputs before Prefect starts (seconds instead of a
    minute and a traceback) and put Prefect's state beside the run dir; the flow checks them again, for runs
    started from a deployment."""
    from webrl_core.config_loader import load_config

    s = load_config(config, sets=set_)  # a ConfigError is printed by webrl_cli.main
    if flow is not None:
        from webrl_core.pipeline import validate
        from webrl_core.runs import runlock
        from webrl_core.runs.rundir import run_dir_of

        rd = str(run_dir_of(s, run_dir))
        validate.check_writable(rd)  # a --run-dir under a file is named before the lock file is opened there
        runlock.check_free(rd, f"webrl-{flow}", phase)  # another flow runs there: say so, before what it lacks yet
        for warning in validate.preflight(s, rd, model=model, phase=phase, flow=flow):
            typer.echo(f"warning: {warning}", err=True)
        prefect_env(Path(rd).parent)
    return s


def _seed_list(seeds: str) -> list[int]:
    """``--seeds 0,1`` as integers (>= 0, at least one)."""
    from webrl_core.errors import BadInput

    items = [x.strip() for x in seeds.split(",") if x.strip()]
    bad = [x for x in items if not x.isdigit()]
    if bad or not items:
        raise BadInput(f"--seeds {seeds!r}: expected comma-separated run seeds >= 0, e.g. --seeds 0,1"
                       + (f" ({bad[0]!r} is not one)" if bad else ""))
    return [int(x) for x in items]


def print_table(run_dir: str) -> None:
    from rich.console import Console
    from rich.table import Table

    from webrl_core.runs.report import results_table
    from webrl_core.websites import SITE_TITLES, SITES

    rows = results_table(run_dir)
    t = Table(title=f"Test-set success rate (%) per site: {run_dir}")
    t.add_column("model")
    for s in SITES:
        t.add_column(SITE_TITLES[s], justify="right")
    t.add_column("Avg", justify="right")
    t.add_column("solved / failed / errored", justify="right")
    for r in rows:
        t.add_row(r["label"], *[f"{100 * r[s]:.1f}" if r[s] is not None else "-" for s in SITES],
                  f"{100 * r['avg']:.1f}", f"{r['solved']} / {r['failed']} / {r['errored']}")
    Console().print(t)


def fp32_demo_hint(config: str, settings) -> str | None:
    """The note `webrl demo` prints when the `demo` config will run in float32 by the CPU's choice (no bf16 unit)."""
    if config != "demo" or settings.models.dtype != "float32" or not settings.models.dtype_why.startswith("auto"):
        return None
    return (f"note: the models run in float32 here ({settings.models.dtype_why}); the demo is sized for a CPU with "
            "bf16 (42 minutes on a 2-core AVX512-BF16 EPYC); on a 2-core AVX2-only CPU 0.75 epoch of its SFT took 24 "
            "minutes and a 60-task evaluation 9, so expect well over an hour "
            "(docs/results.md#the-demo-on-a-cpu-without-bf16)")


@app.command("demo")
@stops_its_tree
def demo(config: str = typer.Option("demo", help="config (path or packaged name)"),
         set_: List[str] = typer.Option([], "--set", "-s", help="section.key=value overrides")):
    """Bootstrap + WebRL phases + evaluation on the embedded sites; ends with the per-site success table."""
    settings = _load(config, set_, "train")
    if hint := fp32_demo_hint(config, settings):
        typer.echo(hint, err=True)
    from flows.webrl import webrl_train

    t0 = time.perf_counter()
    out = webrl_train(config=config, overrides=set_)
    rd = out["run_dir"]
    from webrl_core.runs.report import models_line

    print_table(rd)
    typer.echo(models_line(rd).strip())
    typer.echo(f"\nwall time {time.perf_counter() - t0:.0f} s")
    typer.echo(f"run dir:  {rd}\nsummary:  {rd}/summary.md\nplots:    {rd}/plots/\nviewer:   {rd}/viewer/\n"
               f"store:    webrl store stats {rd}\nMLflow:   webrl serve mlflow --run-dir {rd}")


@app.command("ablate")
@stops_its_tree
def ablate(config: str = typer.Option("demo", help="config"),
           phases: int = typer.Option(4, help="WebRL phases per variant"),
           seeds: str = typer.Option("0,1", help="comma-separated run seeds; each gets its own bootstrap"),
           variants: str = typer.Option("webrl,no-replay,no-kl-no-replay",
                                        help="comma-separated variants (webrl_core.experiments.ablation.VARIANTS) "
                                        "or recipes (webrl,grpo,pae: webrl_core.experiments.recipes, compared "
                                        "with their cost, per-site and paired tables)"),
           run_dir: Optional[str] = typer.Option(None, help="ablation directory (default <run.root>/<run.name>-ablate)"),
           bootstrap: Optional[str] = typer.Option(
               None, help="an existing run dir whose phase 0 every variant forks instead of a bootstrap of its own "
               "(one seed, the run's; the same eval settings)"),
           set_: List[str] = typer.Option([], "--set", "-s", help="section.key=value overrides")):
    """The paper's Fig. 5 ablation: WebRL vs without replay vs without KL and replay, from one bootstrap per seed;
    prints the table (mean and range over seeds) and writes the plot."""
    from webrl_core.experiments import ablation
    from webrl_core.pipeline.validate import check_phase_count, check_writable

    check_phase_count(phases)
    chosen = [v.strip() for v in variants.split(",") if v.strip()]
    for v in chosen:
        ablation.variant_overrides(v)  # an unknown name fails before Prefect starts
    seed_list = _seed_list(seeds)
    settings = _load(config, set_)
    if bootstrap:  # a misfit bootstrap fails before Prefect starts
        ablation.check_shared_bootstrap(bootstrap, settings, seed_list)
    root = ablation.ablation_dir(settings, run_dir)
    check_writable(root)
    prefect_env(root.parent)
    from flows.ablate import webrl_ablate

    out = webrl_ablate(config=config, phases=phases, seeds=seed_list, variants=chosen, run_dir=run_dir,
                       overrides=set_, bootstrap_dir=bootstrap)
    typer.echo(ablation.markdown(out["summary"]) + out["order"])
    typer.echo(f"plot: {out['plot']}")


@app.command("train")
@stops_its_tree
def train(config: str = typer.Option("demo", help="config"), phases: Optional[int] = typer.Option(None, help="phases"),
          run_dir: Optional[str] = typer.Option(None, help="run directory (default <run.root>/<run.name>)"),
          set_: List[str] = typer.Option([], "--set", "-s", help="section.key=value overrides")):
    """Bootstrap (when needed) then N phases."""
    from webrl_core.pipeline.validate import check_phase_count

    check_phase_count(phases)
    _load(config, set_, "train", run_dir)
    from flows.webrl import webrl_train

    out = webrl_train(config=config, phases=phases, run_dir=run_dir, overrides=set_)
    print_table(out["run_dir"])


@app.command("bootstrap")
@stops_its_tree
def bootstrap(config: str = typer.Option("demo", help="config"),
              run_dir: Optional[str] = typer.Option(None, help="run directory"),
              set_: List[str] = typer.Option([], "--set", "-s", help="section.key=value overrides")):
    """Phase 0 only: demos, tokenizer, SFT actor, ORM, critic init, baseline evaluation."""
    _load(config, set_, "bootstrap", run_dir)
    from flows.webrl import webrl_bootstrap

    out = webrl_bootstrap(config=config, run_dir=run_dir, overrides=set_)
    typer.echo(f"test success {out['metrics']['test_success_rate']:.3f}")


@app.command("phase")
@stops_its_tree
def phase(config: str = typer.Option("demo", help="config"), phase: int = typer.Option(..., help="phase k >= 1"),
          run_dir: Optional[str] = typer.Option(None, help="run directory"),
          set_: List[str] = typer.Option([], "--set", "-s", help="section.key=value overrides")):
    """Run one WebRL phase (needs phase k-1's models in the run dir)."""
    s = _load(config, set_, "phase", run_dir, phase=phase)
    from flows.webrl import webrl_phase

    t0 = time.perf_counter()
    webrl_phase(config=config, phase=phase, run_dir=run_dir, overrides=set_)
    from webrl_core.runs.rundir import run_dir_of

    print_table(str(run_dir_of(s, run_dir)))
    typer.echo(f"phase {phase} wall time {time.perf_counter() - t0:.1f} s")


@app.command("sft")
@stops_its_tree
def sft(data: Path = typer.Option(..., help="demonstrations: a LLaMA-Factory ShareGPT JSON (human = the full WebRL "
                                        "prompt, gpt = the action; the official SFT format) or a VAB traces folder"),
        out: Path = typer.Option(..., help="folder for the fine-tuned HF model"),
        base: Optional[str] = typer.Option(None, help="HF folder of the base model (default: models.actor)"),
        config: str = typer.Option("demo", help="config (training, models, bootstrap.sft_* settings)"),
        set_: List[str] = typer.Option([], "--set", "-s", help="section.key=value overrides")):
    """Fine-tune a base model on demonstrations (phase 0 of a real model; the bootstrap flow does the same with
    bootstrap.sft_data). The loss is on the action tokens (bootstrap.sft_loss)."""
    s = _load(config, set_)
    from webrl_core.scale import launch
    from webrl_core.learn.sft_data import read_demonstrations

    base = base or s.models.actor
    if not base:
        raise typer.BadParameter("no base model: give --base or models.actor", param_hint="--base")
    pairs = read_demonstrations(data, s.prompt.compat)
    typer.echo(f"{len(pairs)} (prompt, action) pairs from {data}")
    t0 = time.perf_counter()
    metrics = launch.sft_train(pairs, base, out, s)
    typer.echo(f"fine-tuned {base} -> {out} in {time.perf_counter() - t0:.0f}s: "
               + ", ".join(f"{k} {v:.4g}" for k, v in metrics.items() if isinstance(v, (int, float))))


@app.command("eval")
@stops_its_tree
def evaluate(config: str = typer.Option("demo", help="config"),
             model: Optional[str] = typer.Option(None, help="HF model folder (policy.backend=hf); with "
                                                 "policy.backend=openai the served model is evaluated"),
             run_dir: Optional[str] = typer.Option(None, help="run directory"),
             set_: List[str] = typer.Option([], "--set", "-s", help="section.key=value overrides")):
    """Evaluate a checkpoint on the test set and print the per-site table."""
    _load(config, set_, "eval", run_dir, model=model)
    from flows.webrl import webrl_eval

    out = webrl_eval(config=config, model=model or "", run_dir=run_dir, overrides=set_)
    ev = out["eval"]
    typer.echo(f"policy {ev['policy_digest']}\n{'site':15s} solved failed errored  success (solved / scored)")
    for site, v in sorted(ev["sites"].items()) + [("total", ev["total"])]:
        scored = v["success"] + v["failed"]
        typer.echo(f"{site:15s} {v['success']:6d} {v['failed']:6d} {v['errors']:7d}  {100 * v['success'] / max(1, scored):5.1f}%")


@app.command("reproduce")
@stops_its_tree
def reproduce(run_dir: str = typer.Argument(..., help="run directory of a finished run"),
              phase: int = typer.Option(..., help="phase to re-run (>= 1)"),
              rollouts: bool = typer.Option(False, "--rollouts", help="also redo the rollouts (slow; sampling differs)")):
    """Re-run a phase from its recorded artifacts and report whether the outputs match."""
    import json

    from webrl_core.experiments.reproduce import check_reproducible, reproduce_phase

    check_reproducible(run_dir, phase)  # a missing run dir or phase fails before Prefect writes its state
    prefect_env(Path(run_dir).resolve().parent)
    rep = reproduce_phase(run_dir, phase, redo_rollouts=rollouts)
    for name, v in rep["outputs"].items():
        extra = f" (max |dw| = {v['max_abs_weight_diff']:.3g})" if "max_abs_weight_diff" in v else ""
        typer.echo(f"{name:8s} {'MATCH' if v['match'] else 'DIFFERS'}{extra}")
    if "rollouts" in rep:
        typer.echo(f"rollouts: {json.dumps(rep['rollouts'])}")
    typer.echo("all outputs match" if rep["all_match"] else "some outputs differ (see above)")
    raise typer.Exit(0 if rep["all_match"] else 1)

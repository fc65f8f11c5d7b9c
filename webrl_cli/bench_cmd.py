"""`webrl bench ...`: benchmark commands. Areas register their commands from their own modules."""

from __future__ import annotations

import importlib
import json
from typing import Optional

import typer

app = typer.Typer(no_args_is_help=True)

# Each module defines `register(app)` adding its commands (store: lead; rollout: env; score/train: learning core).
for _mod in ("webrl_cli.bench_store", "webrl_cli.bench_rollout", "webrl_cli.bench_learn", "webrl_cli.bench_checkpoint",
             "webrl_cli.bench_faults"):
    try:
        importlib.import_module(_mod).register(app)
    except ModuleNotFoundError as _e:
        if _e.name != _mod:
            raise


@app.command("memory")
def bench_memory(model: str = typer.Option(None, help="HF model folder or config.json (default: Llama-3-8B's config)"),
                 seq: int = typer.Option(16384, min=1, help="tokens per sequence"),
                 batch: int = typer.Option(1, min=1, help="sequences per micro-batch"),
                 lora_r: int = typer.Option(16, min=1, help="LoRA rank (all-linear)"),
                 lora_dropout: float = typer.Option(0.05, min=0.0, max=1.0, help="LoRA dropout (its masks cost activation memory)"),
                 gpus: int = typer.Option(8, min=1, help="GPUs the last column shards the states over (FSDP / ZeRO-3)"),
                 markdown: bool = typer.Option(False, "--markdown", help="print a Markdown table"),
                 out: str = typer.Option(None, help="write the numbers as JSON to this file")):
    """GPU memory of actor, critic and reference for each precision / LoRA / checkpointing setting, computed from
    the model config (parameters counted on the meta device; activations itemised per decoder layer)."""
    from benchmarks.memory import run

    run(model=model, seq=seq, batch=batch, lora_r=lora_r, gpus=gpus, lora_dropout=lora_dropout,
        fmt="markdown" if markdown else "table", out=out)


@app.command("serving")
def bench_serving(model: str = typer.Option(..., help="HF model folder to serve (the actor checkpoint)"),
                  engines: str = typer.Option("webrl,vllm", help="comma-separated serving engines to compare"),
                  requests: int = typer.Option(32, min=1, help="prompts sent (each a WebRL prompt on an oracle page)"),
                  concurrency: int = typer.Option(8, min=1, help="requests in flight at once (like env.n_envs browsers)"),
                  max_tokens: int = typer.Option(48, min=1, help="tokens generated per request (greedy)"),
                  vllm_python: str = typer.Option(".venv-vllm/bin/python", help="vLLM's interpreter"),
                  config: str = typer.Option("smoke", help="config for models.* and serving.*"),
                  set_: list[str] = typer.Option([], "--set", "-s", help="section.key=value overrides")):
    """Start each serving engine for one checkpoint, as the serving stage does, and print its startup time and
    generated tokens/s."""
    import tempfile

    from rich.console import Console
    from rich.table import Table

    from benchmarks.serving import bench_engine
    from webrl_core.config_loader import load_config
    from webrl_core.prompts import build_prompt
    from webrl_core.sites.tasks import train_tasks

    prompts = [build_prompt(t["intent"], [], f"<html><body><h1>{t['sites'][0]}</h1><a id=\"1\">{t['intent']}</a>"
                            f"<button id=\"2\">Search</button></body></html>") for t in train_tasks(requests, seed=5)]
    rows = []
    with tempfile.TemporaryDirectory() as run_dir:
        for engine in [e.strip() for e in engines.split(",") if e.strip()]:
            extra = [f"serving.engine={engine}", "policy.backend=openai"]
            if engine == "vllm":
                extra += [f"serving.python={vllm_python}"]  # its CPU KV cache sized by the serving stage
            s = load_config(config, sets=[*extra, *set_])
            rows.append(bench_engine(s, model, prompts, max_tokens, concurrency, run_dir))
    t = Table(title=f"serving {model}: {requests} requests, {concurrency} in flight, {max_tokens} tokens each")
    for col in ("engine", "startup_s", "completion_tokens", "wall_s", "tokens_per_s"):
        t.add_column(col, justify="left" if col == "engine" else "right")
    for r in rows:
        t.add_row(*(str(r[c]) for c in ("engine", "startup_s", "completion_tokens", "wall_s", "tokens_per_s")))
    Console().print(t)


# options shared by the phase-0 benches (bench sft, bench copy-export)
DEMOS = typer.Option(150, help="training tasks the oracle demonstrates (the SFT data)")
VAL_TASKS = typer.Option(80, help="validation tasks: training pool, intents unlike the demos'")
SFT_RUN_DIR = typer.Option("runs/bench-sft", help="bench run dir (demos and episodes are reused)")
SETS = typer.Option([], "--set", "-s", help="section.key=value overrides")


@app.command("sft")
def bench_sft(config: str = typer.Option("demo", help="config whose bootstrap/models/actor settings are measured"),
              demos: int = DEMOS, val_tasks: int = VAL_TASKS, run_dir: str = SFT_RUN_DIR, set_: list[str] = SETS,
              out: str = typer.Option(None, help="write the numbers as JSON to this file")):
    """Phase-0 SFT of one setting, measured on a validation split of the training pool (never the test set):
    SFT seconds and tokens/s, validation success, unparseable steps, typed arguments taken from the intent."""
    from benchmarks.sft import run
    from webrl_core.config_loader import load_config

    run(load_config(config, sets=set_), run_dir, demos=demos, val_tasks=val_tasks, out=out)


@app.command("sft-curve")
def bench_sft_curve(config: str = typer.Option("demo", help="config whose prompt/bootstrap/models settings are "
                                                           "measured"),
                    demos: Optional[int] = typer.Option(None, min=1, help="training tasks the oracle demonstrates (the SFT "
                                                                   "data; default 300); with --folder: train on its "
                                                                   "first DEMOS demonstrations (default: all)"),
                    val_tasks: int = VAL_TASKS, run_dir: str = SFT_RUN_DIR, set_: list[str] = SETS,
                    val_steps: int = typer.Option(60, min=1, help="validation steps scored greedily at each point"),
                    every: int = typer.Option(40, min=1, help="optimizer steps between two points of the curve"),
                    every_epochs: Optional[float] = typer.Option(None, help="epochs between two points (0.25: a "
                                                                            "point every quarter epoch); "
                                                                            "replaces --every"),
                    label: str = typer.Option("", help="name of this recipe in the table, plot and MLflow run"),
                    val_rollouts: int = typer.Option(0, min=0, help="after training, greedy rollouts on this many "
                                                             "validation tasks: task success confirms the recipe"),
                    budget_s: Optional[float] = typer.Option(None, help="stop training after this many training "
                                                                        "seconds (the last point is measured)"),
                    folder: Optional[str] = typer.Option(None, help="train from a folder `webrl bench "
                                                                    "sft-curve-export` wrote (no browser, no sites; "
                                                                    "its settings, then --set; --config, --val-* "
                                                                    "and --run-dir are not used)"),
                    model: Optional[str] = typer.Option(None, help="with --folder: the base model (models.actor), "
                                                                   "an HF folder"),
                    out: str = typer.Option("runs/bench-sft/curve", help="writes OUT.jsonl (each point as "
                                                                         "measured), OUT.json and OUT.png")):
    """Phase-0 SFT as a learning curve: greedy next-action accuracy (exact action, element id, typed arguments,
    well-formed) on validation steps of the training pool (never the test set), every --every optimizer steps."""
    if folder:
        from benchmarks.sft_curve import run_folder

        run_folder(folder, out, set_, model=model, demos=demos, every=every, label=label, budget_s=budget_s,
                   every_epochs=every_epochs)
        return
    from benchmarks.sft_curve import run
    from webrl_core.config_loader import load_config

    run(load_config(config, sets=set_), run_dir, demos=300 if demos is None else demos, val_tasks=val_tasks,
        val_steps=val_steps, every=every, out=out, label=label, val_rollouts=val_rollouts, budget_s=budget_s,
        every_epochs=every_epochs)


@app.command("sft-curve-export")
def bench_sft_curve_export(config: str = typer.Option("demo", help="config whose prompt/models settings render the "
                                                                  "prompts"),
                           demos: int = typer.Option(300, min=1, help="training tasks the oracle demonstrates"),
                           val_tasks: int = VAL_TASKS, run_dir: str = SFT_RUN_DIR, set_: list[str] = SETS,
                           val_steps: int = typer.Option(120, min=1, help="validation steps the folder keeps"),
                           out: str = typer.Option("runs/bench-sft/curve-folder", help="the portable folder to "
                                                                                       "write")):
    """Write the folder `webrl bench sft-curve --folder` trains from: the demonstrations' and the validation
    steps' prompts rendered in the config's format, with the settings. Needs the sites and Chromium; the folder
    does not (a GPU machine trains from it)."""
    from benchmarks.sft_curve import export
    from webrl_core.config_loader import load_config

    print(json.dumps(export(load_config(config, sets=set_), run_dir, demos, val_tasks, val_steps, out), indent=2))


@app.command("next-action")
def bench_next_action(run: Optional[str] = typer.Option(None, help="run dir: every phase's actor (models/phase=k/actor)"),
                      model: list[str] = typer.Option([], help="a checkpoint folder to mark as well (repeatable)"),
                      config: str = typer.Option("demo", help="config whose prompt/models/policy settings are used"),
                      demos: int = typer.Option(300, min=1, help="the demonstrations whose intents validation avoids"),
                      val_tasks: int = VAL_TASKS, run_dir: str = SFT_RUN_DIR, set_: list[str] = SETS,
                      val_steps: int = typer.Option(120, min=1, help="validation steps each actor answers greedily"),
                      out: str = typer.Option("runs/bench-sft/next-action", help="writes OUT.json and OUT.png")):
    """Next-action accuracy of each phase's actor of a run (and of named checkpoints) on the same validation steps
    as bench sft-curve: does a WebRL phase keep what the SFT start knew?"""
    from benchmarks.next_action import run as run_bench
    from webrl_core.config_loader import load_config

    run_bench(load_config(config, sets=set_), run, model, run_dir, demos=demos, val_tasks=val_tasks,
              val_steps=val_steps, out=out)


@app.command("orm")
def bench_orm(train_run: list[str] = typer.Option([], help="run dir whose policy episodes (bootstrap, random, "
                                                          "rollout; never eval) train the ORM (repeatable)"),
              test_run: list[str] = typer.Option([], help="run dir whose policy episodes test it (repeatable); "
                                                         "episodes also among the training runs' are left out"),
              sizes: str = typer.Option("40,120,360", help="comma-separated training-episode counts, half solved "
                                                          "(nested draws; capped at twice the rarer class)"),
              base: Optional[str] = typer.Option(None, help="model the ORM is fine-tuned from (folder or short name; "
                                                            "default: the first --train-run's SFT actor)"),
              unseen_tasks: bool = typer.Option(True, help="leave out test episodes on tasks a training episode "
                                                           "acted on"),
              config: str = typer.Option("demo", help="config whose orm/models/prompt settings are used"),
              run_dir: str = typer.Option("runs/bench-orm", help="bench dir: the ORMs (reused by key) and MLflow"),
              set_: list[str] = SETS,
              out: str = typer.Option("runs/bench-orm/orm-curve", help="writes OUT.json and OUT.png")):
    """The ORM as a data curve: trained on more and more labelled policy episodes of some runs, its accuracy,
    YES precision, recall and ROC AUC against the sites' evaluators on other runs' episodes."""
    from benchmarks.orm import run as run_bench
    from webrl_core.config_loader import load_config

    try:
        counts = [int(s) for s in sizes.split(",") if s.strip()]
    except ValueError:
        raise typer.BadParameter(f"--sizes must be comma-separated integers, got {sizes!r}")
    run_bench(load_config(config, sets=set_), train_run, test_run, counts, base, run_dir, out,
              unseen_tasks=unseen_tasks)


@app.command("temperature")
def bench_temperature(model: Optional[str] = typer.Option(None, help="actor checkpoint folder to sweep"),
                      run: Optional[str] = typer.Option(None, help="run dir: sweep its SFT actor (models/phase=0/actor)"),
                      temperatures: str = typer.Option("0,0.3,0.5,0.7,1.0", help="comma-separated temperatures"),
                      samples: int = typer.Option(1, min=1, help="rollouts per task and temperature (>= 2: tasks solved "
                                                            "sometimes)"),
                      config: str = typer.Option("demo", help="config whose env/prompt/models/policy settings are used"),
                      demos: int = typer.Option(300, min=1, help="the demonstrations whose intents validation avoids"),
                      val_tasks: int = typer.Option(30, min=1, help="validation tasks of the training pool"),
                      run_dir: str = SFT_RUN_DIR, set_: list[str] = SETS,
                      out: str = typer.Option("runs/bench-sft/temperature", help="writes OUT.json and OUT.png")):
    """Task success of an actor on validation tasks of the training pool at each sampling temperature: the
    training rollouts' temperature (policy.temperature) chosen by measurement."""
    from benchmarks.temperature import run as run_bench
    from webrl_core.config_loader import load_config

    try:
        temps = [float(t) for t in temperatures.split(",") if t.strip()]
    except ValueError:
        raise typer.BadParameter(f"--temperatures must be comma-separated numbers, got {temperatures!r}")
    run_bench(load_config(config, sets=set_), model, run, run_dir, demos=demos, val_tasks=val_tasks,
              temperatures=temps, samples=samples, out=out)


@app.command("copy-export")
def bench_copy_export(config: str = typer.Option("demo", help="config whose bootstrap/models settings are used"),
                      demos: int = DEMOS, val_tasks: int = VAL_TASKS, run_dir: str = SFT_RUN_DIR,
                      set_: list[str] = SETS, out: str = typer.Option("runs/bench-copy", help="the portable folder to write")):
    """Write the folder `webrl bench copy` trains and checks from: the run's tokenizer, the oracle demonstrations'
    (prompt, action) pairs and the validation tasks' oracle steps. Needs the sites and Chromium; the folder does not."""
    from benchmarks.copy import export
    from webrl_core.config_loader import load_config

    print(json.dumps(export(load_config(config, sets=set_), run_dir, demos, val_tasks, out), indent=2))


@app.command("copy")
def bench_copy(folder: str = typer.Argument(..., help="folder written by `webrl bench copy-export`"),
               size: list[str] = typer.Option([], help="hidden,intermediate,layers,heads of an embedded model to "
                                                       "train (repeat for several); default: the folder's config"),
               set_: list[str] = SETS,
               out: str = typer.Option(None, help="write the rows as JSON to this file")):
    """Train the embedded actor (one per --size) on the folder's demonstrations and measure, on the validation
    steps, greedy action match, typed arguments copied from the intent and the rank of the intent's entity."""
    from benchmarks.copy import parse_size, run

    run(folder, [parse_size(s) for s in size] or None, set_, out)

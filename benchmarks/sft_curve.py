"""`webrl bench sft-curve`: the phase-0 SFT measured as a learning curve of next-action accuracy, cheap enough to
compare recipes in one session (a point is one greedy pass over ``val_steps`` steps, about a minute).

Data: oracle episodes of ``demos`` training tasks (the SFT pairs, as the bootstrap makes them) and of
``val_tasks`` validation tasks of the training pool whose intents are not among the demonstrations' (never the
held-out test set; ``benchmarks.sft.validation_tasks``). Both are stored in the bench run dir and reused. Each step
keeps its ingredients (intent, past responses, page HTML, oracle response), so the prompts are rendered in the
configured ``prompt.*`` format (``prompts.prompt_format``) at every call: layouts compare on the same steps.

Training is ``training.sft_train`` itself (``bootstrap.sft_*`` including the entity-swapped passes of
``sft_entity_swap``, ``models.*``, LoRA), with a callback that, every
``every`` optimizer steps and at the start and the end, generates greedily for the validation steps with the
model being trained and scores each response against the oracle's action (parsed with ``env.actions``):

  - ``exact``: same action name, element id, argument and answer (the ``do(...)``/``exit(...)`` call; comment
    lines such as ``# Element: ...`` are free text and not compared);
  - ``element``: same element id, over the steps whose oracle action names an element;
  - ``typed_args``: same argument, over the steps whose oracle action types one (Type, Search, Select);
  - ``stops``: the response is an ``exit`` too, over the steps whose oracle action exits (an answer or Done):
    whether the model stops on the page where the task is done instead of acting on (a price question answered
    on the product page, not `Add to Cart`); the answer itself is scored by ``exact``;
  - ``grounding``: same element id, over the steps whose response names the oracle's element in its
    ``# Element:`` line (the same text): whether a model that chose the right element also wrote its id;
  - ``well_formed``: the response parses as an action.

Each point also records the pairs and tokens trained so far and the tokens/s. The curve goes to
``<out>.jsonl`` (one line per point, as measured), a plot ``<out>.png`` and an MLflow run in the bench run dir.
``val_rollouts`` confirms the trained actor (kept in ``<run_dir>/sft-curve/<label>``) by task success: greedy
rollouts on that many validation tasks, scored by the sites' evaluators.

Portable (a machine without Chromium, the sites or the store, such as a GPU box): ``export`` writes the steps with
their prompts rendered, each demonstration step with the index of its demonstration, and the settings;
``run_folder`` trains on the first K demonstrations of such a folder and measures the same curve there.
``budget_s`` stops a training after that many training seconds (points every ``every`` steps until then);
``every_epochs`` counts the points' spacing in epochs of the distinct pairs instead of optimizer steps.
"""

from __future__ import annotations

import json
import math
import random
import statistics
import time
from pathlib import Path

from transformers import TrainerCallback

from webrl_core.agent.grounding import named_element
from webrl_core.artifacts import read_jsonl, write_jsonl
from webrl_core.env.actions import ActionParseError, parse_action

TYPED = ("Type", "Search", "Select Dropdown Option")
MARKS = ("exact", "element", "typed_args", "well_formed", "stops", "grounding")
"""A step's marks (module docstring), in the order tables and plots show them."""


def oracle_steps(store, episode_ids: list[str]) -> list[dict]:
    """The steps of the successful episodes, each with its intent, the responses before it and its page."""
    from webrl_core.websites import is_success

    rows = store.sql("SELECT e.episode_id, e.task_id, e.site, e.intent, e.env_score, s.idx, s.html, s.response "
                     "FROM steps s JOIN episodes e USING (episode_id) WHERE e.episode_id IN (SELECT unnest($ids)) "
                     "ORDER BY e.episode_id, s.idx", {"ids": episode_ids})
    out, past, current = [], [], None
    for r in rows:
        if r["episode_id"] != current:
            current, past = r["episode_id"], []
        if is_success(r["env_score"]):
            out.append({"episode_id": current, "task_id": r["task_id"], "site": r["site"], "intent": r["intent"],
                        "past": list(past), "html": r["html"], "action": r["response"]})
        past.append(r["response"])
    return out


def collect(settings, run_dir: str, demos: int, val_tasks: int) -> tuple[list[dict], list[dict], set[str]]:
    """Oracle demonstrations' and validation tasks' steps (stored in ``run_dir`` and reused by later calls), and the
    demonstrated intents (validation tasks never repeat one)."""
    from webrl_core.artifacts import read_json
    from benchmarks.sft import demo_tasks, validation_tasks
    from webrl_core.pipeline import experience
    from webrl_core.runs.store import TrajectoryStore

    demo_ref = demo_tasks(settings, run_dir, demos)
    demo_roll = experience.rollout(settings, run_dir, 0, "oracle", demo_ref, None, 0.0)
    demo_intents = {t["intent"] for t in read_json(demo_ref)}
    val_ref = validation_tasks(settings, run_dir, val_tasks, demo_intents)
    val_roll = experience.rollout(settings, run_dir, 0, "oracle", val_ref, None, 0.0)
    store = TrajectoryStore(run_dir)
    train, val = oracle_steps(store, demo_roll["episode_ids"]), oracle_steps(store, val_roll["episode_ids"])
    demo_index = {t["task_id"]: i for i, t in enumerate(read_json(demo_ref))}
    for s in train:
        s["demo"] = demo_index[s["task_id"]]  # a folder trains on the steps of its first K demonstrations
    if not train or not val:
        raise RuntimeError(f"bench sft-curve: the oracle solved {demo_roll['env_success']}/{demo_roll['n']} "
                           f"demonstration and {val_roll['env_success']}/{val_roll['n']} validation tasks; both "
                           f"need successes (is env.max_steps={settings.env.max_steps} too small?)")
    return train, val, demo_intents


def score(response: str, oracle: str) -> dict[str, bool | None]:
    """One step's marks (module docstring); None where a mark does not apply to the oracle's action."""
    want = parse_action(oracle)
    try:
        got = parse_action(response)
    except ActionParseError:
        got = None
    same = got is not None and (got.name, got.element, got.argument, got.message) == \
        (want.name, want.element, want.argument, want.message)
    named, want_named = named_element(response), named_element(oracle)
    same_name = named is not None and want_named is not None and named.casefold() == want_named.casefold()
    return {"exact": same, "well_formed": got is not None,
            "element": None if want.element is None else (got is not None and got.element == want.element),
            "typed_args": None if want.name not in TYPED else (got is not None and got.argument == want.argument),
            "stops": None if want.name != "exit" else (got is not None and got.name == "exit"),
            "grounding": None if want.element is None or not same_name else (got is not None
                                                                             and got.element == want.element)}


def share_of(row: dict, key: str) -> str:
    """A mark of a summarised row as a table shows it: ``"62.5% of 24"`` (the steps it applies to)."""
    return f"{100 * row[key]:.1f}% of {row[f'{key}_n']}"


def summarise(marks: list[dict]) -> dict[str, float]:
    out = {}
    for key in MARKS:
        vals = [m[key] for m in marks if m[key] is not None]
        out[key] = round(sum(vals) / len(vals), 4) if vals else float("nan")
        out[f"{key}_n"] = len(vals)
    return out


class NextActionCurve(TrainerCallback):
    """Greedy next-action accuracy of the model being trained, every ``every`` optimizer steps (and at 0 and the
    end); each point is appended to ``jsonl`` as it is measured."""

    def __init__(self, prompts: list[str], actions: list[str], settings, every: int, jsonl: Path,
                 pair_tokens: list[int], pairs_per_step: int, distinct_pairs: int | None = None,
                 budget_s: float | None = None) -> None:
        self.prompts, self.actions, self.settings, self.every = prompts, actions, settings, every
        self.budget_s = budget_s  # training seconds after which training stops (the last point is measured)
        self.jsonl, self.pair_tokens, self.pairs_per_step = jsonl, pair_tokens, pairs_per_step
        # epochs count passes over the demonstrations' pairs: entity-swapped passes are copies of them
        self.distinct_pairs = distinct_pairs or len(pair_tokens)
        self.points: list[dict] = []
        self.train_s = 0.0
        self._t = None

    def measure(self, model, tok, step: int) -> dict:
        import torch

        from webrl_core.agent.policy import HFPolicy

        t0 = time.perf_counter()
        was_training = model.training
        model.eval()
        policy = HFPolicy.of_model(model, tok, self.settings.policy, self.settings.models)
        with torch.autocast(device_type=model.device.type, dtype=torch.bfloat16,
                            enabled=self.settings.models.dtype == "bfloat16" and model.dtype != torch.bfloat16):
            responses = policy.generate(self.prompts, temperature=0.0)
        if was_training:
            model.train()
        marks = [score(r, a) for r, a in zip(responses, self.actions)]
        pairs = step * self.pairs_per_step
        seen = sum(self.pair_tokens[i % len(self.pair_tokens)] for i in range(pairs))
        point = {"step": step, "pairs": pairs, "epochs": round(pairs / self.distinct_pairs, 3), "tokens": seen,
                 "train_s": round(self.train_s, 1),
                 "tokens_per_s": round(seen / self.train_s) if self.train_s else None,
                 "eval_s": round(time.perf_counter() - t0, 1), **summarise(marks),
                 "examples": [{"oracle": a, "model": r} for r, a in list(zip(responses, self.actions))[:3]]}
        self.points.append(point)
        with self.jsonl.open("a") as f:
            f.write(json.dumps(point) + "\n")
        print(f"[sft-curve] step {step} pairs {pairs} tokens {seen} train {self.train_s:.0f}s: exact "
              f"{point['exact']:.3f} element {point['element']:.3f} typed {point['typed_args']:.3f} well-formed "
              f"{point['well_formed']:.3f} stops {point['stops']:.3f} id when named {point['grounding']:.3f} "
              f"({point['eval_s']:.0f}s)", flush=True)
        return point

    def on_step_begin(self, args, state, control, **kw):
        self._t = time.perf_counter()

    def on_step_end(self, args, state, control, model=None, processing_class=None, **kw):
        self.train_s += time.perf_counter() - self._t
        if self.budget_s is not None and self.train_s >= self.budget_s:
            control.should_training_stop = True  # on_train_end measures this step
        elif state.global_step % self.every == 0 and state.global_step < state.max_steps:
            self.measure(model, processing_class, state.global_step)

    def on_train_begin(self, args, state, control, model=None, processing_class=None, **kw):
        self.measure(model, processing_class, 0)

    def on_train_end(self, args, state, control, model=None, processing_class=None, **kw):
        self.measure(model, processing_class, state.global_step)


def plot(points: list[dict], path: Path, title: str) -> Path:
    """The curve: each mark against the training pairs seen."""
    return plot_marks(points, [p["pairs"] for p in points], path, title, "training pairs seen")


def plot_marks(rows: list[dict], xs: list, path: Path, title: str, xlabel: str,
               ticklabels: list[str] | None = None, width: float = 7) -> Path:
    """One line per mark (``MARKS``) over ``rows`` placed at ``xs``; ``ticklabels`` names categorical xs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(width, 4))
    for key in MARKS:
        ax.plot(xs, [r[key] for r in rows], marker="o", label=key)
    if ticklabels is not None:
        ax.set_xticks(list(xs), ticklabels, fontsize=8, rotation=20)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("share of validation steps")
    ax.set_ylim(0, 1)
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def confirm(settings, run_dir: str, actor_dir: Path, demo_intents: set[str], n_tasks: int) -> dict:
    """Task success of the trained actor: greedy rollouts (``policy.eval_temperature``) on ``n_tasks`` validation
    tasks, scored by the sites' evaluators, with prompts in the run's format."""
    from webrl_core.artifacts import ArtifactRef
    from benchmarks.sft import validation_tasks
    from webrl_core.pipeline import experience

    val_ref = validation_tasks(settings, run_dir, n_tasks, demo_intents)
    t0 = time.perf_counter()
    roll = experience.rollout(settings, run_dir, 0, "eval", val_ref, ArtifactRef.of(actor_dir, "model"),
                              settings.policy.eval_temperature)
    return {"val_tasks_solved": roll["env_success"], "val_tasks": roll["n"], "val_errors": roll["errors"],
            "val_rollout_s": round(time.perf_counter() - t0, 1)}


def sample_validation(settings, val: list[dict], val_steps: int) -> list[dict]:
    """The ``val_steps`` validation steps every point scores (seeded by ``run.seed``)."""
    return random.Random(settings.run.seed).sample(val, min(val_steps, len(val)))


def renderer(settings, tok):
    """(render, format key): a step's prompt in ``settings.prompt``'s format, as the policy would see it."""
    from webrl_core.prompts import build_prompt, prompt_format

    fmt, budget = prompt_format(settings, tok), settings.env.obs_char_budget
    return (lambda s: build_prompt(s["intent"], s["past"], s["html"], budget, compat=fmt)), fmt.key


def train_curve(settings, tok, pairs: list[tuple[str, str]], distinct_pairs: int, val: list[tuple[str, str]],
                base: str | Path, actor_dir: Path, out: Path, head: dict, every: int,
                budget_s: float | None = None,
                every_epochs: float | None = None) -> tuple[dict, NextActionCurve, dict]:
    """Train ``base`` on ``pairs`` (already shuffled, prompts rendered) with the curve measured on ``val``
    (prompt, oracle action); returns (the run's head with its data sizes, the curve, sft_train's metrics).
    ``every_epochs`` places a point every that many epochs of the ``distinct_pairs`` instead of ``every`` steps."""
    from webrl_core.learn.sft_augment import sft_passes
    from webrl_core.learn.models import encode_prompt_action
    from webrl_core.learn.sft_trainer import sft_train
    from webrl_core.learn.trainer_utils import actor_micro_batches

    train_pairs, epochs = sft_passes(settings, pairs)  # entity-swapped passes as the bootstrap's SFT makes them
    lengths = [len(encode_prompt_action(tok, p, a, settings.models.max_length)["input_ids"]) for p, a in train_pairs]
    prompt_tokens = [len(tok(p)["input_ids"]) for p, _ in val]
    micro, accum = actor_micro_batches(settings)
    if every_epochs is not None:
        if every_epochs <= 0:
            raise ValueError(f"bench sft-curve --every-epochs {every_epochs}: must be > 0")
        every = max(1, math.ceil(distinct_pairs * every_epochs / (micro * accum)))
    out.parent.mkdir(parents=True, exist_ok=True)
    jsonl = out.with_suffix(".jsonl")
    jsonl.unlink(missing_ok=True)
    curve = NextActionCurve([p for p, _ in val], [a for _, a in val], settings, every, jsonl, lengths,
                            micro * accum, distinct_pairs=distinct_pairs, budget_s=budget_s)
    head = {**head, "train_pairs": distinct_pairs, "val_steps": len(val),
            "median_prompt_tokens": statistics.median(prompt_tokens), "max_prompt_tokens": max(prompt_tokens),
            "median_pair_tokens": statistics.median(lengths), "lr": settings.bootstrap.sft_lr,
            "epochs": settings.bootstrap.sft_epochs, "entity_swap": settings.bootstrap.sft_entity_swap,
            "train_layers": settings.models.train_layers, "lora": settings.models.lora.enabled,
            "dtype": settings.models.dtype, "batch": micro * accum, "budget_s": budget_s}
    print(f"[sft-curve] {json.dumps(head)}", flush=True)
    metrics = sft_train(train_pairs, base, actor_dir, settings, epochs=epochs, callbacks=[curve])
    return head, curve, metrics


def _finish(head: dict, curve: NextActionCurve, metrics: dict, out: Path, t0: float, extra: dict) -> dict:
    result = {**head, "wall_s": round(time.perf_counter() - t0, 1), "train_loss": metrics.get("train_loss"),
              **extra, "points": curve.points}
    out.with_suffix(".json").write_text(json.dumps(result, indent=2))
    _print(result)
    return result


def _title(head: dict, settings) -> str:
    return f"{head['label'] or head['prompt_format']}: lr {settings.bootstrap.sft_lr:g}, {head['device']}"


def run(settings, run_dir: str | Path, demos: int, val_tasks: int, val_steps: int, every: int,
        out: str | Path, label: str = "", val_rollouts: int = 0, budget_s: float | None = None,
        every_epochs: float | None = None) -> list[dict]:
    """Collect (or reuse) the steps, render prompts in ``settings.prompt``'s format, train with the curve; with
    ``val_rollouts``, confirm the trained actor by task success on that many validation tasks."""
    import torch

    from webrl_core.artifacts import ArtifactRef
    from webrl_core.hardware import device_summary
    from webrl_core.learn.models import load_tokenizer
    from webrl_core.runs import tracking

    run_dir, out = str(run_dir), Path(out)
    if not settings.models.actor:
        raise ValueError("bench sft-curve measures a pretrained actor (models.actor); this config has none")
    train, val, demo_intents = collect(settings, run_dir, demos, val_tasks)
    val = sample_validation(settings, val, val_steps)
    tok = load_tokenizer(settings.models.actor)
    render, fmt_key = renderer(settings, tok)
    pairs = [(render(s), s["action"]) for s in train]
    random.Random(settings.run.seed).shuffle(pairs)
    head = {"label": label, "device": device_summary(settings.models.device),
            "torch_threads": torch.get_num_threads(), "prompt_format": fmt_key, "demos": demos}
    actor_dir = Path(run_dir) / "sft-curve" / (label or "actor")
    with tracking.start_run(run_dir, f"sft-curve {label or fmt_key}", experiment="webrl-bench",
                            config=settings.model_dump(mode="json")):
        t0 = time.perf_counter()
        head, curve, metrics = train_curve(settings, tok, pairs, len(train), [(render(s), s["action"]) for s in val],
                                           ArtifactRef.of(settings.models.actor, "model").path, actor_dir, out,
                                           head, every, budget_s, every_epochs)
        tracking.log_metrics({k: v for k, v in head.items() if isinstance(v, (int, float))})
        confirmed = confirm(settings, run_dir, actor_dir, demo_intents, val_rollouts) if val_rollouts else {}
        tracking.log_metrics({k: v for k, v in confirmed.items()})
        for p in curve.points:
            tracking.log_metrics({k: p[k] for k in (*MARKS, "tokens")}, step=p["pairs"])
        png = plot(curve.points, out.with_suffix(".png"), _title(head, settings))
        tracking.log_artifact(png, "sft-curve")
        tracking.log_artifact(out.with_suffix(".jsonl"), "sft-curve")
    return _finish(head, curve, metrics, out, t0, {"actor": str(actor_dir), **confirmed})["points"]


FOLDER_FILES = ("train_pairs.jsonl", "val_steps.jsonl", "settings.yaml", "export.json")
"""What ``export`` writes and ``run_folder`` reads."""


def export(settings, run_dir: str | Path, demos: int, val_tasks: int, val_steps: int, out: str | Path) -> dict:
    """The portable folder ``out``: the demonstrations' steps (each with the index of its demonstration) and the
    sampled validation steps, prompts rendered in ``settings.prompt``'s format, and the settings. ``run_folder``
    trains from it on a machine without Chromium, the sites or the trajectory store (a GPU box)."""
    import yaml

    from webrl_core.learn.models import load_tokenizer

    if not settings.models.actor:
        raise ValueError("bench sft-curve measures a pretrained actor (models.actor); this config has none")
    train, val, _ = collect(settings, str(run_dir), demos, val_tasks)
    val = sample_validation(settings, val, val_steps)
    render, fmt_key = renderer(settings, load_tokenizer(settings.models.actor))
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    write_jsonl([{"prompt": render(s), "action": s["action"], "demo": s["demo"]} for s in train],
                out / "train_pairs.jsonl")
    write_jsonl([{"prompt": render(s), "action": s["action"]} for s in val], out / "val_steps.jsonl")
    (out / "settings.yaml").write_text(yaml.safe_dump(settings.model_dump(mode="json"), sort_keys=False))
    summary = {"demos": demos, "train_pairs": len(train), "val_tasks": val_tasks, "val_steps": len(val),
               "prompt_format": fmt_key}
    (out / "export.json").write_text(json.dumps(summary, indent=2))
    return summary


def run_folder(folder: str | Path, out: str | Path, sets: list[str] = (), model: str | None = None,
               demos: int | None = None, every: int = 40, label: str = "",
               budget_s: float | None = None, actor_dir: str | Path | None = None,
               every_epochs: float | None = None) -> list[dict]:
    """The curve from an ``export`` folder: the SFT of ``model`` (default: the folder settings' ``models.actor``)
    on the steps of the folder's first ``demos`` demonstrations (all by default), measured on its validation
    steps. ``sets`` override the folder's settings (``models.device=cuda``, ``bootstrap.sft_epochs=4``). The trained
    actor goes to ``actor_dir`` (default: ``<out>-actor`` beside ``out``)."""
    import torch

    from webrl_core.artifacts import ArtifactRef
    from webrl_core.config_loader import load_config
    from webrl_core.hardware import device_summary
    from webrl_core.learn.models import load_tokenizer

    folder, out = Path(folder), Path(out)
    for name in FOLDER_FILES:
        if not (folder / name).is_file():
            raise FileNotFoundError(f"bench sft-curve: {folder / name} is missing; make the folder with "
                                    f"`webrl bench sft-curve-export`")
    settings = load_config(folder / "settings.yaml", sets=[*sets, *([f"models.actor={model}"] if model else [])])
    exported = json.loads((folder / "export.json").read_text())
    rows = read_jsonl(folder / "train_pairs.jsonl")
    demos = exported["demos"] if demos is None else demos
    if not 0 < demos <= exported["demos"]:
        raise ValueError(f"bench sft-curve --demos {demos}: the folder {folder} holds {exported['demos']} "
                         f"demonstrations")
    pairs = [(r["prompt"], r["action"]) for r in rows if r["demo"] < demos]
    random.Random(settings.run.seed).shuffle(pairs)
    val = [(r["prompt"], r["action"]) for r in read_jsonl(folder / "val_steps.jsonl")]
    base = ArtifactRef.of(settings.models.actor, "model").path
    head = {"label": label, "device": device_summary(settings.models.device),
            "torch_threads": torch.get_num_threads(), "prompt_format": exported["prompt_format"], "demos": demos,
            "folder": str(folder)}
    t0 = time.perf_counter()
    head, curve, metrics = train_curve(settings, load_tokenizer(base), pairs, len(pairs), val, base,
                                       Path(actor_dir or out.parent / f"{out.name}-actor"), out, head, every,
                                       budget_s, every_epochs)
    plot(curve.points, out.with_suffix(".png"), _title(head, settings))
    return _finish(head, curve, metrics, out, t0, {})["points"]


def _print(r: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"webrl bench sft-curve {r['label']} ({r['prompt_format']}, median prompt "
                    f"{r['median_prompt_tokens']} tokens, {r['device']})")
    for col in ("pairs", "epochs", "tokens", "train s", "tokens/s", "exact", "element", "typed args", "well-formed",
                "stops", "id when named"):
        t.add_column(col, justify="right")
    for p in r["points"]:
        t.add_row(str(p["pairs"]), f"{p['epochs']:.2f}", str(p["tokens"]), f"{p['train_s']:.0f}",
                  str(p["tokens_per_s"] or "-"), f"{100 * p['exact']:.1f}%", f"{100 * p['element']:.1f}%",
                  share_of(p, "typed_args"), f"{100 * p['well_formed']:.1f}%", share_of(p, "stops"),
                  share_of(p, "grounding"))
    Console().print(t)
    if "val_tasks" in r:
        print(f"validation tasks solved (greedy rollouts, the sites' evaluators): {r['val_tasks_solved']}/"
              f"{r['val_tasks']} in {r['val_rollout_s']:.0f} s")

"""`webrl bench copy`: does the SFT actor copy the names its intent gives it? A teacher-forced check that needs no
browser, so one exported folder can be trained and checked on another machine (a GPU box without Chromium).

Nearly every task names an entity that must be typed (a product, a project, a customer), and a from-scratch
model tends to type a memorised name instead (``bench sft``'s ``arg_from_intent``). This bench measures that on
the oracle's own steps of validation tasks (the training pool, intents unlike the demonstrations'), so every
model is scored on the same prompts:

  - ``action_match``: the greedy response (``policy.eval_temperature`` is not used: always greedy) equals the
    oracle's action;
  - on the steps whose oracle action types an ``argument="..."``: ``arg_exact`` (the same argument) and
    ``arg_from_intent`` (the typed argument occurs in the intent);
  - the entity probe, where the oracle's argument is one entity token (``models.embedded.entity_tokens``): the
    model is given the oracle's response up to ``argument="`` and the oracle's entity is ranked among all entity
    tokens by the next-token logits. ``top1``/``top5`` shares, median rank, mean probability. A model that copies
    puts the intent's entity first. ``chance_*`` is a model that knows which kind of name goes there but not
    which one: the entity uniform among the names of its kind (rank (n_kind + 1) / 2, top-k share k / n_kind).

Two halves:
  - ``export(settings, run_dir, demos, val_tasks, out)``: the bootstrap's own stages (oracle demonstrations, the
    run's tokenizer) and oracle rollouts of the validation tasks, written as a portable folder: ``tokenizer/``,
    ``train_pairs.jsonl`` (prompt, action), ``val_steps.jsonl`` (prompt, action, intent), ``entity_kinds.json``
    and ``settings.yaml``;
  - ``run(folder, sizes, sets)``: per model size (hidden, intermediate, layers, heads) the embedded model is built
    from the folder's tokenizer, trained by ``training.sft_train`` as the bootstrap trains it (entity-swapped
    passes when ``bootstrap.sft_entity_swap`` is set), then checked.
"""

from __future__ import annotations

import json
import re
import statistics
import tempfile
import time
from collections import Counter
from pathlib import Path

import yaml

from webrl_core.artifacts import read_jsonl, write_jsonl

ARGUMENT_START = re.compile(r'argument\s*=\s*"')
SIZE_FIELDS = ("hidden_size", "intermediate_size", "num_layers", "num_heads")


def export(settings, run_dir: str | Path, demos: int, val_tasks: int, out: str | Path) -> dict:
    """Run the bootstrap stages for ``demos`` oracle demonstrations and ``val_tasks`` validation tasks and write
    the portable folder ``out`` (module docstring)."""
    from webrl_core.artifacts import read_json
    from benchmarks.sft import validation_tasks
    from webrl_core.learn.models import load_tokenizer
    from webrl_core.pipeline import bootstrap, experience, task_sets
    from webrl_core.sites.data import entity_kinds
    from webrl_core.runs.store import TrajectoryStore
    from webrl_core.websites import is_success

    run_dir, out = str(run_dir), Path(out)
    demo_ref = task_sets.train_task_pool(settings, run_dir, demos, 1, f"bench_sft_demos_{demos}")
    demo_roll = experience.rollout(settings, run_dir, 0, "oracle", demo_ref, None, 0.0)
    tok_ref = bootstrap.build_tokenizer(settings, run_dir, {"episode_ids": demo_roll["episode_ids"]})
    val_ref = validation_tasks(settings, run_dir, val_tasks, {t["intent"] for t in read_json(demo_ref)})
    val_roll = experience.rollout(settings, run_dir, 0, "oracle", val_ref, None, 0.0)
    store = TrajectoryStore(run_dir)

    def successful_steps(ids: list[str]) -> list[dict]:
        rows = store.sql("SELECT e.intent, e.env_score, s.prompt, s.response AS action FROM steps s JOIN episodes e "
                         "USING (episode_id) WHERE e.episode_id IN (SELECT unnest($ids)) ORDER BY s.episode_id, s.idx",
                         {"ids": ids})
        return [{k: r[k] for k in ("intent", "prompt", "action")} for r in rows if is_success(r["env_score"])]

    train, val = successful_steps(demo_roll["episode_ids"]), successful_steps(val_roll["episode_ids"])
    if not train or not val:
        raise RuntimeError(f"bench copy export: {len(train)} demonstration steps and {len(val)} validation steps "
                           f"succeeded; both are needed")
    out.mkdir(parents=True, exist_ok=True)
    load_tokenizer(tok_ref.path).save_pretrained(str(out / "tokenizer"))
    write_jsonl([{"prompt": r["prompt"], "action": r["action"]} for r in train], out / "train_pairs.jsonl")
    write_jsonl(val, out / "val_steps.jsonl")
    (out / "entity_kinds.json").write_text(json.dumps(entity_kinds(settings.sites.data_seed)))
    (out / "settings.yaml").write_text(yaml.safe_dump(settings.model_dump(mode="json"), sort_keys=False))
    summary = {"demos": demos, "demo_steps": len(train), "val_tasks": val_tasks, "val_steps": len(val),
               "oracle_solved": demo_roll["env_success"], "val_oracle_solved": val_roll["env_success"]}
    (out / "export.json").write_text(json.dumps(summary, indent=2))
    return summary


def parse_size(spec: str) -> dict[str, int]:
    """``"768,2048,8,12"`` -> the ``models.embedded`` size fields (hidden, intermediate, layers, heads)."""
    parts = spec.split(",")
    if len(parts) != 4 or not all(p.strip().isdigit() for p in parts):
        raise ValueError(f"--size {spec!r}: expected hidden,intermediate,layers,heads (four integers)")
    return dict(zip(SIZE_FIELDS, (int(p) for p in parts)))


def run(folder: str | Path, sizes: list[dict[str, int]] | None = None, sets: list[str] = (),
        out: str | Path | None = None) -> list[dict]:
    """Train one embedded actor per size on the folder's demonstrations and check each (module docstring)."""
    from webrl_core.config_loader import load_config

    folder = Path(folder)
    for name in ("tokenizer", "train_pairs.jsonl", "val_steps.jsonl", "entity_kinds.json", "settings.yaml"):
        if not (folder / name).exists():
            raise FileNotFoundError(f"bench copy: {folder / name} is missing; make the folder with "
                                    f"`webrl bench copy-export`")
    settings = load_config(folder / "settings.yaml", sets=list(sets))
    pairs = [(r["prompt"], r["action"]) for r in read_jsonl(folder / "train_pairs.jsonl")]
    val = read_jsonl(folder / "val_steps.jsonl")
    kinds = json.loads((folder / "entity_kinds.json").read_text())
    rows = []
    for size in sizes or [{f: getattr(settings.models.embedded, f) for f in SIZE_FIELDS}]:
        s = settings.model_copy(deep=True)
        s.models.embedded = s.models.embedded.model_copy(update=size)
        rows.append(train_and_check(s, folder, pairs, val, kinds))
        _print(rows)
        if out:
            Path(out).write_text(json.dumps(rows, indent=2))
    return rows


def train_and_check(settings, folder: Path, pairs: list[tuple[str, str]], val: list[dict],
                    kinds: dict[str, str]) -> dict:
    """Build the embedded model of ``settings.models.embedded``, SFT it like ``bootstrap.sft_actor``, check it."""
    from webrl_core.learn.sft_augment import augmented_sft_passes
    from webrl_core.learn.embedded_model import build_embedded_model
    from webrl_core.learn.sft_trainer import sft_train

    emb, boot = settings.models.embedded, settings.bootstrap
    work = Path(tempfile.mkdtemp(prefix="bench-copy-"))
    base = build_embedded_model(folder / "tokenizer", emb, work / "init", seed=settings.run.seed)
    train_pairs, epochs = augmented_sft_passes(pairs, kinds, boot.sft_epochs, boot.sft_entity_swap,
                                               boot.sft_list_shuffle, seed=settings.run.seed)
    t0 = time.perf_counter()
    metrics = sft_train(train_pairs, base, work / "actor", settings, epochs=epochs)
    sft_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    check = copy_check(work / "actor", settings, val, kinds)
    return {"size": ",".join(str(getattr(emb, f)) for f in SIZE_FIELDS), "params": metrics.get("total_params"),
            "sft_pairs": len(train_pairs), "sft_tokens": metrics.get("tokens"), "sft_s": round(sft_s, 1),
            "sft_loss": round(metrics.get("train_loss") or float("nan"), 4), "check_s": round(time.perf_counter() - t0, 1),
            "device": settings.models.device, "dtype": settings.models.dtype, **check}


def copy_check(model_dir: str | Path, settings, val: list[dict], kinds: dict[str, str]) -> dict:
    """Greedy action match, typed-argument copying and the entity rank probe on the validation steps; ``kinds``:
    entity name -> kind (``sites.data.entity_kinds``)."""
    import torch

    from webrl_core.learn.models import encode_prompt
    from webrl_core.agent.policy import HFPolicy

    policy = HFPolicy(model_dir, cfg=settings.policy, models_cfg=settings.models, temperature=0.0)
    responses = policy.generate([r["prompt"] for r in val], temperature=0.0)
    typed = exact = from_intent = 0
    for r, resp in zip(val, responses):
        want = _argument(r["action"])
        if want is None:
            continue
        got = _argument(resp)
        typed += 1
        exact += got == want
        from_intent += bool(got) and got.lower() in r["intent"].lower()
    tok, model = policy.tok, policy.model
    ids = {n: tok.convert_tokens_to_ids(n) for n in kinds}
    ids = {n: i for n, i in ids.items() if isinstance(i, int) and i != tok.unk_token_id}
    ranks, probs, kind_sizes = [], [], []
    per_kind = Counter(kinds[n] for n in ids)
    if ids:
        cand = torch.tensor(sorted(set(ids.values())), device=policy.device)
        with torch.no_grad():
            for r in val:
                want, m = _argument(r["action"]), ARGUMENT_START.search(r["action"])
                if want not in ids or m is None:
                    continue
                prefix = encode_prompt(tok, r["prompt"], policy.max_prompt_tokens) + \
                    tok(r["action"][:m.end()], add_special_tokens=False)["input_ids"]
                logits = model(input_ids=torch.tensor([prefix], device=policy.device)).logits[0, -1].float()
                scores = logits[cand]
                target = scores[(cand == ids[want]).nonzero()[0, 0]]
                ranks.append(int((scores > target).sum()) + 1)
                kind_sizes.append(per_kind[kinds[want]])
                probs.append(float(torch.softmax(logits, -1)[ids[want]]))
    n = len(val)
    return {"val_steps": n, "action_match": round(sum(a.strip() == b["action"].strip()
                                                      for a, b in zip(responses, val)) / max(1, n), 3),
            "typed": typed, "arg_exact": round(exact / max(1, typed), 3),
            "arg_from_intent": round(from_intent / max(1, typed), 3),
            "probe_steps": len(ranks), "n_entities": len(ids),
            "top1": round(sum(k == 1 for k in ranks) / max(1, len(ranks)), 3),
            "top5": round(sum(k <= 5 for k in ranks) / max(1, len(ranks)), 3),
            "median_rank": statistics.median(ranks) if ranks else None,
            "mean_p": round(statistics.fmean(probs), 4) if probs else None,
            "chance_median_rank": statistics.median((k + 1) / 2 for k in kind_sizes) if kind_sizes else None,
            "chance_top1": round(statistics.fmean(1 / k for k in kind_sizes), 3) if kind_sizes else None,
            "chance_top5": round(statistics.fmean(min(1.0, 5 / k) for k in kind_sizes), 3) if kind_sizes else None}


def _argument(action: str) -> str | None:
    m = ARGUMENT_START.search(action or "")
    if m is None:
        return None
    end = action.find('"', m.end())
    return action[m.end():end] if end >= 0 else action[m.end():]


def _print(rows: list[dict]) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title="webrl bench copy (oracle steps of validation tasks, greedy, teacher-forced probe)")
    for col in ("size", "params", "device", "SFT s", "loss", "action match", "arg exact", "arg from intent",
                "probe top-1", "top-5", "median rank", "kind chance: top-5, rank"):
        t.add_column(col, justify="right")
    for r in rows:
        t.add_row(r["size"], f"{(r['params'] or 0) / 1e6:.1f}M", f"{r['device']}/{r['dtype']}", f"{r['sft_s']:.0f}",
                  f"{r['sft_loss']:.3f}", f"{100 * r['action_match']:.1f}%",
                  f"{100 * r['arg_exact']:.1f}% of {r['typed']}", f"{100 * r['arg_from_intent']:.1f}%",
                  f"{100 * r['top1']:.1f}% of {r['probe_steps']}", f"{100 * r['top5']:.1f}%",
                  f"{r['median_rank']} of {r['n_entities']}",
                  f"{100 * (r['chance_top5'] or 0):.1f}%, {r['chance_median_rank']}")
    Console().print(t)

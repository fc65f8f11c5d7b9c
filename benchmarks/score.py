"""`webrl bench score`: perplexity and ORM scoring throughput, ours vs the official method.

Both methods run in one process on the same embedded tiny Llama (random weights; default ``EmbeddedModelConfig``,
tokenizer trained on the synthetic corpus) and the same N synthetic steps (prompts from ``build_prompt`` with
simplified-HTML observations of ``html_chars`` characters and 0-6 past responses):

- official perplexity: one item at a time, joint string + prompt tokenised again, [T, V] logits for the whole
  sequence (``replay.official_perplexity``);
- ours: length-sorted left-padded micro-batches, LM head only at the action positions (``replay.inverse_perplexity``);
- official ORM: one prompt at a time, [T, V] logits for the whole sequence (``orm.official_orm_p_yes``);
- ours: length-sorted micro-batches, LM head only at the last position (``orm.OrmScorer.p_yes``).

Our micro-batch size is chosen by measurement: every candidate is timed on the same calibration subset (two
interleaved rounds, best kept) and the fastest is used for the full run. The full run alternates the two methods
over chunks of 32 items, so load from other processes on a shared CPU hits both alike. Ratios are items/s(ours) / items/s(official); agreement is the max |difference|.
"""

from __future__ import annotations

import json
import random
import tempfile
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from webrl_core.config import EmbeddedModelConfig, ModelsConfig, OrmConfig
from webrl_core.learn.models import load_causal_lm, load_tokenizer, n_params
from webrl_core.learn.embedded_model import build_embedded_model, train_embedded_tokenizer
from webrl_core.learn.orm import OrmScorer, official_orm_p_yes
from webrl_core.prompts import build_orm_prompt, build_prompt
from webrl_core.learn.replay import inverse_perplexity, official_perplexity

_WORDS = ("red blue green compact wireless organic leather steel vintage smart classic portable deluxe mini shoe "
          "lamp chair phone cable bottle jacket watch kettle speaker notebook pillow blender camera order review "
          "issue merge branch forum post comment price total customer address").split()
_TAGS = ("div", "a", "button", "span", "li", "td", "p", "input", "label", "h2")


def _page(rng: random.Random, size: int) -> str:
    parts, n = ["<html><body>"], 0
    while sum(map(len, parts)) < size:
        tag = rng.choice(_TAGS)
        text = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(1, 6)))
        parts.append(f'<{tag} id="{n}">{text}</{tag}>' if tag != "input" else
                     f'<input id="{n}" type="text" placeholder="{text}">')
        n += 1
    return "".join(parts)[:size] + "</body></html>"


def _response(rng: random.Random) -> str:
    el = rng.randint(0, 200)
    kind = rng.random()
    if kind < 0.5:
        act = f'do(action="Click", element="{el}")'
    elif kind < 0.85:
        act = f'do(action="Type", argument="{" ".join(rng.choice(_WORDS) for _ in range(2))}", element="{el}")'
    else:
        act = f'exit(message="{rng.choice(_WORDS)}")'
    return f"# Element: the {rng.choice(_WORDS)} {rng.choice(_TAGS)}\n{act}"


def synthetic_steps(n: int, html_chars: tuple[int, int], seed: int) -> list[dict]:
    """N steps with realistic prompt structure: intent, 0-6 past responses, current HTML, the action."""
    rng = random.Random(seed)
    steps = []
    for i in range(n):
        intent = f"Find the {' '.join(rng.choice(_WORDS) for _ in range(3))} and report its {rng.choice(_WORDS)}"
        past = [_response(rng) for _ in range(rng.randint(0, 6))]
        html = _page(rng, rng.randint(*html_chars))
        steps.append({"intent": intent, "past": past, "html": html, "response": _response(rng),
                      "prompt": build_prompt(intent, past, html)})
    return steps


def _timed(fn):
    t = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t


def _interleaved(ours, official, items: list, chunk: int = 32) -> tuple[list, float, list, float]:
    """Time both methods chunk by chunk, alternating which goes first, so a busy shared CPU slows both alike."""
    out_o, out_f, t_o, t_f = [], [], 0.0, 0.0
    for k, start in enumerate(range(0, len(items), chunk)):
        part = items[start:start + chunk]
        for which in ((0, 1) if k % 2 == 0 else (1, 0)):
            res, dt = _timed(lambda: (ours if which == 0 else official)(part))
            if which == 0:
                out_o, t_o = out_o + res, t_o + dt
            else:
                out_f, t_f = out_f + res, t_f + dt
    return out_o, t_o, out_f, t_f


def run(n: int = 512, batch_sizes: list[int] = (1, 2, 4, 8, 16), html_chars: tuple[int, int] = (800, 6000),
        seed: int = 0, threads: int = 0, out: str | None = None, calib: int = 64) -> dict:
    console = Console()
    if threads:
        torch.set_num_threads(threads)
    steps = synthetic_steps(n, html_chars, seed)
    emb = EmbeddedModelConfig()
    with tempfile.TemporaryDirectory(prefix="webrl-bench-score-") as tmp:
        corpus = [s["prompt"] + s["response"] for s in steps[:200]]
        train_embedded_tokenizer(corpus, emb.vocab_size, Path(tmp) / "tok")
        model_dir = build_embedded_model(Path(tmp) / "tok", emb, Path(tmp) / "model", seed=seed)
        mcfg = ModelsConfig(max_length=emb.max_length, device="cpu")
        tok = load_tokenizer(model_dir)
        model = load_causal_lm(model_dir, mcfg)
    pairs = [(s["prompt"], s["response"]) for s in steps]
    orm_prompts = [build_orm_prompt(s["intent"], s["past"] + [s["response"]], s["html"]) for s in steps]
    lens = [len(tok.encode(p + a)) for p, a in pairs]
    console.print(f"model: embedded {emb.arch}, {n_params(model) / 1e6:.1f}M params, vocab {len(tok)}, "
                  f"{torch.get_num_threads()} torch threads; {n} steps, prompt+action tokens "
                  f"min {min(lens)} / mean {sum(lens) / len(lens):.0f} / max {max(lens)}")
    # calibration subset: a random sample, so its length mix matches the full set
    calib_idx = random.Random(seed).sample(range(n), min(calib, n))
    scorer = OrmScorer(model=model, tokenizer=tok, cfg=OrmConfig(), models_cfg=mcfg)
    inverse_perplexity(model, tok, pairs[:4], mcfg.max_length, 4)  # warm-up (allocator, kernels)
    res: dict = {"n": n, "params": n_params(model), "threads": torch.get_num_threads(),
                 "mean_tokens": sum(lens) / len(lens), "calibration": {}}
    for kind in ("perplexity", "orm"):
        table: dict[int, float] = {}
        for _round in range(2):  # two interleaved rounds; the best of each is kept (noise on a shared CPU)
            for bs in batch_sizes:
                if kind == "perplexity":
                    _, dt = _timed(lambda: inverse_perplexity(model, tok, [pairs[i] for i in calib_idx],
                                                              mcfg.max_length, bs))
                else:
                    _, dt = _timed(lambda: scorer.p_yes([orm_prompts[i] for i in calib_idx], batch_size=bs))
                table[bs] = max(table.get(bs, 0.0), len(calib_idx) / dt)
        for bs in batch_sizes:
            console.print(f"  calibrate {kind:10s} micro-batch {bs:3d}: {table[bs]:7.1f} items/s")
        res["calibration"][kind] = table
    best_ppl = max(res["calibration"]["perplexity"], key=res["calibration"]["perplexity"].get)
    best_orm = max(res["calibration"]["orm"], key=res["calibration"]["orm"].get)

    ours_ppl, t_ours_ppl, off_ppl, t_off_ppl = _interleaved(
        lambda part: inverse_perplexity(model, tok, part, mcfg.max_length, best_ppl),
        lambda part: official_perplexity(model, tok, part, mcfg.max_length), pairs)
    ours_orm, t_ours_orm, off_orm, t_off_orm = _interleaved(
        lambda part: scorer.p_yes(part, batch_size=best_orm),
        lambda part: official_orm_p_yes(model, tok, part, mcfg.max_length), orm_prompts)

    rows = [("perplexity (1/PPL)", best_ppl, n / t_ours_ppl, n / t_off_ppl,
             max(abs(a - b) for a, b in zip(ours_ppl, off_ppl))),
            ("ORM P(YES)", best_orm, n / t_ours_orm, n / t_off_orm,
             max(abs(a - b) for a, b in zip(ours_orm, off_orm)))]
    t = Table(title=f"scoring {n} steps, same model, same process (CPU)")
    for col in ("task", "our micro-batch", "ours items/s", "official items/s", "ratio", "max |diff|"):
        t.add_column(col)
    for name, bs, ours, off, diff in rows:
        t.add_row(name, str(bs), f"{ours:.1f}", f"{off:.1f}", f"{ours / off:.2f}x", f"{diff:.2e}")
        res[name.split()[0].lower()] = {"micro_batch": bs, "ours_items_s": ours, "official_items_s": off,
                                        "ratio": ours / off, "max_abs_diff": diff}
    console.print(t)
    if out:
        Path(out).write_text(json.dumps(res, indent=2, default=str))
    return res

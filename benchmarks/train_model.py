"""`webrl bench train --model FOLDER`: the three training stages of a phase on a real model, as shares of the
matmul peak measured in the same run.

Stages (the functions the pipeline calls, with the config's ``models``/``actor``/``critic``/``bootstrap``
settings and ``models.actor = FOLDER``): the bootstrap SFT (``training.sft_train``), the critic epoch
(``training.train_critic``, a fresh critic on FOLDER's backbone) and the KL-constrained actor stage
(``training.train_actor``: critic values, reference log-probs, the epoch). Data: synthetic WebRL steps
(``build_prompt`` over simplified-HTML pages, half of the episodes successful), tokenised by FOLDER's tokenizer.

Model FLOPs: each stage's own count (``learn/model_flops.py``: forward, the backward through the trained layers,
less the bottom layers' forward of rows found in the frozen-layer cache; the actor stage's critic values and
reference log-probs included). Share of peak = FLOPs / seconds / peak, the peak the best n x n torch.matmul rate
in the run's dtype (``hardware.matmul_peak_flops``), measured before and after the stages.

Tokens/s counts the tokens of the sequences trained (prompt and action). The official per-sample actor update
(``benchmarks.train.official_stage``) runs on the same samples for the ratio official/ours. Peak RSS per stage is the
process's high-water mark, reset before each stage (``/proc/self/clear_refs``).
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from benchmarks.op_profile import KINDS, limit_seconds, profiled, unavoidable_bytes
from benchmarks.train import official_stage, synthetic_trajectories
from webrl_core.config_loader import load_config
from webrl_core.hardware import copy_bandwidth, device_summary, matmul_peak_flops
from webrl_core.learn.critic_trainer import train_critic
from webrl_core.learn.models import encode_prompt_action, load_tokenizer, torch_dtype
from webrl_core.learn.sft_trainer import sft_train
from webrl_core.learn.transitions import build_transitions
from webrl_core.learn.webrl_trainer import train_actor

def random_init(src: str | Path, dest: str | Path, seed: int = 0, **fields) -> str:
    """A model folder with ``src``'s tokenizer and config, ``fields`` overriding the config's (``hidden_size=2048``,
    ...), and random weights. A stage's speed at a shape does not depend on the weights, so a GPU check of a shape
    needs no checkpoint: only the config and the tokenizer travel."""
    from transformers import AutoConfig, AutoModelForCausalLM

    src, dest = Path(src), Path(dest)
    cfg = AutoConfig.from_pretrained(src)
    for k, v in fields.items():
        if not hasattr(cfg, k):
            raise ValueError(f"{src / 'config.json'}: no field {k!r} to override")
        setattr(cfg, k, v)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg)
    dest.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(dest)
    for f in src.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens")) or f.name == "chat_template.jinja":
            shutil.copy(f, dest / f.name)
    return str(dest)


def reset_peak_rss() -> None:
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass  # not Linux: the peak is then the process's since start


def peak_rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _shape(folder: str) -> dict:
    from transformers import AutoConfig

    c = AutoConfig.from_pretrained(folder)
    return {"layers": c.num_hidden_layers, "hidden": c.hidden_size, "vocab": c.vocab_size}


def synthetic_pairs(episodes: int, seed: int, html_chars: tuple[int, int] = (1500, 4000), steps: int = 4
                    ) -> list[tuple[str, str]]:
    """The (prompt, action) SFT pairs of the bench's synthetic WebRL steps (the GPU probes' data)."""
    samples = build_transitions(synthetic_trajectories(episodes, steps, html_chars, seed), gamma=0.9)
    return [(s["observation"], s["action"]) for s in samples]


def run(model: str, config: str = "demo", sets: list[str] | None = None, episodes: int = 8, steps: int = 2,
        html_chars: tuple[int, int] = (1500, 4000), official: bool = True, seed: int = 0, threads: int = 0,
        out: str | None = None, profile: bool = False) -> dict:
    """The stages' rows; with ``profile`` each stage also runs under the CPU profiler and reports where its time
    goes and its distance from the box's limit (``bench.op_profile``)."""
    console = Console()
    if threads:
        torch.set_num_threads(threads)
    settings = load_config(config, sets=[f"models.actor={model}", f"run.seed={seed}", *(sets or [])])
    m = settings.models
    folder = str(m.actor)
    device = "cuda" if m.device in ("auto", "cuda") and torch.cuda.is_available() else "cpu"
    peak = matmul_peak_flops(torch_dtype(m.dtype), device, rounds=5)
    samples = build_transitions(synthetic_trajectories(episodes, steps, html_chars, seed), gamma=0.9)
    pairs = [(s["observation"], s["action"]) for s in samples]
    tok = load_tokenizer(folder)
    shape = _shape(folder)
    L, d = shape["layers"], shape["hidden"]
    L_t = min(m.train_layers, L) if m.train_layers else L
    pair_lens = [len(encode_prompt_action(tok, p, a, m.max_length)["input_ids"]) for p, a in pairs]
    cpu = device_summary(device)
    bandwidth = copy_bandwidth(device=device)
    console.print(f"{cpu}; copy bandwidth {bandwidth / 1e9:.1f} GB/s (read + written)")
    console.print(f"model {folder}: {L} layers, hidden {d}, training the top {L_t}; {m.dtype} ({m.dtype_why}); "
                  f"{len(samples)} samples, median {sorted(pair_lens)[len(pair_lens) // 2]} tokens; "
                  f"{m.dtype} matmul peak {peak / 1e9:.1f} GFLOP/s on {device}, {torch.get_num_threads()} threads")
    rows = []
    with tempfile.TemporaryDirectory(prefix="webrl-bench-train-model-") as tmp:
        tmp = Path(tmp)

        def stage(name: str, fn):
            reset_peak_rss()
            if device == "cuda":
                torch.cuda.reset_peak_memory_stats()
            t0 = time.perf_counter()
            if profile:
                stats, split, _, top = profiled(fn, device)
                stats["split_s"], stats["top_ops"] = split, top
            else:
                stats = fn()
            row = {"stage": name, "wall_s": time.perf_counter() - t0, "peak_rss_mb": peak_rss_mb(), **stats}
            gpu = ""
            if device == "cuda":
                row["peak_gpu_mb"] = torch.cuda.max_memory_allocated() / 2 ** 20
                gpu = f", peak GPU memory {row['peak_gpu_mb']:.0f} MB"
            console.print(f"  {name}: {row['tokens']} tokens in {row['seconds']:.1f}s = "
                          f"{row['tokens'] / row['seconds']:.0f} tokens/s, peak RSS {row['peak_rss_mb']:.0f} MB{gpu}")
            rows.append(row)
            return row

        def counts(st: dict) -> tuple[int, int]:
            n_emb = shape["vocab"] * d  # the input embedding is a lookup, not a matmul
            return st["total_params"] - n_emb, min(st["trainable_params"], st["total_params"] - n_emb)

        def sft():
            st = sft_train(pairs, folder, tmp / "sft", settings, epochs=1)
            n, n_t = counts(st)
            return {"tokens": st["tokens"], "seconds": st["train_s"], "steps": st["steps"], "params": (n, n_t),
                    "flops": st["flops"]}

        def critic():
            st = train_critic(samples, folder, tmp / "critic", settings)
            n, n_t = counts(st)  # its two small heads are counted as backbone parameters: a rounding error
            return {"tokens": st["tokens"], "seconds": st["train_s"], "steps": st["steps"], "params": (n, n_t),
                    "flops": st["flops"]}

        def actor():
            st = train_actor(samples, folder, tmp / "actor", settings, critic_dir=tmp / "critic", progress=False)
            n, n_t = counts(st)
            secs = st["critic_s"] + st["ref_s"] + st["train_s"]
            # the epochs, the reference pass and the critic values, each counted by the stage
            flops = st["flops"] + (st.get("ref_flops") or 0.0) + (st.get("critic_values_flops") or 0.0)
            return {"tokens": int(st["epochs"] * st["tokens"]), "seconds": secs, "flops": flops,
                    "steps": st["steps"], "params": (n, n_t),
                    "critic_s": st["critic_s"], "ref_s": st["ref_s"], "train_s": st["train_s"]}

        stage("sft", sft)
        stage("critic", critic)
        ours = stage("actor", actor)
        # re-measured after the stages: the best rate is the peak
        peak = max(peak, matmul_peak_flops(torch_dtype(m.dtype), device, rounds=5))
        result = {"model": folder, "cpu": cpu, "dtype": m.dtype, "device": device, "peak_flops": peak,
                  "copy_bytes_per_s": bandwidth, "layers": L, "trained_layers": L_t, "samples": len(samples)}
        if official:
            reset_peak_rss()
            off = official_stage(samples, Path(folder), tmp / "critic", settings, settings.actor.lr)
            result["official_actor_s"] = off["wall_s"]
            result["ratio_actor"] = off["wall_s"] / ours["seconds"]
            console.print(f"  official per-sample actor stage: {off['wall_s']:.1f}s, peak RSS {peak_rss_mb():.0f} MB;"
                          f" ours {ours['seconds']:.1f}s -> {result['ratio_actor']:.2f}x")
    compute_bytes = torch.tensor([], dtype=torch_dtype(m.dtype)).element_size()
    for r in rows:
        r["tokens_per_s"] = r["tokens"] / r["seconds"]
        r["peak_share"] = r["flops"] / r["seconds"] / peak
        r |= limit_seconds(r["flops"], peak, unavoidable_bytes(*r["params"], compute_bytes, r["steps"]), bandwidth)
        r["limit_share"] = r["limit_s"] / r["seconds"]
    tokens, seconds = sum(r["tokens"] for r in rows), sum(r["seconds"] for r in rows)
    result |= {"stages": rows, "tokens_per_s": tokens / seconds,
               "peak_share": sum(r["flops"] for r in rows) / seconds / peak}
    t = Table(title=f"training stages on {Path(folder).name} ({m.dtype}, {device}, peak {peak / 1e9:.0f} GFLOP/s)")
    for col in ("stage", "tokens", "seconds", "tokens/s", "share of peak", "limit (bound)", "share of limit",
                "peak GPU MB" if device == "cuda" else "peak RSS MB"):
        t.add_column(col, justify="left" if col == "stage" else "right")
    for r in rows:
        t.add_row(r["stage"], str(r["tokens"]), f"{r['seconds']:.1f}", f"{r['tokens_per_s']:.0f}",
                  f"{r['peak_share']:.0%}", f"{r['limit_s']:.1f}s ({r['bound']})", f"{r['limit_share']:.0%}",
                  f"{r['peak_gpu_mb' if device == 'cuda' else 'peak_rss_mb']:.0f}")
    console.print(t)
    if profile:
        split = Table(title=f"where the time goes (seconds under the profiler; {cpu})")
        for col in ("stage", *KINDS):
            split.add_column(col, justify="left" if col == "stage" else "right")
        for r in rows:
            total = sum(r["split_s"].values())
            split.add_row(r["stage"], *[f"{r['split_s'][k]:.1f} ({r['split_s'][k] / total:.0%})" for k in KINDS])
        console.print(split)
        where = "GPU" if device == "cuda" else "CPU"
        for r in rows:
            console.print(f"  {r['stage']}, most self {where} time: " + "; ".join(
                f"{o['name'][:60]} x{o['calls']} {o['self_gpu_s' if device == 'cuda' else 'self_cpu_s']:.2f}s"
                for o in r["top_ops"][:6]))
    if out:
        Path(out).write_text(json.dumps(result, indent=2, default=str))
    return result

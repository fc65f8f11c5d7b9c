"""`webrl bench train`: one WebRL actor-training stage, ours vs the official per-sample recomputation.

Same data (synthetic trajectories with realistic prompts: ``build_prompt`` over simplified-HTML pages, half of them
successful), same embedded model (default ``EmbeddedModelConfig`` Llama, random weights) as actor, reference and
critic backbone, one process, CPU fp32:

- official (repo ``WebRLTrainer``): for EVERY sample, batch 1 with gradient accumulation 2 -> critic forward on s
  and on s' (2 critic passes), a reference forward from a second copy of the model, an actor forward/backward with
  full-sequence [T, vocab] logits; the mask then zeroes the negative samples' loss;
- ours (``training.train_actor``): critic once per DISTINCT prompt (batched), reference log-probs batched from the
  actor itself before its first update, negative samples dropped, then the epoch in length-grouped left-padded
  micro-batches with the LM head only at the action positions.

Printed: both wall times (model load/save excluded), the ratio official/ours, and model-FLOPs utilisation
(PaLM's definition, attention included) against the best fp32 ``torch.matmul`` rate of large square matrices
measured in the same run::

    FLOPs of a sequence of T tokens:  train  6*N*T + 12*L*d*T^2      forward only  2*N*T + 4*L*d*T^2
    MFU = sum of the FLOPs of every pass / wall time / peak

with N = parameters without the input embedding (a lookup), L layers, d hidden size. MFU of the actor epoch alone
counts only the training passes. These are "model" FLOPs: our LM head runs only at the action positions, so we
execute fewer FLOPs than counted; the official path runs the full head. Same N and tokens for both."""

from __future__ import annotations

import json
import random
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from rich.console import Console
from rich.table import Table

from webrl_core.learn.advantage import cap_beta, official_advantage, official_beta, reference_prob
from benchmarks.score import _page, _response
from webrl_core.config import EmbeddedModelConfig
from webrl_core.config_loader import load_config
from webrl_core.hardware import matmul_peak_flops
from webrl_core.learn.critic import Critic
from webrl_core.learn.models import (autocast_context, encode_prompt, encode_prompt_action, load_causal_lm,
                                     load_tokenizer, n_params)
from webrl_core.learn.embedded_model import build_embedded_model, train_embedded_tokenizer
from webrl_core.learn.trainer_utils import actor_micro_batches
from webrl_core.learn.transitions import build_transitions
from webrl_core.learn.webrl_trainer import train_actor
from webrl_core.prompts import build_prompt


def synthetic_trajectories(episodes: int, steps: int, html_chars: tuple[int, int], seed: int):
    rng = random.Random(seed)
    out = []
    for e in range(episodes):
        intent = f"Find the {rng.choice(['red', 'blue', 'steel'])} {rng.choice(['lamp', 'chair', 'phone'])} #{e}"
        past, rows = [], []
        for k in range(steps):
            resp = _response(rng)
            rows.append({"idx": k, "prompt": build_prompt(intent, past, _page(rng, rng.randint(*html_chars))),
                         "response": resp})
            past.append(resp)
        out.append(({"episode_id": f"b{e}", "success": e % 2 == 0, "intent": intent, "phase": 1}, rows))
    return out


def official_stage(samples: list[dict], actor_dir: Path, critic_dir: Path, settings, lr: float) -> dict:
    """The repo's per-sample actor update: batch 1, GA 2, ref model copy, 2 critic passes, full logits."""
    mcfg = settings.models
    tok = load_tokenizer(actor_dir)
    actor = load_causal_lm(actor_dir, mcfg, trainable=True)
    ref = load_causal_lm(actor_dir, mcfg)
    critic = Critic.load(critic_dir, dtype=mcfg.dtype, device=mcfg.device, max_length=mcfg.max_length).eval()
    opt = torch.optim.AdamW([p for p in actor.parameters() if p.requires_grad], lr=lr, weight_decay=0.01)
    grad_accum, train_lens, fwd_lens = 2, [], []
    t0 = time.perf_counter()
    # the official trainer runs under the same mixed precision as ours (frozen weights in the compute dtype)
    with autocast_context(mcfg, next(actor.parameters()).device):
        for i, s in enumerate(samples):
            with torch.no_grad():
                vs = []
                for prompt in (s["observation"], s["next_observation"]):
                    ids = torch.tensor([critic.encode([prompt])[0]])
                    l1, l2 = critic(ids, torch.ones_like(ids))
                    vs.append(torch.minimum(F.softmax(l1, -1)[0, 1], F.softmax(l2, -1)[0, 1]))
                    fwd_lens.append(ids.shape[1])
            adv, mask = official_advantage(vs[0], vs[1], s["reward"], s["mc_return"], settings.actor.margin)
            enc = encode_prompt_action(tok, s["observation"], s["action"], mcfg.max_length)
            ids = torch.tensor([enc["input_ids"]])
            am = torch.tensor(enc["action_mask"][1:], dtype=torch.bool)
            tgt = ids[0, 1:]

            def seq_logp(model):
                logits = model(input_ids=ids, use_cache=False).logits[0, :-1].float()  # full [T, V] like the repo
                return torch.log_softmax(logits, -1).gather(-1, tgt[:, None])[:, 0][am].sum()

            with torch.no_grad():
                ref_logp = seq_logp(ref)
            fwd_lens.append(ids.shape[1])
            logp = seq_logp(actor)
            train_lens.append(ids.shape[1])
            n = am.sum().float()
            count = n if mask.item() > 0 else torch.tensor(1.0)
            log_ratio = (logp - ref_logp) / count
            beta = cap_beta(official_beta(adv, reference_prob(ref_logp, n)), adv, log_ratio)
            loss = F.smooth_l1_loss(beta * log_ratio, adv, reduction="none", beta=1.0) / beta * mask
            (loss / grad_accum).backward()
            if (i + 1) % grad_accum == 0 or i == len(samples) - 1:
                torch.nn.utils.clip_grad_norm_(actor.parameters(), settings.actor.max_grad_norm)
                opt.step()
                opt.zero_grad(set_to_none=True)
    return {"wall_s": time.perf_counter() - t0, "train_lens": train_lens, "forward_lens": fwd_lens}


def seq_flops(lengths: list[int], n: int, layers: int, d: int, train: bool) -> float:
    """PaLM model FLOPs of sequences: (6 or 2)*N*T + (12 or 4)*L*d*T^2 each."""
    a, b = (6, 12) if train else (2, 4)
    return float(sum(a * n * t + b * layers * d * t * t for t in lengths))


def _flop_params(model_dir: Path) -> tuple[int, int]:
    from transformers import AutoModelForCausalLM

    from webrl_core.learn.models import from_pretrained

    m = from_pretrained(AutoModelForCausalLM, model_dir)
    total = n_params(m)
    return total, total - m.get_input_embeddings().weight.numel()


def run(episodes: int = 16, steps: int = 4, html_chars: tuple[int, int] = (1500, 4000), batch_size: int = 8,
        micro_batch_size: int | None = None, lr: float = 1e-4, seed: int = 0, threads: int = 0,
        out: str | None = None) -> dict:
    console = Console()
    if threads:
        torch.set_num_threads(threads)
    trajs = synthetic_trajectories(episodes, steps, html_chars, seed)
    samples = build_transitions(trajs, gamma=0.9)
    emb = EmbeddedModelConfig()
    settings = load_config(sets=["models.device=cpu", f"models.max_length={emb.max_length}",
                                 f"actor.batch_size={batch_size}", f"critic.batch_size={batch_size}",
                                 f"actor.lr={lr}", "actor.loss=official", f"run.seed={seed}"]
                           + ([f"actor.micro_batch_size={micro_batch_size}"] if micro_batch_size else []))
    micro, _ = actor_micro_batches(settings)
    res: dict = {"episodes": episodes, "samples": len(samples), "threads": torch.get_num_threads(),
                 "batch_size": batch_size, "micro_batch_size": micro}
    with tempfile.TemporaryDirectory(prefix="webrl-bench-train-") as tmp:
        tmp = Path(tmp)
        corpus = [s["observation"] + s["action"] for s in samples]
        train_embedded_tokenizer(corpus, emb.vocab_size, tmp / "tok")
        model_dir = build_embedded_model(tmp / "tok", emb, tmp / "actor", seed=seed)
        Critic.from_backbone(model_dir, head_init_std=0.02, max_length=emb.max_length, device="cpu",
                             seed=seed).save(tmp / "critic")
        total, n_flop = _flop_params(model_dir)
        peak = matmul_peak_flops()
        console.print(f"model: embedded {emb.arch}, {total / 1e6:.2f}M params ({n_flop / 1e6:.2f}M without the "
                      f"input embedding), {torch.get_num_threads()} torch threads; {len(samples)} samples from "
                      f"{episodes} episodes; fp32 matmul peak {peak / 1e9:.1f} GFLOP/s")

        tok = load_tokenizer(model_dir)
        prompts = sorted({s["observation"] for s in samples} | {s["next_observation"] for s in samples})
        critic_lens = [len(encode_prompt(tok, p, emb.max_length)) for p in prompts]
        distinct = len(prompts)
        # warm-up: allocator, kernels, Trainer/accelerate first-use costs hit neither timed run
        train_actor(samples[:4], model_dir, tmp / "warm", settings.model_copy(deep=True), critic_dir=tmp / "critic",
                    max_steps=1, progress=False)
        t0 = time.perf_counter()
        ours = train_actor(samples, model_dir, tmp / "ours", settings, critic_dir=tmp / "critic", progress=False)
        ours_total = ours["critic_s"] + ours["ref_s"] + ours["train_s"]
        console.print(f"ours done in {time.perf_counter() - t0:.1f}s (incl. load/save)")
        official = official_stage(samples, model_dir, tmp / "critic", settings, lr)
        peak = max(peak, matmul_peak_flops())  # re-measured after both runs; the best is the peak

    L, d = emb.num_layers, emb.hidden_size
    # ours: the epoch's training passes, the reference pass over the same kept samples, the critic per distinct
    # prompt (its lengths measured with the critic's own encoding)
    ours_train = ours["epochs"] * (6 * n_flop * ours["tokens"] + 12 * L * d * ours["tokens_sq"])
    ours_ref = 2 * n_flop * ours["tokens"] + 4 * L * d * ours["tokens_sq"]
    ours_critic = seq_flops(critic_lens, n_flop, L, d, train=False)
    off_flops = (seq_flops(official["train_lens"], n_flop, L, d, True)
                 + seq_flops(official["forward_lens"], n_flop, L, d, False))
    official.pop("train_lens"), official.pop("forward_lens")
    res |= {"params": total, "flop_params": n_flop, "peak_flops": peak,
            "ours": {**ours, "stage_s": ours_total,
                     "mfu_stage": (ours_train + ours_ref + ours_critic) / ours_total / peak,
                     "mfu_epoch": ours_train / ours["train_s"] / peak,
                     "tokens_per_s_epoch": ours["epochs"] * ours["tokens"] / ours["train_s"]},
            "official": {**official, "mfu_stage": off_flops / official["wall_s"] / peak},
            "ratio": official["wall_s"] / ours_total}
    t = Table(title=f"WebRL actor-training stage on {len(samples)} samples (CPU fp32, peak {peak / 1e9:.0f} GFLOP/s)")
    for col in ("method", "wall s", "samples trained", "critic passes", "MFU stage", "MFU actor epoch"):
        t.add_column(col)
    t.add_row("official (per sample, batch 1)", f"{official['wall_s']:.1f}", str(len(samples)),
              str(2 * len(samples)), f"{res['official']['mfu_stage']:.0%}", "-")
    t.add_row(f"ours (precompute + batch {batch_size} in micro-batches of {micro})", f"{ours_total:.1f}",
              str(ours["n_train"]), str(distinct), f"{res['ours']['mfu_stage']:.0%}", f"{res['ours']['mfu_epoch']:.0%}")
    console.print(t)
    console.print(f"ours: critic {ours['critic_s']:.1f}s + reference {ours['ref_s']:.1f}s + epoch "
                  f"{ours['train_s']:.1f}s; speed-up official/ours = {res['ratio']:.2f}x")
    if out:
        Path(out).write_text(json.dumps(res, indent=2, default=str))
    return res

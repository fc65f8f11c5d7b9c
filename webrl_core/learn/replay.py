"""Perplexity-filtered replay of earlier phases' successful steps (the WebRL paper's experience replay buffer with
actor confidence filtering, arXiv 2411.02337).

For every step of an earlier phase's successful trajectory, under the actor at the start of the current phase:

    rank_score = 1/PPL = exp( (1/n) * sum_{k=1..n} log pi(a_k | prompt, a_<k) )

over the n action tokens: the response's tokens plus the stop token ``<|eot_id|>`` -- the same tokens the actor
is trained on (``models.encode_prompt_action``: separately tokenised prompt + action + stop, observation cut first).

Selection, in this order:
1. de-duplicate globally: keep only the first successful trajectory per task string (intent), trajectories ordered
   by (phase, episode_id) -- the official rule, which the official code applied per worker chunk only;
2. keep steps with  low < rank_score <= high  (default (0.5, 0.95], i.e. 1/0.95 <= PPL < 2);
3. cap: shuffle the kept steps with ``seed`` and take at most floor(cap_ratio x n_current_steps).

``replay.scoring`` says how much of the buffer is scored. ``all`` (the official code: every step of the buffer
gets its 1/PPL, then the window and the cap) or ``until_cap``: the de-duplicated steps are shuffled with ``seed``
first and scored in that order, chunk by chunk, until the cap is filled with in-window steps. Both pick a uniformly
random cap-sized subset of the in-window steps (the first ``cap`` in-window steps of a random order are a random
subset, as the first ``cap`` of the shuffled in-window list are), but ``until_cap`` scores about
cap / (in-window share) steps instead of the whole buffer, which grows every phase (the demo's 1,267 oracle steps
took 16 minutes of a 2-core CPU to keep 180). Its ``in_window`` count and mean score are then over the scored steps.

Speed: items are sorted by length and scored in left-padded micro-batches (``replay.batch_size``; empty: the
fastest on this CPU, ``micro_batch.scoring_batch``); the backbone returns hidden states and
only the hidden states at the positions that predict action tokens go through the LM head (the official method
builds [T, V] logits for the whole sequence, one item at a time; ``official_perplexity`` reproduces it as the
benchmark's reference). With left padding every row's action sits at the end, so one gather picks all positions.
"""

from __future__ import annotations

import math
import random
import time
from typing import Sequence

import torch

from webrl_core.learn.micro_batch import scoring_batch
from webrl_core.learn.models import encode_prompt_action, head_logits, last_hidden_states, left_pad
from webrl_core.logs import track
from webrl_core.prompts import STOP_TOKEN


@torch.no_grad()
def inverse_perplexity(model, tok, pairs: Sequence[tuple[str, str]], max_length: int, batch_size: int = 8,
                       progress: bool = False) -> list[float]:
    """1/PPL of each (prompt, action) under ``model`` (see module docstring)."""
    device = next(model.parameters()).device
    encoded = [encode_prompt_action(tok, p, a, max_length) for p, a in pairs]
    order = sorted(range(len(encoded)), key=lambda i: len(encoded[i]["input_ids"]))
    out = [float("nan")] * len(encoded)
    batches = [order[s:s + batch_size] for s in range(0, len(order), batch_size)]
    for chunk in track(batches, description="perplexity", disable=not progress):
        seqs = [encoded[i]["input_ids"] for i in chunk]
        n_act = [sum(encoded[i]["action_mask"]) for i in chunk]
        ids, mask = left_pad(seqs, tok.pad_token_id)
        ids, mask = ids.to(device), mask.to(device)
        # the prompts' states are kept apart too: the critic's values of these observations come next
        hidden = last_hidden_states(model, ids, mask, [len(s) - n for s, n in zip(seqs, n_act)])
        width = ids.shape[1]
        # position t predicts token t+1; row r's action tokens are its last n_act[r] columns
        rows = torch.cat([torch.full((n,), r, dtype=torch.long) for r, n in enumerate(n_act)]).to(device)
        tgt_pos = torch.cat([torch.arange(width - n, width) for n in n_act]).to(device)
        # float32 sums whatever the model's dtype (a bf16 model on an AVX512-BF16 CPU or a GPU)
        logp = torch.log_softmax(head_logits(model, hidden[rows, tgt_pos - 1]).float(), dim=-1)
        tok_logp = logp.gather(1, ids[rows, tgt_pos].unsqueeze(1)).squeeze(1)
        sums = torch.zeros(len(chunk), device=device, dtype=torch.float32).index_add_(0, rows, tok_logp)
        for r, i in enumerate(chunk):
            out[i] = math.exp(sums[r].item() / n_act[r])
    return out


@torch.no_grad()
def official_perplexity(model, tok, pairs: Sequence[tuple[str, str]], max_length: int) -> list[float]:
    """Reference: the official method, one item at a time -- the joint string tokenised, the prompt tokenised again
    for its length, the action tokenised alone, whole-vocabulary logits over the whole sequence."""
    device = next(model.parameters()).device
    out = []
    for prompt, action in pairs:
        action = action + STOP_TOKEN  # the same action tokens as ours (response + stop)
        joint = tok(prompt + action, return_tensors="pt", truncation=True, max_length=max_length)
        obs_len = len(tok(prompt)["input_ids"])
        act_ids = tok(action, add_special_tokens=False)["input_ids"]
        ids = joint["input_ids"].to(device)
        logits = model(input_ids=ids, attention_mask=joint["attention_mask"].to(device)).logits.float()
        logp = torch.log_softmax(logits[0], dim=-1)
        n = min(len(act_ids), ids.shape[1] - obs_len)
        pos = torch.arange(obs_len - 1, obs_len - 1 + n, device=device)
        tok_logp = logp[pos].gather(1, ids[0, pos + 1].unsqueeze(1)).squeeze(1)
        out.append(math.exp(tok_logp.mean().item()))
    return out


def first_success_per_intent(rows: Sequence[dict]) -> list[dict]:
    """Global de-duplication: steps of the first trajectory (by phase, episode_id) of each intent."""
    first: dict[str, tuple] = {}
    for r in rows:
        key = (r.get("phase", 0), r["episode_id"])
        if r["intent"] not in first or key < first[r["intent"]]:
            first[r["intent"]] = key
    keep = {v[1] for v in first.values()}
    return sorted((r for r in rows if r["episode_id"] in keep), key=lambda r: (r.get("phase", 0), r["episode_id"],
                                                                             r["idx"]))


def replay_cap(cap_ratio: float, n_current_steps: int) -> int:
    """floor(cap_ratio x n_current_steps): at most this many replayed steps (1e-9: a product a hair under an integer, 0.7 x 10)."""
    return int(math.floor(cap_ratio * n_current_steps + 1e-9))


def select_replay(rows: Sequence[dict], scores: Sequence[float], n_current_steps: int, low: float = 0.5,
                  high: float = 0.95, cap_ratio: float = 2.0, seed: int = 0) -> list[dict]:
    """Window low < score <= high, then shuffle with ``seed`` and cap at floor(cap_ratio x n_current_steps).
    Returns copies of the rows with ``rank_score`` set."""
    if len(rows) != len(scores):
        raise ValueError(f"select_replay: {len(rows)} rows but {len(scores)} scores")
    kept = [{**r, "rank_score": float(s)} for r, s in zip(rows, scores) if low < s <= high]
    random.Random(seed).shuffle(kept)
    return kept[:replay_cap(cap_ratio, n_current_steps)]


def score_replay(candidates: Sequence[dict], model, tok, n_current_steps: int, low: float = 0.5, high: float = 0.95,
                 cap_ratio: float = 2.0, max_length: int = 4096, batch_size: int | None = 8, seed: int = 0,
                 progress: bool = False, scoring: str = "all") -> tuple[list[dict], dict]:
    """The whole replay step: de-duplicate, score (1/PPL), window, cap; ``scoring`` "all" or "until_cap" (module
    docstring); ``batch_size`` None: measured on a CPU, 8 elsewhere. ``candidates`` are
    ``TrajectoryStore.successful_steps`` rows (episode_id, idx, phase, prompt, response, intent, ...). Returns
    (selected rows with rank_score, counts for logging)."""
    if scoring not in ("all", "until_cap"):
        raise ValueError(f"replay.scoring must be 'all' or 'until_cap', got {scoring!r}")
    unique = first_success_per_intent(candidates)
    cap = replay_cap(cap_ratio, n_current_steps)
    if batch_size is None:  # measured on a CPU, once for the pass (until_cap scores in chunks)
        pairs = [(r["prompt"], r["response"]) for r in unique]
        batch_size = scoring_batch("replay", model, [len(p) + len(a) for p, a in pairs],
                                   lambda idx, b: inverse_perplexity(model, tok, [pairs[i] for i in idx], max_length,
                                                                     b), 8)
    t0 = time.perf_counter()
    if scoring == "all":
        scores = inverse_perplexity(model, tok, [(r["prompt"], r["response"]) for r in unique], max_length,
                                    batch_size, progress) if unique else []
        selected = select_replay(unique, scores, n_current_steps, low, high, cap_ratio, seed)
        scored = list(unique)
    else:
        selected, scores = _score_until_cap(unique, model, tok, cap, low, high, max_length, batch_size, seed,
                                            progress)
        scored = [unique[i] for i in _shuffled(len(unique), seed)[:len(scores)]]
    score_s = time.perf_counter() - t0
    lengths = [len(encode_prompt_action(tok, r["prompt"], r["response"], max_length)["input_ids"]) for r in scored]
    in_window = sum(low < s <= high for s in scores)
    stats = {"candidates": len(candidates), "deduplicated": len(unique), "scored": len(scores),
             "in_window": in_window, "selected": len(selected), "cap": cap,
             "mean_rank_score": sum(scores) / len(scores) if scores else float("nan"),
             # the scoring pass's seconds (the batch's measurement left out) and its rows' tokens, for its FLOPs
             "score_s": score_s, "scored_tokens": sum(lengths), "scored_tokens_sq": sum(n * n for n in lengths)}
    return selected, stats


def _shuffled(n: int, seed: int) -> list[int]:
    """``until_cap``'s scoring order of ``n`` de-duplicated steps."""
    order = list(range(n))
    random.Random(seed).shuffle(order)
    return order


def _score_until_cap(unique: Sequence[dict], model, tok, cap: int, low: float, high: float, max_length: int,
                     batch_size: int, seed: int, progress: bool) -> tuple[list[dict], list[float]]:
    """Shuffle with ``seed``, score in chunks of a few micro-batches (length-sorted within a chunk), keep in-window
    steps in shuffled order until ``cap`` are kept. Returns (selected rows with rank_score, the scores computed)."""
    order = _shuffled(len(unique), seed)
    chunk = max(4 * batch_size, 32)
    selected: list[dict] = []
    scores: list[float] = []
    if cap <= 0:
        return [], []
    # the bar counts the chunks scored: a pass stopped by the cap shows how far it got and how long it took
    for start in track(range(0, len(order), chunk), "perplexity (until the cap)", disable=not progress):
        part = order[start:start + chunk]
        got = inverse_perplexity(model, tok, [(unique[i]["prompt"], unique[i]["response"]) for i in part],
                                 max_length, batch_size)
        scores.extend(got)
        selected += [{**unique[i], "rank_score": float(sc)} for i, sc in zip(part, got) if low < sc <= high]
        if len(selected) >= cap:
            break
    return selected[:cap], scores

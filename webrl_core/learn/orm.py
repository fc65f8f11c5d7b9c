"""The outcome reward model (ORM): a causal LM that answers YES or NO (the WebRL paper's outcome-supervised reward
model, arXiv 2411.02337).

Input: exactly ``prompts.build_orm_prompt(intent, responses, final_html, max_html_chars, compat=...)`` (``compat``:
"webrl", our wording, "official", the released WebRL ORM's exact input, or the run's ``PromptFormat``: the end
state as the actor reads its pages, compact and through the model's chat template) -- the page is cut to the
character budget and, if the token count still exceeds ``models.max_length``, the end of the HTML is cut again at
token level (``models.encode_prompt``); the question and the closing assistant header are never cut. ``final_html``
is the observation of the last step (the page on which the agent issued its last action), as in the official code.

Decision:  P(YES) = p(YES | x) / (p(YES | x) + p(NO | x)), where p(a | x) is the probability of the answer's whole
           token sequence after the prompt x (the product of its next-token probabilities);
           success  iff  P(YES) >= orm.threshold (official: 0.5).
When "YES" and "NO" are one token each (Llama-3, the released WebRL ORM; the embedded tokenizer adds them as single
tokens) this is exactly the official rule, softmax([z_YES, z_NO])[0] over the next-token logits at the last prompt
position (WebRL ``scripts/process_data.py`` ORM scoring), and costs one forward. A tokenizer that splits an answer
(SmolLM2: "YES" -> "Y" + "ES") gets the answer's remaining tokens scored on the prompt's KV cache, one short forward
per answer, the cache cropped back to the prompt in between.
Only the scored positions' hidden states go through the LM head (no [B, T, V] logits). Prompts are scored in
length-sorted, left-padded micro-batches of ``orm.batch_size``.

Training: ``train_orm`` is a TRL ``SFTTrainer`` run on a prompt-completion dataset, pre-tokenised by us so the
prompt ids are identical to the scoring ids (``models.encode_prompt_action``: prompt + answer + stop token), with a
completion-only loss (the loss covers the answer token and the stop token); its loss history goes into the saved
folder (``loss_history.json``, ``webrl_core.runs.loss_history``).
"""

from __future__ import annotations

import math
import os
import random
from pathlib import Path
from typing import Mapping, Sequence

import torch

from webrl_core.config import ModelsConfig, OrmConfig
from webrl_core.learn import frozen_prefix
from webrl_core.learn.micro_batch import scoring_batch
from webrl_core.learn.models import (ORM_ANSWER_TOKENS, encode_prompt, encode_prompt_action, head_logits,
                               last_hidden_states, left_pad, load_causal_lm, load_tokenizer, position_ids_from_mask,
                               resolve_device, save_model, trainer_precision_args, unwrap)
from webrl_core.prompts import PromptFormat, as_format, build_orm_prompt
from webrl_core.runs import loss_history


def orm_decision(yes_logit: float, no_logit: float, threshold: float = 0.5) -> tuple[float, bool]:
    """(P(YES), success) from the two answers' log-probabilities (or, single-token answers, their logits)."""
    p_yes = 1.0 / (1.0 + math.exp(no_logit - yes_logit))
    return p_yes, p_yes >= threshold


def answer_sequences(tok) -> tuple[list[int], list[int]]:
    """The token ids of "YES" and "NO" as the tokenizer writes them (one id each for Llama-3)."""
    seqs = [tok.encode(word, add_special_tokens=False) for word in ORM_ANSWER_TOKENS]
    if not all(seqs) or seqs[0] == seqs[1]:
        raise ValueError(f"tokenizer {getattr(tok, 'name_or_path', '?')!r} encodes YES as {seqs[0]} and NO as "
                         f"{seqs[1]}; the ORM needs two different non-empty answers")
    return seqs[0], seqs[1]


def answer_token_ids(tok) -> tuple[int, int]:
    """Ids of "YES" and "NO" where each is a single token (the official ORM's case); else ValueError."""
    yes, no = answer_sequences(tok)
    for word, enc in zip(ORM_ANSWER_TOKENS, (yes, no)):
        if len(enc) != 1:
            raise ValueError(f"tokenizer {getattr(tok, 'name_or_path', '?')!r} splits {word!r} into {len(enc)} "
                             f"tokens {enc}; this method needs it as one token")
    return yes[0], no[0]


def orm_prompt_for_episode(episode: Mapping, steps: Sequence[Mapping], max_html_chars: int = 12000, *,
                           compat: str | PromptFormat = "webrl") -> str:
    """The ORM prompt of one stored episode (steps in idx order; final HTML = the last step's observation);
    ``compat``: the prompt format, "webrl", "official" (the released ORM's input) or the run's ``PromptFormat``
    (``webrl_core.prompts.build_orm_prompt``)."""
    compat = as_format(compat)
    if not steps:
        raise ValueError(f"episode {episode.get('episode_id')!r} has no steps; the ORM needs at least one")
    ordered = sorted(steps, key=lambda s: s["idx"])
    return build_orm_prompt(episode["intent"], [s["response"] for s in ordered], ordered[-1]["html"] or "",
                            max_html_chars, compat=compat)


class OrmScorer:
    """Batched P(YES) for ORM prompts."""

    def __init__(self, model_path: str | os.PathLike | None = None, cfg: OrmConfig | None = None,
                 models_cfg: ModelsConfig | None = None, model=None, tokenizer=None):
        self.cfg = cfg or OrmConfig()
        self.models_cfg = models_cfg or ModelsConfig()
        if model is None:
            if model_path is None:
                raise ValueError("OrmScorer needs model_path or model + tokenizer")
            tokenizer = load_tokenizer(model_path)
            model = load_causal_lm(model_path, self.models_cfg, trainable=False)
        self.model, self.tok = model, tokenizer
        self.yes_ids, self.no_ids = answer_sequences(self.tok)
        self.device = next(self.model.parameters()).device

    @torch.no_grad()
    def p_yes(self, prompts: Sequence[str], batch_size: int | None = None) -> list[float]:
        """P(YES | prompt) of each prompt, in length-sorted batches of ``batch_size`` (None: measured on a CPU,
        ``micro_batch.scoring_batch``; ``orm.batch_size`` elsewhere)."""
        ids = [encode_prompt(self.tok, p, self.models_cfg.max_length) for p in prompts]
        bs = batch_size or scoring_batch("orm", self.model, [len(x) for x in ids],
                                         lambda idx, b: self.p_yes([prompts[i] for i in idx], b), self.cfg.batch_size)
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
        out = [0.0] * len(ids)
        for start in range(0, len(order), bs):
            chunk = order[start:start + bs]
            input_ids, mask = left_pad([ids[i] for i in chunk], self.tok.pad_token_id)
            lp_yes, lp_no = self._answer_logprobs(input_ids.to(self.device), mask.to(self.device))
            for i, p in zip(chunk, torch.sigmoid(lp_yes - lp_no).tolist()):
                out[i] = p
        return out

    def _answer_logprobs(self, input_ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """log p(YES | x), log p(NO | x) per row (left padding: the last column is every prompt's end). Single-token
        answers: their logits, which give the same P(YES) (the normaliser cancels)."""
        single = len(self.yes_ids) == 1 and len(self.no_ids) == 1
        if single:
            hidden = last_hidden_states(self.model, input_ids, mask)
            pair = head_logits(self.model, hidden[:, -1, :])[:, [self.yes_ids[0], self.no_ids[0]]].float()
            return pair[:, 0], pair[:, 1]
        from transformers import DynamicCache

        model = unwrap(self.model)
        decoder = model.get_decoder()
        positions = position_ids_from_mask(mask)
        cache = DynamicCache(config=model.config)
        out = decoder(input_ids=input_ids, attention_mask=mask, position_ids=positions, past_key_values=cache,
                      use_cache=True)
        first = torch.log_softmax(head_logits(model, out.last_hidden_state[:, -1, :]), dim=-1)
        width = input_ids.shape[0]
        result = []
        for seq in (self.yes_ids, self.no_ids):
            lp = first[:, seq[0]]
            if len(seq) > 1:  # the answer's later tokens, on the prompt's cache
                tail = torch.tensor(seq[:-1], device=input_ids.device).expand(width, -1)
                tail_mask = torch.cat([mask, torch.ones_like(tail)], dim=1)
                tail_pos = positions[:, -1:] + 1 + torch.arange(tail.shape[1], device=input_ids.device)
                h = decoder(input_ids=tail, attention_mask=tail_mask, position_ids=tail_pos, past_key_values=cache,
                            use_cache=True).last_hidden_state
                logp = torch.log_softmax(head_logits(model, h), dim=-1)  # [B, L-1, V]: predicts seq[1:]
                nxt = torch.tensor(seq[1:], device=input_ids.device)
                lp = lp + logp[:, torch.arange(len(seq) - 1), nxt].sum(-1)
                cache.crop(-tail.shape[1])  # back to the prompt alone
            result.append(lp)
        return result[0], result[1]

    def score(self, prompts: Sequence[str]) -> list[tuple[float, bool]]:
        """(P(YES), success) per prompt."""
        return [(p, p >= self.cfg.threshold) for p in self.p_yes(prompts)]


def orm_examples_from_episodes(episodes: Sequence[Mapping], steps_by_episode: Mapping[str, Sequence[Mapping]],
                               labels: Mapping[str, bool] | Sequence[bool],
                               max_html_chars: int = 12000, *, compat: str | PromptFormat = "webrl") -> list[dict]:
    """(prompt, "YES"/"NO") pairs; labels by episode_id (a mapping) or aligned with ``episodes`` (a sequence).
    Episodes without steps or without a label are skipped. ``compat``: the prompt format, as
    ``orm_prompt_for_episode``."""
    compat = as_format(compat)
    out = []
    for i, ep in enumerate(episodes):
        label = labels.get(ep["episode_id"]) if isinstance(labels, Mapping) else labels[i]
        steps = steps_by_episode.get(ep["episode_id"]) or []
        if label is None or not steps:
            continue
        prompt = orm_prompt_for_episode(ep, steps, max_html_chars, compat=compat)
        out.append({"episode_id": ep["episode_id"], "prompt": prompt, "completion": "YES" if bool(label) else "NO"})
    return out


def split_examples(examples: Sequence[dict], eval_fraction: float, seed: int = 0) -> tuple[list[dict], list[dict]]:
    """Shuffled (train, held-out) split; held-out gets round(n*fraction) items (at least 1 when fraction > 0)."""
    items = list(examples)
    random.Random(seed).shuffle(items)
    n_eval = 0 if eval_fraction <= 0 else max(1, round(len(items) * eval_fraction))
    return items[n_eval:], items[:n_eval]


def _tokenised_dataset(tok, examples: Sequence[dict], max_length: int):
    from datasets import Dataset

    rows = {"input_ids": [], "completion_mask": []}
    for ex in examples:
        if ex["completion"] not in ("YES", "NO"):
            raise ValueError(f"ORM example completion must be 'YES' or 'NO', got {ex['completion']!r}")
        enc = encode_prompt_action(tok, ex["prompt"], ex["completion"], max_length)
        rows["input_ids"].append(enc["input_ids"])
        rows["completion_mask"].append(enc["action_mask"])
    return Dataset.from_dict(rows)


def train_orm(examples: Sequence[dict], base_model_dir: str | os.PathLike, out_dir: str | os.PathLike,
              cfg: OrmConfig | None = None, models_cfg: ModelsConfig | None = None, seed: int = 0) -> Path:
    """Fine-tune ``base_model_dir`` on (prompt, YES/NO) with TRL's SFTTrainer; saves an HF folder at out_dir."""
    from trl import SFTConfig

    from webrl_core.learn.sft_trainer import SelectedLogitsSFTTrainer

    from webrl_core.learn.trainer_utils import LOGGING_STEPS, fit, progress_callbacks

    cfg = cfg or OrmConfig()
    models_cfg = models_cfg or ModelsConfig()
    if not examples:
        raise ValueError("train_orm: no examples (need labelled episodes with steps)")
    tok = load_tokenizer(base_model_dir)
    model = load_causal_lm(base_model_dir, models_cfg, trainable=True)
    frozen_prefix.attach(model, models_cfg)  # each epoch after the first runs the top layers only
    device = resolve_device(models_cfg.device)
    args = SFTConfig(
        output_dir=str(Path(out_dir) / "_trainer"), num_train_epochs=cfg.epochs, learning_rate=cfg.lr,
        per_device_train_batch_size=cfg.batch_size, lr_scheduler_type="cosine", warmup_steps=0.1,
        logging_steps=LOGGING_STEPS, save_strategy="no", report_to="none", seed=seed, completion_only_loss=True,
        max_length=models_cfg.max_length, activation_checkpointing=models_cfg.gradient_checkpointing,
        use_cpu=device.type == "cpu", **trainer_precision_args(models_cfg, device),
        disable_tqdm=True)  # progress: rich (progress_callbacks), as everywhere else
    trainer = SelectedLogitsSFTTrainer(model=model, args=args,
                                       train_dataset=_tokenised_dataset(tok, examples, models_cfg.max_length),
                                       processing_class=tok, callbacks=progress_callbacks("orm"))
    # the ORM's step is its batch_size; its micro-batch (and attention kernel) are measured
    fit(trainer, "orm", cfg, models_cfg.attn_implementation, compile_setting=models_cfg.compile_layers,
        weight_casts=models_cfg.weight_casts)
    model = trainer.model
    model.eval()
    out = save_model(model, tok, out_dir)  # under accelerate: a saver that writes from the main process only
    if trainer.is_world_process_zero():
        loss_history.write(out_dir, "orm", trainer.state)
    return out


def evaluate_orm(scorer: OrmScorer, examples: Sequence[dict]) -> dict:
    """Accuracy, precision, recall (positive = YES) of the ORM decision against the examples' labels."""
    if not examples:
        return {"n": 0, "accuracy": float("nan"), "precision": float("nan"), "recall": float("nan")}
    decisions = [ok for _, ok in scorer.score([ex["prompt"] for ex in examples])]
    return decision_agreement(decisions, [ex["completion"] == "YES" for ex in examples])


def decision_agreement(decisions: Sequence[bool], truth: Sequence[bool]) -> dict:
    """Confusion counts of the ORM's decisions (positive = YES) against the labels, accuracy (NaN without items),
    precision and recall of YES (0 where nothing was said or nothing was true). The numbers are scikit-learn's."""
    n = len(truth)
    if not n:  # scikit-learn refuses empty input
        return {"n": 0, "tp": 0, "fp": 0, "fn": 0, "tn": 0, "accuracy": float("nan"), "precision": 0.0, "recall": 0.0}
    from sklearn.metrics import accuracy_score, confusion_matrix, precision_score, recall_score

    y_true, y_pred = [bool(t) for t in truth], [bool(d) for d in decisions]
    tn, fp, fn, tp = (int(c) for c in confusion_matrix(y_true, y_pred, labels=[False, True]).ravel())
    return {"n": n, "tp": tp, "fp": fp, "fn": fn, "tn": tn, "accuracy": float(accuracy_score(y_true, y_pred)),
            "precision": float(precision_score(y_true, y_pred, pos_label=True, zero_division=0.0)),
            "recall": float(recall_score(y_true, y_pred, pos_label=True, zero_division=0.0))}


@torch.no_grad()
def official_orm_p_yes(model, tok, prompts: Sequence[str], max_length: int) -> list[float]:
    """Reference for the benchmark: the official method, one prompt at a time, no extra special tokens, the first
    ``max_length`` tokens kept, logits for the whole sequence, P(YES) from the last position."""
    yes_id, no_id = answer_token_ids(tok)
    device = next(model.parameters()).device
    out = []
    for p in prompts:
        enc = tok(p, add_special_tokens=False, truncation=True, max_length=max_length, return_tensors="pt")
        logits = model(input_ids=enc["input_ids"].to(device)).logits.float()
        out.append(torch.softmax(logits[0, -1, [yes_id, no_id]], dim=-1)[0].item())
    return out

"""The WebRL actor trainer: the KL-constrained policy update, TRL's layout (``WebRLConfig`` the arguments,
``webrl_actor_loss`` the loss, ``WebRLTrainer`` the Trainer, ``ActorCollator``, ``train_actor`` the entry point).

Paper (arXiv 2411.02337, Sec. 2.1). Per phase WebRL maximises E[sum_t r(s_t, a_t, I) + beta log pi_ref(a_t|s_t, I)]
+ beta H(pi_theta), whose optimum satisfies beta log(pi*/pi_ref) = A*(s, a, I); the actor regresses onto that
(Eq. 6), on the phase's experience nu (new rollouts and the filtered replay)::

    L(pi_theta) = E_{(s,a,I)~nu} [ ( beta * log( pi_theta(a|s,I) / pi_ref(a|s,I) ) - A(s,a,I) )^2 ]      (Eq. 6)

with the advantage of Eq. 9 (lambda = 0.5; the reward is binary, only at the final step T; the critic V: Eq. 8,
``critic.py``)::

    A(s_t, a_t, I) = lam * (r_t + V(s_{t+1}) - V(s_t)) + (1 - lam) * (r_T - V(s_t))                      (Eq. 9)

Official code (THUDM/WebRL ``webrl/algorithms/webrl/trainer.py``, ``WebRLTrainer.actor_loss``): a binarised
advantage A = 1.0 if clamp(V' - V - 0.05 + R + mc_return, -1, 1) >= 0 else -0.6, positive samples only, an adaptive
and capped beta, a Huber loss on the per-token log-ratio. Both advantages and the beta rule:
``webrl_core.learn.advantage`` (``paper_advantage``, ``official_advantage``, ``official_beta``, ``cap_beta``).

Actor loss per kept sample i, with logp_i = sum over the action tokens of log pi_theta, ref_logp_i the same under
pi_ref (the actor at the start of the phase), n_i the action token count (the action + the stop token):

``loss="official"`` (``WebRLTrainer.actor_loss``; A binarised, beta adaptive, advantage.py)::

    c_i         = n_i ("sample", the repo at its batch size 1) or sum_j n_j mask_j ("batch", the repo's formula
                  for batch > 1); max(c, 1)
    log_ratio_i = (logp_i - ref_logp_i) / c_i                           per-token mean log-ratio
    beta_i      = min(beta_i^0, |A_i / log_ratio_i|)  (detached)         beta_i^0 in {beta_low, beta_high}
                                                                         from ref_prob: the repo's {1, 5}
    L           = mean_i  Huber_delta=1(beta_i * log_ratio_i, A_i) / beta_i * mask_i

  mask_i = A_i > 0. Masked-out samples contribute exactly 0 to the loss and its gradient, so they are DROPPED
  before the epoch instead of being run forward/backward (the repo runs them); the mean is over the kept samples.

``loss="paper"`` (Eq. 6, A from Eq. 9, fixed beta)::

    log_ratio_i = logp_i - ref_logp_i        ("sum": the sequence log-ratio log pi(a|s)/pi_ref(a|s), the paper's)
                  (logp_i - ref_logp_i)/n_i  ("mean": per token)
    L           = mean_i (beta * log_ratio_i - A_i)^2                   all samples, negative A included

``kl=False`` (paper Fig. 5 ablation): plain token-mean NLL of the actions on the samples the KL loss would push up
(A > 0), no reference (``filtered_bc.action_nll``, the one NLL). Without a critic, ``kl=False`` is
``loss="filtered_bc"``.

Critic-free losses (``ActorTrainConfig.CRITIC_FREE``; ``train_actor(..., critic_dir=None)``):

``loss="grpo"`` (WebAgent-R1's M-GRPO, TRL's ``GRPOTrainer._compute_loss``; ``grpo.py`` has the equations): the
episodes' outcomes normalised within their task's group, every step of an episode carrying its advantage; a
clipped per-token ratio against the phase-start actor (which acted, and is the KL reference: one per-token
reference column, computed like ``ref_logp``), ``loss_type`` aggregation, ``num_iterations`` passes.

``loss="filtered_bc"`` (PAE's ``filteredbc``; ``filtered_bc.py``): the shortest successful episodes per task, the
token-mean NLL of their actions; no reference pass.

Precompute (once per phase, batched, no grad, BEFORE the actor epoch): the critic's V for every DISTINCT prompt
among observations and next observations (V(s_{t+1}) of step t is V(s) of step t+1), then the critic is freed; the
reference log-probs come from the freshly loaded actor itself before its first update (it IS pi_ref), so no second
model is ever in memory, after the micro-batch calibration (``fit``'s ``before_train``: the pass sees the attention
kernel the training uses). A replayed step already had its 1/PPL under this same actor in the replay stage, so its
reference is taken from there, sum log pi_ref(a|s) = n log(1/PPL) (``actor.reuse_replay_logprobs``; the WebRL
losses; equal up to bf16 rounding: that pass runs without autocast). The results are dataset columns (ref_logp,
n_action, adv, mask, beta0; grpo: adv and the per-token ref_token_logps). Under ``accelerate launch`` both are split
across the processes (``trainer_utils``, which also holds the arguments, progress, the precision and the saving the
trainers share). The LR of the tiny embedded model is larger than the paper's (``ActorTrainConfig.lr``) because 1e-6
does not move a 1-10M-parameter model in one epoch.
Reference policy with LoRA: ``train_actor`` loads the phase-start actor folder (a previous phase's ``save_model``
output, which holds the MERGED weights) and puts a FRESH adapter on it. peft initialises ``lora_B = 0``, so before
the first update the wrapped model is exactly the phase-start actor, and the reference log-probs are computed from
it at that moment (``ref_logp``). This equals ``disable_adapter()`` on the trained model only because the previous
adapters were merged into the folder; an unmerged adapter chain would make "adapter off" an older policy.

Settings: the ``actor`` config section (``webrl_core.config.ActorTrainConfig``) is the only definition;
``WebRLConfig``, the actor Trainer's arguments, takes its loss fields from it and is built from the settings by
``WebRLConfig.from_settings``.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import Trainer, TrainingArguments, set_seed

from webrl_core.config import ActorTrainConfig
from webrl_core.learn import advantage as adv_mod
from webrl_core.learn import filtered_bc, frozen_prefix, grpo
from webrl_core.learn.critic import Critic
from webrl_core.learn.model_flops import DecoderShape, flop_stats, lengths_sums
from webrl_core.learn.models import (apply_attention, autocast_context, count_parameters, encode_prompt_action,
                                     head_logits, last_hidden_states, left_pad, load_causal_lm, load_tokenizer,
                                     position_ids_from_mask, save_model)
from webrl_core.learn.trainer_utils import (_dist_map, _fields_of, _full_model, _is_main_process, _loss_curve,
                                            _process_device, _trainer_args, _whole_models, actor_micro_batches, fit,
                                            passes_over_rows, progress_callbacks, trained_shape)
from webrl_core.logs import track
from webrl_core.runs import loss_history


# ---------------------------------------------------------------------------------------------
# the actor's arguments

@_fields_of(ActorTrainConfig, ActorTrainConfig.LOSS_FIELDS)
class WebRLConfig(TrainingArguments):
    """``TrainingArguments`` + the WebRL loss fields, the arguments of ``WebRLTrainer`` (TRL's ``XxxConfig``
    convention). The loss fields (``ActorTrainConfig.LOSS_FIELDS``: loss, kl, beta, beta_low, beta_high, lam,
    margin, paper_logratio, count_norm, and grpo's and filtered_bc's) are declared once, in the ``actor`` config
    section, and validated by it; ``from_settings`` maps the section's optimisation fields onto the
    ``TrainingArguments`` ones (grpo: ``num_iterations`` passes of ``epochs`` each)."""

    def __post_init__(self):
        super().__post_init__()
        ActorTrainConfig.model_validate({n: getattr(self, n) for n in ActorTrainConfig.LOSS_FIELDS})

    @classmethod
    def from_settings(cls, settings, out_dir: str | Path, max_steps: int | None = None) -> WebRLConfig:
        """The actor Trainer's arguments from the ``actor`` section of the settings."""
        a = settings.actor
        micro, accum = actor_micro_batches(settings)
        epochs = a.epochs * (a.num_iterations if a.loss == "grpo" else 1)  # TRL's mu: passes over the samples
        return _trainer_args(cls, Path(out_dir), settings, a.lr, epochs, micro, accum, a.max_grad_norm,
                             max_steps, **a.model_dump(include=set(ActorTrainConfig.LOSS_FIELDS)))


# ---------------------------------------------------------------------------------------------
# the loss

def webrl_actor_loss(logp: torch.Tensor, ref_logp: torch.Tensor, n_tokens: torch.Tensor, adv: torch.Tensor,
                     mask: torch.Tensor, beta0: torch.Tensor, loss: str = "official", kl: bool = True,
                     paper_logratio: str = "sum", count_norm: str = "sample") -> tuple[torch.Tensor, dict]:
    """The actor loss of one micro-batch (module docstring); returns (loss, detached stats)."""
    n_tokens, adv, mask = n_tokens.to(logp), adv.to(logp), mask.to(logp)
    ref_logp, beta0 = ref_logp.to(logp), beta0.to(logp)
    diff = logp - ref_logp
    if not kl:
        nll = filtered_bc.action_nll(logp, n_tokens, mask)
        return nll, {"log_ratio": (diff / n_tokens.clamp(min=1)).mean().item()}
    if loss == "paper":
        log_ratio = diff if paper_logratio == "sum" else diff / n_tokens.clamp(min=1.0)
        value = ((beta0 * log_ratio - adv) ** 2).mean()
        return value, {"log_ratio": log_ratio.detach().mean().item()}
    if count_norm == "batch":
        count = (n_tokens * mask).sum().clamp(min=1.0).expand_as(n_tokens)
    else:
        count = (n_tokens * mask).clamp(min=1.0)
    log_ratio = diff / count
    beta = adv_mod.cap_beta(beta0, adv, log_ratio)
    per_sample = F.smooth_l1_loss(beta * log_ratio, adv, reduction="none", beta=1.0) / beta * mask
    return per_sample.mean(), {"log_ratio": log_ratio.detach().mean().item(), "beta": beta.mean().item()}


class ActorCollator:
    """Left-pads input_ids; carries the precomputed per-sample columns the rows have as float tensors, and the
    per-token reference log-probs (grpo) as [B, k] right-aligned to the batch's k = max(n_action) action columns
    (``action_token_logprobs``: the rows are left padded, every action ends at the last column)."""

    columns = ("ref_logp", "adv", "mask", "beta0")

    def __init__(self, pad_id: int):
        self.pad_id = pad_id

    def __call__(self, features: list[dict]) -> dict[str, torch.Tensor]:
        ids, mask = left_pad([f["input_ids"] for f in features], self.pad_id)
        n_action = torch.tensor([f["n_action"] for f in features], dtype=torch.long)
        batch = {"input_ids": ids, "attention_mask": mask, "n_action": n_action}
        for c in self.columns:
            if c in features[0]:
                batch[c] = torch.tensor([float(f[c]) for f in features], dtype=torch.float32)
        if "ref_token_logps" in features[0]:
            k = int(n_action.max())
            ref = torch.zeros(len(features), k, dtype=torch.float32)
            for i, f in enumerate(features):
                ref[i, k - len(f["ref_token_logps"]):] = torch.tensor(f["ref_token_logps"], dtype=torch.float32)
            batch["ref_token_logps"] = ref
        return batch


class WebRLTrainer(Trainer):
    """transformers.Trainer whose ``compute_loss`` is the configured actor loss on precomputed reference columns:
    ``webrl_actor_loss`` (official, paper, their kl=False NLL), ``grpo.grpo_loss`` or ``filtered_bc.action_nll``.
    ``max_completion_length``: grpo's dr_grpo length (``policy.max_new_tokens``)."""

    args: WebRLConfig

    def __init__(self, *a, max_completion_length: int | None = None, **kw):
        super().__init__(*a, **kw)
        self.max_completion_length = max_completion_length
        # every loss is a per-micro-batch mean that the Trainer divides by the accumulation steps (as TRL divides
        # grpo, bnpo and dr_grpo); dapo's is already a share of the whole step's tokens (TRL: not divided again)
        self.loss_is_scaled_for_ga = self._dapo
        self._stats: dict[str, list[float]] = {}    # since the last log
        self._history: dict[str, list[float]] = {}  # the whole training's, for train_actor's stats

    @property
    def _dapo(self) -> bool:
        return self.args.loss == "grpo" and self.args.loss_type == "dapo"

    def train(self, *a, **kw):
        self._stats, self._history = {}, {}  # not the micro-batch calibration's passes
        return super().train(*a, **kw)

    def _get_num_items_in_batch(self, batch_samples: list, device):
        """dapo's N: the action tokens of the optimizer step's micro-batches, summed over the ranks (TRL's
        ``num_items_in_batch`` of a generation batch, which is one optimizer step here)."""
        if not self._dapo:
            return super()._get_num_items_in_batch(batch_samples, device)
        n = sum(int(b["n_action"].sum()) for b in batch_samples)
        n = torch.tensor(float(n), device=device)
        return self.accelerator.gather(n).sum() if self.args.world_size > 1 else n

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        a = self.args
        ids, attention, n_action = inputs["input_ids"], inputs["attention_mask"], inputs["n_action"]
        # the Trainer's mixed precision wraps the model's forward; a pass from the frozen-prefix cache calls the
        # decoder and the head directly, so the autocast is entered here too (a no-op around the wrapped forward)
        if a.loss == "grpo":
            with self.accelerator.autocast():
                tok_logp, keep = action_token_logprobs(model, ids, attention, n_action)
            if self._dapo:  # TRL: N / num_processes per rank; a calibration pass alone counts its own tokens
                items = (n_action.sum() if num_items_in_batch is None
                         else num_items_in_batch / self.accelerator.num_processes)
            else:
                items = None
            ref = inputs["ref_token_logps"]  # the phase-start actor: it acted (old) and is the KL reference
            loss, stats = grpo.grpo_loss(tok_logp, ref, ref, inputs["adv"], keep, a.beta, a.epsilon,
                                         a.epsilon if a.epsilon_high is None else a.epsilon_high, a.loss_type,
                                         self.max_completion_length, items)
            logp = (tok_logp * keep).sum(-1)
        else:
            with self.accelerator.autocast():
                logp = action_logprobs(model, ids, attention, n_action)
            if a.loss == "filtered_bc":
                loss, stats = filtered_bc.action_nll(logp, n_action.float()), {}
            else:
                loss, stats = webrl_actor_loss(logp, inputs["ref_logp"], n_action.float(), inputs["adv"],
                                               inputs["mask"], inputs["beta0"], loss=a.loss, kl=a.kl,
                                               paper_logratio=a.paper_logratio, count_norm=a.count_norm)
        for k, v in stats.items():
            self._stats.setdefault(k, []).append(v)
            self._history.setdefault(k, []).append(v)
        return (loss, {"logp": logp}) if return_outputs else loss

    def stat_means(self) -> dict[str, float]:
        """The training's loss statistics, each the mean over its micro-batches."""
        return {k: sum(v) / len(v) for k, v in self._history.items() if v}

    def log(self, logs: dict, *args, **kwargs):
        for k, v in self._stats.items():
            if v:
                logs[k] = sum(v) / len(v)
        self._stats = {}
        super().log(logs, *args, **kwargs)


# ---------------------------------------------------------------------------------------------
# log-probs of actions (left padded: every sequence ends at the last column)

def action_token_logprobs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                          n_action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """log pi(token | prefix) at the last k = max(n_action) positions of each left-padded row, [B, k], and the
    [B, k] boolean action mask (row i's last n_action[i] positions).

    Only the last k+1 positions go through the LM head (``logits_to_keep``), so no [B, T, vocab] tensor is built
    for long prompts."""
    k = int(n_action.max())
    decoder = frozen_prefix.decoder_of(model)
    if decoder is not None and frozen_prefix.attached(decoder) is not None:  # the bottom layers from the cache
        logits = head_logits(model, last_hidden_states(model, input_ids, attention_mask)[:, -(k + 1):-1])
    else:  # the model's own forward (a sharded model runs only through its root)
        out = model(input_ids=input_ids, attention_mask=attention_mask,
                    position_ids=position_ids_from_mask(attention_mask), use_cache=False, logits_to_keep=k + 1)
        logits = out.logits[:, :-1].float()                  # position j predicts token j+1
    targets = input_ids[:, -k:]
    tok_logp = torch.log_softmax(logits, -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    keep = torch.arange(k, device=input_ids.device).unsqueeze(0) >= (k - n_action.to(input_ids.device)).unsqueeze(1)
    return tok_logp, keep


def action_logprobs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                    n_action: torch.Tensor) -> torch.Tensor:
    """Sum over the last n_action tokens of each left-padded row of log pi(token | prefix)
    (``action_token_logprobs``)."""
    tok_logp, keep = action_token_logprobs(model, input_ids, attention_mask, n_action)
    return (tok_logp * keep).sum(-1)


def encode_samples(tok, samples: list[dict], max_length: int) -> list[dict]:
    """Token ids of prompt + action + stop per sample (``models.encode_prompt_action``) and the action length."""
    rows = []
    for i, s in enumerate(samples):
        for key in ("observation", "action"):
            if not isinstance(s.get(key), str):
                raise ValueError(f"actor sample {i}: field {key!r} must be a string, got {type(s.get(key)).__name__}")
        enc = encode_prompt_action(tok, s["observation"], s["action"], max_length)
        rows.append({"input_ids": enc["input_ids"], "n_action": int(sum(enc["action_mask"]))})
    return rows


@torch.no_grad()
def sequence_logprobs(model, rows: list[dict], pad_id: int, batch_size: int = 8, progress: bool = False,
                      per_token: bool = False) -> torch.Tensor | list[list[float]]:
    """Action log-probs of encoded rows, batched by length, in eval mode without grad: per row their sum
    (``action_logprobs``; a [N] tensor) or, ``per_token``, the list of its n_action token log-probs."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    sums, tokens = torch.zeros(len(rows), dtype=torch.float32), [[] for _ in rows]
    order = sorted(range(len(rows)), key=lambda i: len(rows[i]["input_ids"]))
    batches = [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
    for idx in track(batches, description="reference log-probs", disable=not progress):
        ids, mask = left_pad([rows[i]["input_ids"] for i in idx], pad_id)
        n = torch.tensor([rows[i]["n_action"] for i in idx])
        tok_logp, keep = action_token_logprobs(model, ids.to(device), mask.to(device), n)
        sums[idx] = (tok_logp * keep).sum(-1).float().cpu()  # summed where and as the training sums
        for j, i in enumerate(idx if per_token else []):
            tokens[i] = tok_logp[j][keep[j]].float().cpu().tolist()
    model.train(was_training)
    return tokens if per_token else sums


# ---------------------------------------------------------------------------------------------
# precompute (once per phase, before the epoch; sharded over processes under accelerate launch)

def critic_prompts(samples: list[dict]) -> list[str]:
    """The distinct prompts whose critic values a phase's samples need (their states and next states), sorted."""
    return sorted({s["observation"] for s in samples} | {s["next_observation"] for s in samples})


def critic_values_for(samples: list[dict], critic: Critic, settings, progress: bool = True
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """(V(s), V(s')) for every sample, running the critic once per distinct prompt (no grad), in batches measured
    on a CPU (``Critic.values``)."""
    prompts = critic_prompts(samples)

    def run(ps):
        return critic.values(ps, progress=progress)[0].tolist()

    v_of = dict(zip(prompts, _dist_map(run, prompts)))
    v = torch.tensor([v_of[s["observation"]] for s in samples])
    nv = torch.tensor([v_of[s["next_observation"]] for s in samples])
    return v, nv


def compute_advantages(samples: list[dict], v: torch.Tensor, nv: torch.Tensor, cfg: WebRLConfig
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """(A, mask) for every sample in the configured loss mode (mask = which samples train)."""
    reward = torch.tensor([float(s["reward"]) for s in samples])
    if cfg.loss == "official":
        mc = torch.tensor([float(s["mc_return"]) for s in samples])
        return adv_mod.official_advantage(v, nv, reward, mc, cfg.margin)
    done = torch.tensor([float(bool(s["done"])) for s in samples])
    a = adv_mod.paper_advantage(v, nv, reward, done, cfg.lam)
    mask = torch.ones_like(a) if cfg.kl else (a > 0).float()
    return a, mask


def actor_loss_mode(cfg: WebRLConfig, critic_dir) -> str:
    """What ``train_actor`` trains: "grpo", "filtered_bc" (also ``kl=False`` without a critic), "sft" (``kl=False``
    with a critic: the Fig. 5 ablation), "paper" or "official" (these two need the critic)."""
    if cfg.loss in ActorTrainConfig.CRITIC_FREE:
        return cfg.loss
    if not cfg.kl:
        return "sft" if critic_dir is not None else "filtered_bc"
    if critic_dir is None:
        raise ValueError(f"train_actor: critic_dir is required for actor.loss={cfg.loss} (the critic-free losses: "
                         f"{', '.join(ActorTrainConfig.CRITIC_FREE)})")
    return cfg.loss


def _check_samples(samples: list[dict], mode: str) -> None:
    need = (("observation", "action", "task", "trajectory_reward", "episode_id") if mode in ("grpo", "filtered_bc")
            else ("observation", "next_observation", "action", "reward", "done", "mc_return"))
    for i, s in enumerate(samples):
        miss = [k for k in need if k not in s or s[k] is None]
        if miss:
            raise ValueError(f"actor sample {i} (episode {s.get('episode_id')!r}): missing field(s) {miss}")


def _sample_advantages(samples: list[dict], mode: str, cfg: WebRLConfig, critic_dir, settings, progress: bool
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, dict]:
    """(A, mask of the samples that train, V(s), stats) of the loss ``mode``; the critic, where one is used, is
    loaded, run once per distinct prompt and freed here (``critic_s``: its run, without the loading)."""
    if mode == "grpo":
        adv, stats = grpo.episode_advantages(samples, cfg.scale_rewards)
        # a sample with A = 0 adds exactly 0 to the clipped term and its gradient, so without the KL term it is
        # dropped (as the official branch drops its masked samples; the batch means are then over the others)
        mask = torch.ones_like(adv) if cfg.beta > 0 else (adv != 0).float()
        return adv, mask, torch.zeros(0), stats | {"critic_s": 0.0}
    if mode == "filtered_bc":
        kept, stats = filtered_bc.select_successful_episodes(samples, cfg.bc_length_quantile)
        kept_ids = {s["episode_id"] for s in kept}
        mask = torch.tensor([float(s["episode_id"] in kept_ids) for s in samples])
        return mask.clone(), mask, torch.zeros(0), {f"n_{k}": v for k, v in stats.items()} | {"critic_s": 0.0}
    with _whole_models():
        critic = Critic.load(critic_dir, dtype=settings.models.dtype, device=_process_device(settings),
                             max_length=settings.models.max_length)
    critic.requires_grad_(False)  # values only
    apply_attention(critic.backbone, settings.models, trainable=False)
    frozen_prefix.attach(critic.backbone, settings.models)  # the critic's epoch has seen these prompts
    t0 = time.perf_counter()
    looked_up = frozen_prefix.stats()
    with autocast_context(settings.models, critic.device):  # the epoch's autocast: its cached rows are found
        v, nv = critic_values_for(samples, critic, settings, progress)
    critic_s = time.perf_counter() - t0
    # one pass over the distinct prompts (a batch measured first adds seconds, not FLOPs: a lower bound then)
    shape = DecoderShape.of(critic.backbone)
    flops = shape.pass_flops(*lengths_sums(len(ids) for ids in critic.encode(critic_prompts(samples))),
                             frozen_prefix.tokens_since(looked_up)) if shape else None
    del critic  # freed before the actor is loaded: never two models in memory
    adv, mask = compute_advantages(samples, v, nv, cfg)
    return adv, mask, v, {"critic_s": round(critic_s, 3), "critic_values_flops": flops}


# ---------------------------------------------------------------------------------------------
# entry point

def train_actor(samples: list[dict], actor_dir: str | Path, out_dir: str | Path, settings,
                critic_dir: str | Path | None = None, max_steps: int | None = None, progress: bool = True) -> dict:
    """One actor update on step samples (transitions.py); saves an HF folder at ``out_dir``.

    ``critic_dir`` is required for the KL losses (official, paper) and their ``kl=False`` ablation; the critic-free
    losses (grpo, filtered_bc, and ``kl=False`` without a critic, which is filtered_bc) take None. Returns timings
    and statistics (with the trainable and total parameter counts; grpo: n_groups, n_uniform_groups,
    n_singleton_groups, n_episodes, mean_abs_adv, clip_fraction, ratio, kl; filtered_bc: n_episodes,
    n_successful_episodes, n_kept_episodes).

    The KL reference is the phase-start actor ``actor_dir``: its log-probs are computed by the freshly loaded model
    before the first update (with LoRA: a fresh, zero-initialised adapter on the merged ``actor_dir`` weights, so
    the model is exactly ``actor_dir``'s; see the module docstring), in the training forward's autocast."""
    out_dir = Path(out_dir)
    cfg = WebRLConfig.from_settings(settings, out_dir, max_steps)
    mode = actor_loss_mode(cfg, critic_dir)
    _check_samples(samples, mode)
    if mode == "filtered_bc":
        cfg.loss = "filtered_bc"  # kl=False without a critic: the same selection and NLL
    adv, mask, v, mode_stats = _sample_advantages(samples, mode, cfg, critic_dir, settings, progress)

    tok = load_tokenizer(actor_dir)
    models_cfg = settings.models.model_copy(update={"device": _process_device(settings)})
    set_seed(settings.run.seed)  # LoRA adapter init draws from the global RNG
    with _whole_models():
        model = load_causal_lm(actor_dir, models_cfg, trainable=True)
    frozen_prefix.attach(model, models_cfg)  # the reference pass keeps the bottom layers' states for the epoch
    keep = [i for i in range(len(samples)) if mask[i] > 0]  # masked-out samples add 0 loss and 0 gradient
    kept = [samples[i] for i in keep]
    rows = encode_samples(tok, kept, settings.models.max_length)
    reuse = settings.actor.reuse_replay_logprobs
    n_tok = torch.tensor([r["n_action"] for r in rows], dtype=torch.float32)
    adv_k, mask_k = adv[keep], mask[keep]
    ref: dict = {"s": 0.0, "prob": None, "reused": 0, "flops": 0.0}
    shape = DecoderShape.of(model)

    def reference_columns(trainer=None):
        """The phase-start actor's log-probs as dataset columns, computed by the model as it will train: after the
        calibration chose its attention kernel and micro-batch, in the training forward's autocast, so the first
        log-ratio is 0 (up to padding)."""
        t1 = time.perf_counter()
        micro = trainer.args.per_device_train_batch_size if trainer else cfg.per_device_train_batch_size

        def ref_pass(r, per_token=False):
            looked_up = frozen_prefix.stats()
            with autocast_context(models_cfg, next(model.parameters()).device):
                out = sequence_logprobs(model, r, tok.pad_token_id, micro, progress, per_token)
            ref["flops"] += shape.pass_flops(*lengths_sums(len(x["input_ids"]) for x in r),
                                             frozen_prefix.tokens_since(looked_up)) if shape else 0.0
            return out if per_token else out.tolist()

        ref_logp = None  # filtered_bc has no reference: its pass would be pure cost
        if mode == "grpo":
            ref_tokens = _dist_map(lambda r: ref_pass(r, per_token=True), rows) if rows else []
            ref_logp = torch.tensor([sum(t) for t in ref_tokens], dtype=torch.float32)
            for j, r in enumerate(rows):
                r.update(ref_token_logps=ref_tokens[j], adv=float(adv_k[j]))
        elif mode != "filtered_bc":
            # replayed steps carry their 1/PPL under this same actor: sum log pi = n log(1/PPL) (replay.py)
            scored = [j for j, s in enumerate(kept) if reuse and s.get("rank_score", 0) > 0]
            given = set(scored)
            fresh = [j for j in range(len(rows)) if j not in given]
            ref_logp = torch.zeros(len(rows))
            if fresh:
                ref_logp[fresh] = torch.tensor(_dist_map(ref_pass, [rows[j] for j in fresh]))
            for j in scored:
                ref_logp[j] = rows[j]["n_action"] * math.log(kept[j]["rank_score"])
            ref["reused"] = len(scored)
        ref["prob"] = None if ref_logp is None else adv_mod.reference_prob(ref_logp, n_tok)
        if mode not in ActorTrainConfig.CRITIC_FREE:  # the WebRL losses: per-sample beta from the reference
            if cfg.loss == "official":
                beta0 = adv_mod.official_beta(adv_k, ref["prob"], cfg.beta_low, cfg.beta_high)
            else:
                beta0 = torch.full_like(adv_k, cfg.beta)
            for j, r in enumerate(rows):
                r.update(ref_logp=float(ref_logp[j]), adv=float(adv_k[j]), mask=float(mask_k[j]),
                         beta0=float(beta0[j]))
        ref["s"] = round(time.perf_counter() - t1, 3)  # as the stats report it, and its share is measured
        if trainer is not None:
            trainer.train_dataset = Dataset.from_list(rows)

    for r in rows:
        r["length"] = len(r["input_ids"])

    def stats_now():
        mean_ref_prob = None if ref["prob"] is None else float(ref["prob"].mean()) if rows else 0.0
        return {"n_samples": len(samples), "n_train": len(rows), "n_positive": int((adv > 0).sum()),
                "ref_s": ref["s"], "n_ref_from_replay": ref["reused"],
                "mean_v": float(v.mean()) if len(v) else 0.0, "mean_ref_prob": mean_ref_prob, "loss_mode": mode,
                **mode_stats, **count_parameters(model)}

    if not rows:
        reference_columns()
        if _is_main_process():
            save_model(model, tok, out_dir)
        return stats_now() | {"train_s": 0.0, "train_loss": None, "steps": 0, "tokens": 0, "tokens_sq": 0,
                              "epochs": cfg.num_train_epochs, "loss_curve": []}
    from datasets import Dataset

    # the calibration times steps on placeholder reference columns (the step's cost does not depend on them)
    if mode == "grpo":
        placeholder = [dict(r, ref_token_logps=[0.0] * r["n_action"], adv=float(adv_k[j])) for j, r in enumerate(rows)]
    elif mode == "filtered_bc":
        placeholder = rows
    else:
        placeholder = [dict(r, ref_logp=0.0, adv=float(adv_k[j]), mask=float(mask_k[j]), beta0=cfg.beta)
                       for j, r in enumerate(rows)]
    trainer = WebRLTrainer(model=model, args=cfg, train_dataset=Dataset.from_list(placeholder),
                           data_collator=ActorCollator(tok.pad_token_id), callbacks=progress_callbacks("actor"),
                           max_completion_length=settings.policy.max_new_tokens)
    t2 = time.perf_counter()
    result = fit(trainer, "actor", settings.actor, settings.models.attn_implementation, reference_columns,
                 settings.models.compile_layers, settings.models.weight_casts, settings.models.dtype)
    stats = stats_now()
    # the seconds the stats report, which its share of the peak is then measured against
    t_train = round(time.perf_counter() - t2 - result.metrics["calibrate_s"] - ref["s"], 3)
    full = _full_model(trainer, lambda: load_causal_lm(actor_dir, models_cfg.model_copy(update={"device": "cpu"}),
                                                       trainable=True))
    if full is not None:
        save_model(full, tok, out_dir)
        loss_history.write(out_dir, "actor", trainer.state)
    trainer.accelerator.wait_for_everyone()
    tokens, tokens_sq = lengths_sums(len(r["input_ids"]) for r in rows)
    loss_stats = trainer.stat_means() if mode == "grpo" else {}
    peak = result.metrics["peak_flops"]
    epochs = cfg.num_train_epochs
    passes = passes_over_rows(trainer, result.global_step, len(rows))
    epoch_flops = shape.pass_flops(passes * tokens, passes * tokens_sq, result.metrics["cached"],
                                   train=True) if shape else None
    return stats | loss_stats | {
        "train_s": t_train, **trained_shape(result),
        "train_loss": result.training_loss, "steps": result.global_step, "tokens": int(tokens),
        "tokens_sq": int(tokens_sq), "epochs": epochs, "loss_curve": _loss_curve(trainer),
        **flop_stats("", epoch_flops, t_train, peak),
        **flop_stats("ref_", ref["flops"] or None, ref["s"], peak),
        **flop_stats("critic_values_", mode_stats.get("critic_values_flops"), mode_stats.get("critic_s", 0.0), peak)}

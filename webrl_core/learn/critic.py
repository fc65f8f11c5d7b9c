"""The WebRL critic V(s): the SFT model's backbone + two MLP heads (official ``webrl/models/critic.py``; trained by
``WebRLTrainer.critic_loss`` in ``webrl/algorithms/webrl/trainer.py``).

    h      = hidden state of the LAST NON-PAD token of the observation prompt s (works for right or left padding;
             the official code reads position -1, which is a pad token for batch > 1 with right padding)
    head_k = Linear(h,h) -> ReLU -> Linear(h,h) -> ReLU -> Linear(h,2),   k = 1, 2
    p_k    = softmax(head_k(h))[1]                      P(success) according to head k
    V(s)   = min(p_1, p_2)

Loss per sample (official ``critic_loss``; s and s' = next observation share the label y = 1[mc_return > 0])::

    L = CE(head_1(s), y) + CE(head_2(s), y) + CE(head_1(s'), y) + CE(head_2(s'), y)

Because s' of step t is byte-identical to s of step t+1, training runs on DISTINCT (prompt, label) pairs, each
weighted by how often it occurs as s or s' in the samples; the weighted loss equals the official sum over the
same data at half the forward/backward passes (:func:`critic_examples`).

Head init: the official code draws the first two Linears from N(0, 0.2) with zero bias and leaves the last one at
PyTorch's default. We keep that as the default (``CriticConfig.head_init_std = 0.2``, faithful). Note it is not
scale-aware: for h = 4096 the initial logits are large and V starts near 0 or 1; set ``head_init_std`` to about
1/sqrt(h) for a calmer start.

Any architecture: the backbone is ``AutoModel`` loaded from the actor/SFT folder (no ``.model`` attribute and no
hidden size 4096 assumed). Prompts are encoded with ``models.encode_prompt`` (the same ids the actor sees; a
too-long prompt loses the end of its current HTML, never the assistant header). Position ids come from the
attention mask, so left padding gives the same values as batch size 1.

Folder format (``save``/``load``): ``backbone/`` (HF ``save_pretrained`` + tokenizer, safetensors),
``heads.safetensors`` and ``critic.json`` (hidden size, init std, max length). A LoRA critic is saved with its
adapters merged into ``backbone/`` (the same format, loaded the same way) and the adapters alone in ``adapter/``.

Training (:meth:`Critic.for_training`, called by ``critic_trainer.train_critic``) follows ``models``: with
``models.lora.enabled`` the backbone gets LoRA adapters (peft, ``FEATURE_EXTRACTION`` task) and only the adapters
and the two heads train; otherwise everything trains. Trainable parameters (and the heads) are float32 master
weights; with ``models.dtype`` bfloat16/float16 the compute runs under the Trainer's autocast, and a LoRA
backbone's frozen base stays in the low dtype (see ``webrl_core.learn.models``, "Mixed precision").
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from webrl_core.learn.micro_batch import scoring_batch
from webrl_core.learn.models import (apply_lora, count_parameters, downcast_frozen,
                               enable_checkpointing, encode_prompt, from_pretrained, last_hidden_states, left_pad,
                               load_tokenizer, apply_attention, to_device, torch_dtype, train_top_layers,
                               upcast_trainable)
from webrl_core.logs import track

CRITIC_JSON = "critic.json"
HEADS_FILE = "heads.safetensors"
BACKBONE_DIR = "backbone"
ADAPTER_DIR = "adapter"


def resolve_dtype(dtype: str | torch.dtype = "float32") -> torch.dtype:
    return dtype if isinstance(dtype, torch.dtype) else torch_dtype(dtype)


def last_token_index(attention_mask: torch.Tensor) -> torch.Tensor:
    """Index of the last non-pad position of each row (right or left padding)."""
    pos = torch.arange(attention_mask.shape[1], device=attention_mask.device).expand_as(attention_mask)
    return torch.where(attention_mask.bool(), pos, torch.full_like(pos, -1)).max(dim=1).values.clamp(min=0)


def value_head(hidden: int, init_std: float | None) -> nn.Sequential:
    head = nn.Sequential(nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                         nn.Linear(hidden, 2))
    if init_std is not None:
        for lin in (head[0], head[2]):
            nn.init.normal_(lin.weight, mean=0.0, std=init_std)
            nn.init.zeros_(lin.bias)
    return head


def load_backbone(folder: str | Path, dtype: str | torch.dtype):
    """The decoder of an HF causal-LM folder (``AutoModel``); the LM head's weights are expected to be unused,
    so transformers' load report about them is silenced."""
    from transformers import AutoModel
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        return from_pretrained(AutoModel, folder, dtype=resolve_dtype(dtype))
    finally:
        hf_logging.set_verbosity(level)


def hidden_size_of(config) -> int:
    cfg = config.get_text_config() if hasattr(config, "get_text_config") else config
    for name in ("hidden_size", "d_model", "n_embd", "dim"):
        if getattr(cfg, name, None):
            return int(getattr(cfg, name))
    raise ValueError(f"cannot find the hidden size in the backbone config ({type(cfg).__name__})")


class Critic(nn.Module):
    """Double-head value model V(s) = min_k P_k(success | s). See the module docstring."""

    def __init__(self, backbone: nn.Module, tokenizer, head_init_std: float | None = 0.2, max_length: int = 4096):
        super().__init__()
        self.backbone = backbone
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.head_init_std = head_init_std
        self.hidden_size = hidden_size_of(backbone.config)
        dtype = next(backbone.parameters()).dtype
        self.head1 = value_head(self.hidden_size, head_init_std).to(dtype)
        self.head2 = value_head(self.hidden_size, head_init_std).to(dtype)
        if tokenizer is not None and tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token

    # -- construction / persistence -------------------------------------------------------------

    @classmethod
    def from_backbone(cls, model_dir: str | Path, head_init_std: float | None = 0.2, max_length: int = 4096,
                      dtype: str | torch.dtype = "float32", device: str = "auto", seed: int = 0) -> Critic:
        """A fresh critic on the backbone of an HF causal-LM folder (the SFT model), with new random heads."""
        model_dir = Path(model_dir)
        if not (model_dir / "config.json").exists():
            raise FileNotFoundError(f"critic backbone: {model_dir} is not an HF model folder (no config.json)")
        backbone = load_backbone(model_dir, dtype)  # decoder only, no LM head
        tok = load_tokenizer(model_dir)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            critic = cls(backbone, tok, head_init_std, max_length)
        return to_device(critic, device)

    def for_training(self, models_cfg) -> Critic:
        """Make this critic trainable as ``models_cfg`` (a ``ModelsConfig``) says, in place: gradient
        checkpointing; with ``lora.enabled`` LoRA adapters on the backbone (only adapters + heads train, the base
        stays frozen in the dtype it was loaded in), else every parameter trains; trainable parameters and the
        heads in float32. Load the critic in ``models.training_dtype(models_cfg)`` first (float32 for full
        fine-tuning). Returns self."""
        lora = models_cfg.lora
        if models_cfg.gradient_checkpointing:
            enable_checkpointing(self.backbone)
            if lora.enabled:  # checkpointed blocks over a frozen embedding need inputs that require grad
                self.backbone.enable_input_require_grads()
        if lora.enabled and not hasattr(self.backbone, "peft_config"):
            self.backbone.requires_grad_(False)
            self.backbone = apply_lora(self.backbone, lora, task_type="FEATURE_EXTRACTION")
        elif not lora.enabled and models_cfg.train_layers:
            train_top_layers(self.backbone, models_cfg.train_layers)
        elif not lora.enabled:
            self.backbone.requires_grad_(True)
        apply_attention(self.backbone, models_cfg, trainable=True)
        self.head1.float().requires_grad_(True)
        self.head2.float().requires_grad_(True)
        downcast_frozen(upcast_trainable(self), torch_dtype(models_cfg.dtype))
        return self.train()

    def parameter_counts(self) -> dict[str, int]:
        """{"trainable_params", "total_params"} of the whole critic (backbone, adapters, heads)."""
        return count_parameters(self)

    def save(self, out_dir: str | Path) -> Path:
        from safetensors.torch import save_file

        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        backbone = self.backbone
        if hasattr(backbone, "merge_and_unload"):  # LoRA: save the merged weights, keep the adapters in memory
            backbone.save_pretrained(out_dir / ADAPTER_DIR, safe_serialization=True)
            backbone = copy.deepcopy(backbone).merge_and_unload()
        backbone.save_pretrained(out_dir / BACKBONE_DIR, safe_serialization=True)
        if self.tokenizer is not None:
            self.tokenizer.save_pretrained(out_dir / BACKBONE_DIR)
        heads = {f"head1.{k}": v.detach().contiguous().cpu() for k, v in self.head1.state_dict().items()}
        heads |= {f"head2.{k}": v.detach().contiguous().cpu() for k, v in self.head2.state_dict().items()}
        save_file(heads, str(out_dir / HEADS_FILE))
        (out_dir / CRITIC_JSON).write_text(json.dumps({
            "format": "webrl-critic-v1", "hidden_size": self.hidden_size, "head_init_std": self.head_init_std,
            "max_length": self.max_length, "backbone": BACKBONE_DIR, "heads": HEADS_FILE}, indent=2))
        return out_dir

    @classmethod
    def load(cls, critic_dir: str | Path, dtype: str | torch.dtype = "float32", device: str = "auto",
             max_length: int | None = None) -> Critic:
        from safetensors.torch import load_file
        critic_dir = Path(critic_dir)
        meta_file = critic_dir / CRITIC_JSON
        if not meta_file.exists():
            raise FileNotFoundError(f"not a critic folder (no {CRITIC_JSON}): {critic_dir}")
        meta = json.loads(meta_file.read_text())
        backbone = load_backbone(critic_dir / meta["backbone"], dtype)
        tok = load_tokenizer(critic_dir / meta["backbone"])
        critic = cls(backbone, tok, meta.get("head_init_std"), max_length or meta.get("max_length", 4096))
        if critic.hidden_size != meta["hidden_size"]:
            raise ValueError(f"{meta_file}: hidden_size {meta['hidden_size']} != backbone's {critic.hidden_size}")
        state = load_file(str(critic_dir / meta["heads"]))
        critic.head1.load_state_dict({k[6:]: v for k, v in state.items() if k.startswith("head1.")})
        critic.head2.load_state_dict({k[6:]: v for k, v in state.items() if k.startswith("head2.")})
        return to_device(critic, device)

    # -- forward ----------------------------------------------------------------------------------

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits [B, 2] of both heads at the last non-pad token."""
        hidden = last_hidden_states(self.backbone, input_ids, attention_mask)
        idx = last_token_index(attention_mask)
        pooled = hidden[torch.arange(hidden.shape[0], device=hidden.device), idx]
        pooled = pooled.to(self.head1[0].weight.dtype)
        return self.head1(pooled), self.head2(pooled)

    def encode(self, prompts: list[str]) -> list[list[int]]:
        """Prompt ids as the actor sees them (BOS, observation cut before the assistant header if too long)."""
        return [encode_prompt(self.tokenizer, p, self.max_length) for p in prompts]

    def tokenize(self, prompts: list[str]) -> dict[str, torch.Tensor]:
        ids, mask = left_pad(self.encode(prompts), self.tokenizer.pad_token_id)
        return {"input_ids": ids, "attention_mask": mask}

    @torch.no_grad()
    def values(self, prompts: list[str], batch_size: int | None = None, progress: bool = False
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(V = min(p1, p2), p1, p2) for each prompt; prompts are batched by length to limit padding, ``batch_size``
        at a time (None: measured on a CPU, ``micro_batch.scoring_batch``; 8 elsewhere)."""
        if batch_size is None:
            batch_size = scoring_batch("critic", self, [len(p) for p in prompts],
                                       lambda idx, b: self.values([prompts[i] for i in idx], b), 8)
        was_training = self.training
        self.eval()
        n = len(prompts)
        p1, p2 = torch.zeros(n), torch.zeros(n)
        lengths = [len(p) for p in prompts]
        order = sorted(range(n), key=lambda i: lengths[i])
        batches = [order[i:i + batch_size] for i in range(0, n, batch_size)]
        for idx in track(batches, description="critic values", disable=not progress):
            enc = self.tokenize([prompts[i] for i in idx])
            l1, l2 = self(enc["input_ids"].to(self.device), enc["attention_mask"].to(self.device))
            p1[idx] = F.softmax(l1.float(), -1)[:, 1].cpu()
            p2[idx] = F.softmax(l2.float(), -1)[:, 1].cpu()
        self.train(was_training)
        return torch.minimum(p1, p2), p1, p2


def critic_loss(logits1: torch.Tensor, logits2: torch.Tensor, labels: torch.Tensor,
                weights: torch.Tensor | None = None, n_samples: torch.Tensor | float | None = None) -> torch.Tensor:
    """Sum over heads of the (weighted) cross-entropy against success labels.

    With weights w_i = occurrences of prompt i as s or s' and n_samples = sum(w)/2, this equals the official
    mean over samples of CE1(s)+CE2(s)+CE1(s')+CE2(s').
    """
    labels = labels.long()
    ce = F.cross_entropy(logits1.float(), labels, reduction="none") + F.cross_entropy(logits2.float(), labels,
                                                                                      reduction="none")
    if weights is None:
        return ce.mean()
    weights = weights.float()
    denom = (weights.sum() / 2.0) if n_samples is None else torch.as_tensor(n_samples, dtype=torch.float32)
    return (ce * weights).sum() / denom.clamp(min=1e-8)


def critic_examples(samples: list[dict]) -> list[dict]:
    """Distinct (prompt, label) training examples with weight = occurrences as s or s' (label = mc_return > 0)."""
    counts: dict[tuple[str, int], int] = {}
    for i, s in enumerate(samples):
        for key in ("observation", "next_observation", "mc_return"):
            if key not in s:
                raise ValueError(f"critic sample {i}: missing field {key!r}")
        y = int(float(s["mc_return"]) > 0)
        for prompt in (s["observation"], s["next_observation"]):
            counts[(prompt, y)] = counts.get((prompt, y), 0) + 1
    return [{"prompt": p, "label": y, "weight": float(w)} for (p, y), w in counts.items()]

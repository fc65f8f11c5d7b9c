"""Loading, building and saving the causal LMs every WebRL stage uses (actor, reference, critic backbone, ORM).

Contract:
- Any Hugging Face causal-LM folder works (Llama, Qwen2, Mistral, GPT-NeoX, Gemma, ...). Nothing here names an
  architecture's attributes: the backbone is ``model.get_decoder()``, the head ``model.get_output_embeddings()``,
  the width ``config.hidden_size`` (text sub-config for multimodal configs).
- Token ids of a training/scoring sample are built as

      input_ids = prompt_ids + action_ids + [stop_id]

  from *separately* tokenised prompt and action (so no BPE merge across the boundary can shift the action
  mask). ``prompt_ids`` starts with BOS when the tokenizer adds one to a text and the prompt text does not already
  start with it (Llama-3 behaviour; the ORM prompt carries its BOS as text; SmolLM2 adds none). ``stop_id`` is ``<|eot_id|>`` when the
  vocabulary has it, else EOS. When the sample is longer than ``max_length`` only the observation is cut: the
  prompt's text before its last ``<|eot_id|>`` (i.e. the end of the current HTML, like the character budget of
  ``build_prompt``); the assistant header after it and the action are always kept.
- ``save_model`` always writes a plain full-weights HF folder at ``out_dir``; with LoRA the adapter goes to
  ``out_dir/adapter`` and ``out_dir`` holds the merged weights, so every consumer loads ``out_dir`` the same way.
- The embedded default models (a tokenizer trained on our corpus, a random-init small LM) are built in
  :mod:`webrl_core.learn.embedded_model` and saved by :func:`save_model`.

Mixed precision (``models.dtype`` bfloat16 / float16; :func:`training_dtype`, :func:`trainer_precision_args`):

- A model loaded for TRAINING keeps its trainable parameters in float32 (the master weights AdamW updates) and
  runs its compute in the low dtype under autocast (``TrainingArguments`` ``bf16=True`` / ``fp16=True``; on CPU
  accelerate uses ``torch.autocast("cpu", bfloat16)``). Pure low-precision AdamW does not train at small learning
  rates: one bf16 weight of magnitude 0.02 has a spacing of 1.2e-4, so every update of lr 1e-6 rounds back to the
  old value (``tests/learn/test_mixed_precision.py`` measures it).
- Full fine-tuning: the trained weights are float32 (4 B/param weights + 4 grads + 8 Adam, plus the transient bf16
  copies autocast makes); ``save_model`` then writes the float32 master weights, so the next phase starts from
  exactly what this one ended with (a bf16 folder would round a phase's update away wherever it is below half a
  bf16 spacing). Frozen weights (``models.train_layers``' lower layers, embeddings, LM head) are stored in
  ``models.dtype`` (:func:`downcast_frozen`): autocast would compute with that rounding anyway, and casting them
  once at load time spares a cast per micro-batch. Loads for inference cast to ``models.dtype`` as before.
- LoRA: the frozen base stays in ``models.dtype`` (the memory win, 2 B/param) and only the adapters are float32
  (peft's ``autocast_adapter_dtype``); the merged folder is written in the base's dtype.
- float16 mixed precision needs a GPU (a loss-scaled autocast that accelerate only runs on accelerators): on CPU
  :func:`trainer_precision_args` raises and asks for bfloat16 or float32 instead of silently training in float32.
- Frozen models (reference, critic precompute, ORM scoring, serving) are loaded in ``models.dtype``.
"""

from __future__ import annotations

import contextlib
import copy
import os
import shutil
import threading
from pathlib import Path

import torch

from webrl_core.config import LoraConfig, ModelsConfig
from webrl_core.learn import box_measurements, frozen_prefix, matmul_attention
from webrl_core.learn.model_folder import ModelFolderError, check_model_folder
from webrl_core.prompts import BOS, EOT

ORM_ANSWER_TOKENS = ("YES", "NO")
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


# ---------------------------------------------------------------------------------------------
# devices, tokenizers, models

def resolve_device(spec: str = "auto") -> torch.device:
    """'auto' -> cuda if available else cpu; anything else is passed to torch.device."""
    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(spec)


def env_switch(name: str) -> bool:
    """An on/off environment variable of ours (off when unset); any other value is named."""
    value = os.environ.get(name, "0")
    if value not in ("0", "1", "false", "true", "no", "yes", ""):
        raise ValueError(f"{name}={value!r}: set 1 to turn it on, 0 (the default) to leave it off")
    return value in ("1", "true", "yes")


CUDNN_ATTENTION_ENV = "WEBRL_CUDNN_ATTENTION"


def to_device(module, spec: str = "auto"):
    """``module`` moved to the device ``spec`` names (:func:`resolve_device`). On CUDA, PyTorch's
    ``scaled_dot_product_attention`` then runs without its cuDNN backend for the rest of the process (flash,
    memory-efficient and math remain), unless ``WEBRL_CUDNN_ATTENTION=1``: on Hopper sdpa prefers cuDNN attention,
    which builds a graph for every new shape it meets, and a WebRL batch's padded length is new at almost every
    step (PyTorch's ``torch.backends.cuda.enable_cudnn_sdp``; measured in docs/benchmarks.md, "The training stages
    on a GPU")."""
    device = resolve_device(spec)
    if device.type == "cuda":
        torch.backends.cuda.enable_cudnn_sdp(env_switch(CUDNN_ATTENTION_ENV))
    return module.to(device)


def torch_dtype(name: str) -> torch.dtype:
    if name not in _DTYPES:
        raise ValueError(f"models.dtype={name!r} is not one of {sorted(_DTYPES)}")
    return _DTYPES[name]


# ---------------------------------------------------------------------------------------------
# mixed precision (module docstring)

_MIXED = {"float32": "no", "bfloat16": "bf16", "float16": "fp16"}


def mixed_precision_mode(cfg: ModelsConfig) -> str:
    """accelerate's ``mixed_precision`` for ``models.dtype``: float32 -> 'no', bfloat16 -> 'bf16', float16 -> 'fp16'
    (what ``launch`` passes to ``accelerate launch --mixed_precision``)."""
    torch_dtype(cfg.dtype)
    return _MIXED[cfg.dtype]


def training_dtype(cfg: ModelsConfig) -> torch.dtype:
    """The dtype a model is loaded in for TRAINING: float32 master weights for full fine-tuning; with LoRA the
    frozen base stays in ``models.dtype`` (the adapters are float32 either way)."""
    return torch_dtype(cfg.dtype) if cfg.lora.enabled else torch.float32


def trainer_precision_args(cfg: ModelsConfig, device: str | torch.device | None = None) -> dict[str, bool]:
    """``{"bf16": ..., "fp16": ...}`` for ``TrainingArguments``: autocast in ``models.dtype`` over float32 master
    weights. ``device`` (default: ``cfg.device`` resolved) is where the training runs; float16 on CPU raises."""
    mode = mixed_precision_mode(cfg)
    dev = resolve_device(cfg.device) if device is None else torch.device(device)
    if mode == "fp16" and dev.type == "cpu":
        raise ValueError("models.dtype=float16: fp16 mixed precision (autocast + loss scaling) needs a GPU, and "
                         "this training runs on CPU (models.device resolves to cpu). Use models.dtype=bfloat16 "
                         "(bf16 autocast works on CPU) or float32")
    return {"bf16": mode == "bf16", "fp16": mode == "fp16"}


def autocast_context(cfg: ModelsConfig, device: str | torch.device):
    """The autocast the Trainer runs the training forward in (``trainer_precision_args``), for passes outside it
    that must match it (the reference log-probs of the actor before its first update); a no-op for float32."""
    mode = mixed_precision_mode(cfg)
    dev = torch.device(device)
    if mode == "no" or (mode == "fp16" and dev.type == "cpu"):
        return contextlib.nullcontext()
    return torch.autocast(device_type=dev.type, dtype=torch_dtype(cfg.dtype))


def set_attention(model, implementation: str) -> None:
    """Every Hugging Face model inside ``model`` (an LM, a critic's backbone, a peft wrapper's base) computes its
    attention with ``implementation`` from the next forward on (``models.attn_implementation``; "matmul":
    :mod:`webrl_core.learn.matmul_attention`)."""
    from transformers import PreTrainedModel

    if implementation == matmul_attention.NAME:
        matmul_attention.register()
    for m in model.modules():
        if isinstance(m, PreTrainedModel) and m.config._attn_implementation != implementation:
            m.set_attn_implementation(implementation)


def loaded_attention(cfg: ModelsConfig, device: str | torch.device, trainable: bool) -> str | None:
    """The attention kernel a model is loaded with: ``models.attn_implementation`` when named; under auto, a model
    loaded to train on a CPU with calibration on gets "matmul" (it hands every call above its measured crossover to
    sdpa; the stage's calibration still measures it against sdpa), every other model None (transformers' default,
    sdpa: with the policy's KV cache the matmul kernel was no faster, docs/benchmarks.md)."""
    if cfg.attn_implementation != "auto":
        return cfg.attn_implementation
    cpu = torch.device(device).type == "cpu"
    return matmul_attention.NAME if trainable and cpu and box_measurements.enabled() else None


def apply_attention(model, cfg: ModelsConfig, trainable: bool) -> None:
    """Set the kernel of :func:`loaded_attention` on ``model`` (left as loaded when there is none)."""
    kernel = loaded_attention(cfg, next(model.parameters()).device, trainable)
    if kernel is not None:
        set_attention(model, kernel)


def _contiguous_input(module, args):
    return (args[0].contiguous(),) + tuple(args[1:])


def contiguous_head_input(model) -> None:
    """The LM head gets a contiguous input. ``generate`` and ``logits_to_keep`` hand it a slice of the last hidden
    states (``hidden[:, -k:, :]``), and for a batch of more than one row torch 2.13's CPU linear on such a strided
    bf16 input expands the [vocab, hidden] weight into one copy per row and runs a batched matmul: 575 ms against
    12.5 ms for a contiguous copy of the same slice (SmolLM2's 49,152 x 576 head, 4 x 16 positions, 2-core AMX
    Xeon). Copying the slice costs microseconds."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is not None and not getattr(head, "_webrl_contiguous_input", False):
        head.register_forward_pre_hook(_contiguous_input)
        head._webrl_contiguous_input = True


def attention_of(model) -> str | None:
    """The attention implementation of the first Hugging Face model inside ``model`` (None: there is none)."""
    from transformers import PreTrainedModel

    return next((m.config._attn_implementation for m in model.modules() if isinstance(m, PreTrainedModel)), None)


def upcast_trainable(model) -> torch.nn.Module:
    """Trainable parameters to float32 (the master weights); frozen ones keep their dtype."""
    for p in model.parameters():
        if p.requires_grad and p.is_floating_point() and p.dtype != torch.float32:
            p.data = p.data.float()
    return model


def downcast_frozen(model, dtype: torch.dtype) -> torch.nn.Module:
    """Frozen parameters (``models.train_layers``' lower layers, embeddings, LM head; LoRA's base) to the compute
    dtype: autocast would otherwise cast each of them from float32 again in every micro-batch's forward, and on a
    CPU with a bf16 matrix unit those copies, not the matmuls, take the time (a 2.2x faster SFT step on an AMX
    Xeon, the issue "The loop at the chip's speed"). Trainable parameters keep their float32 masters."""
    for p in model.parameters():
        if not p.requires_grad and p.is_floating_point() and p.dtype != dtype:
            p.data = p.data.to(dtype)
    return model


def count_parameters(model) -> dict[str, int]:
    """{"trainable_params": ..., "total_params": ...} (shared tensors counted once)."""
    seen, total, trainable = set(), 0, 0
    for p in model.parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        total += p.numel()
        trainable += p.numel() if p.requires_grad else 0
    return {"trainable_params": trainable, "total_params": total}


def _check_folder(path: str | os.PathLike, what: str) -> Path:
    return check_model_folder(path, what)


def _loading(p: Path, what: str, e: Exception) -> ModelFolderError:
    first = (str(e).strip().splitlines() or [""])[0][:300]
    return ModelFolderError(f"{p}: cannot load the {what}: {type(e).__name__}: {first}")


def load_tokenizer(path: str | os.PathLike):
    """The folder's tokenizer; pad falls back to EOS (left padding is set by the callers that batch)."""
    from transformers import AutoTokenizer

    p = _check_folder(path, "tokenizer")
    try:
        tok = AutoTokenizer.from_pretrained(str(p))
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise _loading(p, "tokenizer", e) from e
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


# transformers builds a model under torch's process-wide default dtype set to the load's dtype and then restores
# the default it found (modeling_utils.local_torch_dtype). Two threads loading at once (a flow's concurrent rollout
# shards) each restore what the other set, and the process is left at bf16. Loads therefore go one at a time.
_FROM_PRETRAINED = threading.Lock()


def from_pretrained(auto_class, folder: str | os.PathLike, **kwargs):
    """``auto_class.from_pretrained(folder, **kwargs)``, one thread at a time, so that concurrent loads leave
    ``torch.get_default_dtype()`` as it was."""
    with _FROM_PRETRAINED:
        return auto_class.from_pretrained(str(folder), **kwargs)


def load_causal_lm(path: str | os.PathLike, cfg: ModelsConfig, trainable: bool = False):
    """A causal LM on ``cfg.device``. Frozen (default): in ``cfg.dtype``, eval mode, ``requires_grad=False``.
    Trainable: train mode, gradient checkpointing and LoRA by config, loaded in :func:`training_dtype` -- float32
    master weights for full fine-tuning (compute in ``cfg.dtype`` comes from the Trainer's autocast,
    :func:`trainer_precision_args`), or with LoRA the frozen base in ``cfg.dtype`` and float32 adapters."""
    from transformers import AutoModelForCausalLM

    p = _check_folder(path, "model")
    dtype = training_dtype(cfg) if trainable else torch_dtype(cfg.dtype)
    try:
        model = from_pretrained(AutoModelForCausalLM, p, dtype=dtype)
    except Exception as e:  # a broken folder surfaces as OSError, ValueError, SafetensorError, ...: name it
        if isinstance(e, (MemoryError, KeyboardInterrupt)) or type(e).__name__ == "OutOfMemoryError":
            raise
        raise _loading(p, "model", e) from e
    to_device(model, cfg.device)
    contiguous_head_input(model)
    apply_attention(model, cfg, trainable)
    if not trainable:
        model.eval().requires_grad_(False)
        return model
    model.train()
    if cfg.gradient_checkpointing:
        enable_checkpointing(model)
    if cfg.train_layers:
        train_top_layers(model, cfg.train_layers)
    if cfg.lora.enabled:
        if cfg.gradient_checkpointing:  # inputs must require grad for checkpointed frozen embeddings
            model.enable_input_require_grads()
        model = apply_lora(model, cfg.lora)
    return downcast_frozen(upcast_trainable(model), torch_dtype(cfg.dtype))


def decoder_layers(model, what: str) -> tuple[torch.nn.Module, list[torch.nn.Module]]:
    """The decoder of a causal LM or backbone (LoRA-wrapped or not) and its list of layers; ``what`` names the
    setting that needs them in the error when there is none."""
    base = unwrap(model)
    decoder = base if hasattr(base, "layers") or hasattr(base, "h") else base.get_decoder()
    layers = getattr(decoder, "layers", None) or getattr(decoder, "h", None)
    if layers is None:
        raise ValueError(f"{what}: {type(decoder).__name__} has no list of decoder layers (.layers/.h)")
    return decoder, list(layers)


COMPILE_PAYS_PASSES = 500
"""``models.compile_layers: auto`` compiles a stage of at least this many forward/backward passes. The compilation
costs 13-40 s a stage process on a 2-core CPU (inductor's code on disk or not) and saves 0.07-0.19 of each pass
(0.6-0.7 s a pass of the demo's SFT here), so it pays from about 300 passes; the demo's SFT runs about 800, its actor
stage about 400 (docs/benchmarks.md#compiled-decoder-layers-modelscompile_layers)."""


def compile_layers(model, setting: str, passes: int) -> bool:
    """``models.compile_layers``: each decoder layer of a model about to train runs through ``torch.compile``
    (inductor, dynamic shapes) when ``setting`` is ``on``, or ``auto`` and the stage runs at least
    ``COMPILE_PAYS_PASSES`` forward/backward ``passes``. The layer's normalisations, rotary embedding, activation and
    autocast casts are fused into fewer kernels. The weights' names, saving and the trained values (up to rounding)
    do not change. Returns whether it compiled."""
    if setting not in ("off", "on", "auto"):
        raise ValueError(f"models.compile_layers={setting!r}: off, on or auto")
    if setting == "off" or (setting == "auto" and passes < COMPILE_PAYS_PASSES):
        return False
    on_cpu = next(model.parameters()).device.type == "cpu"
    cxx = os.environ.get("CXX", "g++")  # inductor's (torch._inductor.config.cpp.cxx) for its CPU kernels
    if on_cpu and not shutil.which(cxx):
        if setting == "on":
            raise RuntimeError(f"models.compile_layers=on: inductor needs a C++ compiler for CPU kernels ({cxx} "
                               "or $CXX), and there is none on the PATH; install one (apt install g++) or set off")
        print(f"models.compile_layers=auto: no {cxx} on the PATH, so the layers run eager", flush=True)
        return False
    if attention_of(model) == matmul_attention.NAME:
        matmul_attention.crossovers_before_compiling(getattr(model, "backbone", model))
    for layer in decoder_layers(getattr(model, "backbone", model), "models.compile_layers")[1]:
        layer.compile(dynamic=True)
    return True


def train_top_layers(model, n: int) -> None:
    """Freeze everything except the top ``n`` decoder layers and the final norm (``models.train_layers``): the
    backward pass then stops at the lowest trained layer, which on a CPU without fast bf16 more than doubles the
    trained tokens per second of a 30-layer model (SmolLM2-135M: 66 -> 170 tokens/s with 10 of 30 layers)."""
    decoder, layers = decoder_layers(model, "models.train_layers")
    if n > len(layers):
        raise ValueError(f"models.train_layers={n} but the model has {len(layers)} decoder layers")
    model.requires_grad_(False)
    for layer in list(layers)[len(layers) - n:]:
        layer.requires_grad_(True)
    for name in ("norm", "final_layernorm", "ln_f"):
        if isinstance(getattr(decoder, name, None), torch.nn.Module):
            getattr(decoder, name).requires_grad_(True)


def enable_checkpointing(model) -> None:
    """Gradient (activation) checkpointing, non-reentrant; ``use_cache`` off."""
    # transformers 5 renamed it (the old name warns); keep both for older versions
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.config.use_cache = False


def apply_lora(model, lora: LoraConfig, task_type: str = "CAUSAL_LM"):
    """Wrap ``model`` in a peft LoRA adapter (only the adapter weights train; they are float32 even on a bf16/fp16
    base). ``task_type``: "CAUSAL_LM" for a causal LM, "FEATURE_EXTRACTION" for a bare decoder (the critic's
    backbone). A fresh adapter starts with ``lora_B = 0``, so the wrapped model computes exactly what ``model``
    did: trained on a merged folder (``save_model``), it starts as that folder's model."""
    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model

    pcfg = PeftLoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                          target_modules=lora.target_modules, task_type=task_type)
    return upcast_trainable(get_peft_model(model, pcfg, autocast_adapter_dtype=True))


def unwrap(model):
    """The transformers model under a peft wrapper (LoRA layers stay injected)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def hidden_size_of(model) -> int:
    cfg = unwrap(model).config
    text_cfg = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    size = getattr(text_cfg, "hidden_size", None)
    return int(size) if size else int(unwrap(model).get_input_embeddings().embedding_dim)


def backbone_and_hidden_size(model) -> tuple[torch.nn.Module, int]:
    """(decoder without LM head, hidden size): what the critic puts its heads on."""
    return unwrap(model).get_decoder(), hidden_size_of(model)


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions that ignore left padding (forward() alone would count the pads)."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def last_hidden_states(model, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                       prompt_lengths: list[int] | None = None) -> torch.Tensor:
    """Final-layer hidden states [B, T, H] of the backbone (no LM head, no vocabulary-sized tensor); the frozen
    bottom layers' from ``frozen_prefix``'s cache where one is attached (``prompt_lengths``: where each row's
    prompt ends, kept apart for a later pass over the prompts alone). ``model``: a causal LM or a bare decoder
    (the critic's backbone)."""
    decoder = frozen_prefix.decoder_of(model)
    backbone = decoder if decoder is not None else backbone_and_hidden_size(model)[0]
    positions = position_ids_from_mask(attention_mask)
    prefix = frozen_prefix.attached(backbone)
    if prefix is not None:
        return frozen_prefix.hidden_states(backbone, prefix, input_ids, attention_mask, positions, prompt_lengths)
    out = backbone(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions, use_cache=False)
    return out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]


def head_logits(model, hidden: torch.Tensor) -> torch.Tensor:
    """LM-head logits for selected hidden states only (with Gemma-style final soft-capping when configured)."""
    base = unwrap(model)
    logits = base.get_output_embeddings()(hidden).float()
    cap = getattr(base.config, "final_logit_softcapping", None)
    if cap:
        logits = torch.tanh(logits / cap) * cap
    return logits


# ---------------------------------------------------------------------------------------------
# prompt/action token alignment

def eot_token_id(tok) -> int | None:
    """Id of ``<|eot_id|>`` when it is one token of the vocabulary, else None."""
    eot = tok.convert_tokens_to_ids(EOT)
    if isinstance(eot, int) and eot >= 0 and (tok.unk_token_id is None or eot != tok.unk_token_id):
        return eot
    return None


def stop_token_id(tok) -> int:
    """``<|eot_id|>`` when the vocabulary has it (Llama-3, the embedded tokenizer), else EOS."""
    eot = eot_token_id(tok)
    if eot is not None:
        return eot
    if tok.eos_token_id is None:
        raise ValueError(f"tokenizer {tok.name_or_path!r} has neither {EOT!r} nor an EOS token")
    return tok.eos_token_id


def adds_bos(tok) -> bool:
    """Whether the tokenizer itself puts BOS before a text (Llama-3 and the embedded tokenizer do; SmolLM2, whose
    BOS is the ChatML ``<|im_start|>``, does not). Servers (vLLM) tokenise a completion prompt the same way."""
    if tok.bos_token_id is None:
        return False
    cached = getattr(tok, "_webrl_adds_bos", None)
    if cached is None:
        cached = tok.bos_token_id in tok("x", add_special_tokens=True)["input_ids"][:1]
        try:
            tok._webrl_adds_bos = cached
        except AttributeError:
            pass
    return cached


def prompt_token_ids(tok, prompt: str) -> list[int]:
    """BOS (if the tokenizer adds one to a text and this text does not start with it) + the prompt's tokens."""
    ids = tok.encode(prompt, add_special_tokens=False)
    if adds_bos(tok) and not prompt.startswith(tok.bos_token or BOS):
        ids = [tok.bos_token_id] + ids
    return ids


def truncate_prompt_ids(ids: list[int], room: int, eot_id: int | None, tok=None) -> list[int]:
    """Cut the observation so the prompt fits ``room`` tokens: drop the end of the text before the last
    ``<|eot_id|>`` (the end of the current HTML) and keep the assistant header after it, together with the
    whitespace tokens just before it (the "\n\n" separator) when ``tok`` is given. Without an ``<|eot_id|>``
    keep the first part and the last min(32, room/4) tokens."""
    if len(ids) <= room:
        return ids
    split = None
    if eot_id is not None:
        for i in range(len(ids) - 1, -1, -1):
            if ids[i] == eot_id:
                split = i
                break
    if split is not None and tok is not None:
        for _ in range(4):
            if split > 1 and not tok.decode([ids[split - 1]]).strip():
                split -= 1
            else:
                break
    tail_len = len(ids) - split if split is not None else min(32, room // 4)
    if tail_len > room:
        raise ValueError(f"the prompt's closing part needs {tail_len} tokens but only {room} fit; raise models.max_length")
    head = room - tail_len
    return ids[:head] + ids[len(ids) - tail_len:]


def fit_prompt_ids(tok, prompt: str, room: int) -> list[int]:
    """The prompt's ids cut to ``room`` tokens (``truncate_prompt_ids``). A tokenizer for which ``<|eot_id|>`` is
    plain text (SmolLM2, Qwen) has no such id to split at: a prompt that does not fit is split at the text of its
    last ``<|eot_id|>`` instead (whitespace before it goes with the tail), each side tokenised alone, and the end
    of the head (the end of the current HTML) is cut. A prompt that fits is tokenised whole, as a server would."""
    ids = prompt_token_ids(tok, prompt)
    eot = eot_token_id(tok)
    if len(ids) <= room or eot is not None or EOT not in prompt:
        return truncate_prompt_ids(ids, room, eot, tok)
    cut = prompt.rindex(EOT)
    while cut > 0 and prompt[cut - 1].isspace():
        cut -= 1
    tail = tok.encode(prompt[cut:], add_special_tokens=False)
    if len(tail) > room:
        raise ValueError(f"the prompt's closing part needs {len(tail)} tokens but only {room} fit; raise models.max_length")
    return prompt_token_ids(tok, prompt[:cut])[:room - len(tail)] + tail


def encode_prompt_action(tok, prompt: str, action: str, max_length: int) -> dict[str, list[int]]:
    """input_ids = prompt_ids + action_ids + [stop]; labels -100 on the prompt; action_mask 1 on action + stop."""
    stop = stop_token_id(tok)
    action_ids = tok.encode(action, add_special_tokens=False) + [stop]
    room = max_length - len(action_ids)
    if room < 1:
        raise ValueError(f"action of {len(action_ids)} tokens does not fit models.max_length={max_length}")
    p_ids = fit_prompt_ids(tok, prompt, room)
    input_ids = p_ids + action_ids
    return {
        "input_ids": input_ids,
        "attention_mask": [1] * len(input_ids),
        "labels": [-100] * len(p_ids) + action_ids,
        "action_mask": [0] * len(p_ids) + [1] * len(action_ids),
    }


def encode_prompt(tok, prompt: str, max_length: int) -> list[int]:
    """Prompt ids alone, cut like ``encode_prompt_action`` does (generation, ORM, critic inputs)."""
    return fit_prompt_ids(tok, prompt, max_length)


def left_pad(seqs: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, T] ids and attention mask with left padding (all sequences end at the last column)."""
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        if s:
            ids[i, width - len(s):] = torch.tensor(s, dtype=torch.long)
            mask[i, width - len(s):] = 1
    return ids, mask


def n_params(model) -> int:
    return sum(p.numel() for p in model.parameters())


def save_model(model, tokenizer, out_dir: str | os.PathLike, merge_lora: bool = True) -> Path:
    """HF folder (safetensors) + tokenizer. A peft model: adapter in ``out_dir/adapter`` and, with merge_lora,
    the merged full weights in ``out_dir`` (merged on a copy, so training can go on), in the base's dtype.
    Weights are written in the dtype they have: a mixed-precision full fine-tune writes its float32 master
    weights (module docstring)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if hasattr(model, "peft_config"):
        model.save_pretrained(str(out / "adapter"), safe_serialization=True)
        tokenizer.save_pretrained(str(out / "adapter"))
        if not merge_lora:
            return out / "adapter"
        full = copy.deepcopy(model).merge_and_unload()
    else:
        full = model
    # the saved config must not carry training's use_cache=False to inference servers
    use_cache = getattr(full.config, "use_cache", True)
    full.config.use_cache = True
    full.save_pretrained(str(out), safe_serialization=True)
    full.config.use_cache = use_cache
    tokenizer.save_pretrained(str(out))
    return out

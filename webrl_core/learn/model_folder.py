"""Is a folder a usable Hugging Face causal LM (or tokenizer)? Checked before anything loads, so a wrong folder fails
in a second with a message naming the folder and the missing or broken file (``check_model_folder``): a parseable
``config.json`` of an architecture this transformers knows as a causal LM (not an encoder, not another task's head),
complete weights (a truncated safetensors file is caught by its header) and a tokenizer."""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import os
import re
import struct
from pathlib import Path

from webrl_core.artifacts import replace_text, user_cache_dir
from webrl_core.errors import BadInput, MissingInput
from webrl_core.pretrained import missing_hint


class ModelFolderError(BadInput):
    """A model or tokenizer folder cannot be used; the message names the folder, the file and what is expected."""


class ModelFolderMissing(ModelFolderError, MissingInput):
    """The model folder does not exist (also a FileNotFoundError, as before)."""


# files that hold a tokenizer's vocabulary (any one is enough; tokenizer_config.json alone is not)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "spiece.model",
                   "sentencepiece.bpe.model", "tiktoken.model")
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")


def _listing(p: Path, n: int = 12) -> str:
    names = sorted(x.name for x in p.iterdir())
    return ", ".join(names[:n]) + (f", ... ({len(names)} files)" if len(names) > n else "") if names else "nothing"


def _check_safetensors(f: Path, label: str = "") -> None:
    """The header of a .safetensors file is readable and the file is as long as the header says."""
    size = f.stat().st_size
    try:
        with open(f, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            if n > size - 8:
                raise ValueError("header longer than the file")
            header = json.loads(fh.read(n))
        end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
    except (struct.error, ValueError, KeyError, TypeError, IndexError) as e:
        raise ModelFolderError(f"{label}{f}: not a readable safetensors file ({e}); the file is damaged or was not "
                               f"fully copied") from None
    if 8 + n + end != size:
        raise ModelFolderError(f"{label}{f}: {size} bytes but its header describes {8 + n + end}; the file was "
                               f"cut short (an interrupted copy or download?)")


def check_model_folder(path: str | os.PathLike, what: str = "model", field: str | None = None) -> Path:
    """Fail with a :class:`ModelFolderError` naming the folder and the missing or broken file, before any loading:
    ``what="model"``: a folder with a parseable config.json of an architecture this transformers knows as a causal
    LM, weights (safetensors or .bin, shards complete) and a tokenizer; ``what="tokenizer"``: tokenizer files."""
    p = Path(os.path.expanduser(str(path)))
    label = f"{field}: " if field else ""
    if not p.exists():
        raise ModelFolderMissing(f"{label}model folder {str(path)!r} does not exist{missing_hint(p)}")
    if not p.is_dir():
        raise ModelFolderError(f"{label}{str(path)!r} is a file; expected a Hugging Face model folder "
                               f"(config.json, weights, tokenizer)")
    if not any((p / f).is_file() for f in TOKENIZER_FILES) and not any(p.glob("*.tiktoken")):
        raise ModelFolderError(f"{label}{p}: no tokenizer (none of {', '.join(TOKENIZER_FILES)}); it has: "
                               f"{_listing(p)}. Save the tokenizer into the folder (tokenizer.save_pretrained)")
    if what == "tokenizer":
        return p
    cfg_file = p / "config.json"
    if not cfg_file.is_file():
        raise ModelFolderError(f"{label}{p}: not a Hugging Face model folder (no config.json); it has: {_listing(p)}")
    try:
        cfg = json.loads(cfg_file.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise ModelFolderError(f"{label}{cfg_file}: not valid JSON ({e})") from None
    mt = cfg.get("model_type") if isinstance(cfg, dict) else None
    tables = architecture_names()
    if mt not in tables["known"]:
        raise ModelFolderError(
            f"{label}{cfg_file}: model_type {mt!r} is not an architecture transformers {tables['version']} "
            f"knows (e.g. 'llama', 'qwen2', 'mistral', 'gpt_neox'); custom-code models are not loaded")
    if mt not in tables["causal"]:
        raise ModelFolderError(f"{label}{cfg_file}: model_type {mt!r} has no causal-LM class (AutoModelForCausalLM); "
                               f"webrl needs a decoder language model")
    not_causal = _not_a_causal_lm(cfg, mt, tables)
    if not_causal:
        raise ModelFolderError(f"{label}{cfg_file}: {not_causal}; webrl needs a decoder language model (a causal LM "
                               f"such as LlamaForCausalLM or Qwen2ForCausalLM)")
    shards: list[Path] = []
    index = next((p / f for f in ("model.safetensors.index.json", "pytorch_model.bin.index.json")
                  if (p / f).is_file()), None)
    if index is not None:
        try:
            names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise ModelFolderError(f"{label}{index}: not a valid shard index ({e})") from None
        missing = [n for n in names if not (p / n).is_file()]
        if missing:
            raise ModelFolderError(f"{label}{p}: {len(missing)} of {len(names)} weight shard(s) named by {index.name} "
                                   f"are missing, e.g. {missing[:3]}")
        shards = [p / n for n in names]
    elif (p / "model.safetensors").is_file():
        shards = [p / "model.safetensors"]
    elif not (p / "pytorch_model.bin").is_file():
        raise ModelFolderError(f"{label}{p}: no weights (none of {', '.join(WEIGHT_FILES)}); it has: {_listing(p)}")
    for f in shards:
        if f.suffix == ".safetensors":
            _check_safetensors(f, label)
    return p


_TASK_HEADS = re.compile(r"For(MaskedLM|SequenceClassification|TokenClassification|QuestionAnswering|MultipleChoice|"
                         r"NextSentencePrediction|PreTraining|ConditionalGeneration|ImageClassification|CTC)$")


def architecture_names() -> dict:
    """transformers' model types: ``known`` (every config class), ``causal`` (those with an AutoModelForCausalLM
    class), ``masked`` (those with a masked-LM class: encoders) and ``causal_classes``. Importing transformers' auto
    tables takes seconds (it imports torch), so they are kept per transformers version in the user's cache
    (``~/.cache/webrl/``): a wrong folder is then refused at once."""
    version = importlib.metadata.version("transformers")
    cache = user_cache_dir() / f"transformers-{version}-architectures.json"
    try:
        return json.loads(cache.read_text())
    except (OSError, ValueError):
        pass
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
    from transformers.models.auto.modeling_auto import (MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
                                                        MODEL_FOR_MASKED_LM_MAPPING_NAMES)

    names = {"version": version, "known": sorted(CONFIG_MAPPING_NAMES), "causal": sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES),
             "masked": sorted(MODEL_FOR_MASKED_LM_MAPPING_NAMES),
             "causal_classes": sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values())}
    with contextlib.suppress(OSError):  # a read-only home: recomputed next time
        replace_text(cache, json.dumps(names))
    return names


def _not_a_causal_lm(cfg: dict, model_type: str, tables: dict) -> str:
    """Why a config.json whose model type has a causal-LM class still describes no causal LM, else ''.
    A checkpoint whose every ``architectures`` entry is another task's head (sequence classification, masked LM,
    encoder-decoder generation, ...) was not trained to generate; an encoder (BERT, RoBERTa, ELECTRA, ...: a model
    type transformers also maps to a masked-LM class) loads as a causal LM only when saved as a decoder
    (``is_decoder``) or with a causal-LM class in ``architectures``."""
    archs = [a for a in cfg.get("architectures") or [] if isinstance(a, str)]
    causal = set(archs) & set(tables["causal_classes"])
    if archs and not causal and all(_TASK_HEADS.search(a) for a in archs):
        return f"architectures {archs} is a {_TASK_HEADS.search(archs[0]).group(1)} model, not a causal LM"
    if model_type in tables["masked"] and not cfg.get("is_decoder") and not causal:
        given = f"architectures {archs}" if archs else "no architectures given"
        return f"model_type {model_type!r} is an encoder (is_decoder is not true; {given})"
    return ""




def kv_width(config: dict) -> int:
    """Keys (or values) per token per layer of a decoder config (``config.json`` as a dict; a multimodal one's
    ``text_config``): ``num_key_value_heads`` (grouped-query attention; all heads when unset) x ``head_dim`` (when
    unset, ``hidden_size / num_attention_heads``). A missing field raises KeyError naming it."""
    config = config.get("text_config") or config
    heads = int(config["num_attention_heads"])
    kv_heads = int(config.get("num_key_value_heads") or heads)
    return kv_heads * int(config.get("head_dim") or int(config["hidden_size"]) // heads)

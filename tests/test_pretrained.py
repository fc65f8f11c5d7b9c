"""Pretrained models as managed inputs: the GGUF import (logits equal to transformers' own GGUF load), the manifest
written once, short names in configs, the error that names the setup command; the automatic dtype choice."""

from __future__ import annotations

import json

import pytest
import torch

from webrl_core.config import ModelsConfig
from webrl_core.config_loader import ConfigError, load_config
from webrl_core.hardware import auto_dtype
from webrl_core.pretrained import (MANIFEST, import_gguf, load_gguf, model_folder, packaged_gguf, resolve_model_ref,
                                   setup_model)

SMOL = "smollm2-135m-instruct"
PROMPTS = ["What is the capital of France?", "Task: Search for the product 'Kestrel Deluxe Board Game'",
           '<|im_start|>user\nType [12] "hello"<|im_end|>']


@pytest.fixture(scope="module")
def smol_folder():
    return setup_model(SMOL)  # made by `make setup`; made here when it is not


def test_converted_folder_has_the_gguf_logits(smol_folder):
    from transformers import AutoModelForCausalLM

    from webrl_core.learn.model_folder import check_model_folder
    from webrl_core.learn.models import load_tokenizer

    check_model_folder(smol_folder)
    cfg = json.loads((smol_folder / "config.json").read_text())
    assert "quantization_config" not in cfg and cfg["model_type"] == "llama"
    manifest = json.loads((smol_folder / MANIFEST).read_text())
    assert manifest["parameters"] == 134515008 and len(manifest["source_sha256"]) == 64
    reference, ref_tok = load_gguf(packaged_gguf(SMOL))
    plain = AutoModelForCausalLM.from_pretrained(str(smol_folder), dtype=torch.float32).eval()
    tok = load_tokenizer(smol_folder)
    assert tok.chat_template and tok.eos_token == "<|im_end|>" and tok.pad_token_id == tok.eos_token_id
    with torch.no_grad():
        for p in PROMPTS:
            ids = tok(p, return_tensors="pt")["input_ids"]
            assert ids.tolist() == ref_tok(p, return_tensors="pt")["input_ids"].tolist()
            a, b = plain(input_ids=ids).logits, reference(input_ids=ids).logits
            assert torch.allclose(a, b, atol=1e-4, rtol=1e-4), (p, (a - b).abs().max().item())
            assert a[0, -1].argmax() == b[0, -1].argmax()


def test_manifest_is_written_once(smol_folder, tmp_path):
    before = (smol_folder / MANIFEST).read_text()
    assert import_gguf(packaged_gguf(SMOL), smol_folder) == smol_folder  # same source: kept as it is
    assert (smol_folder / MANIFEST).read_text() == before
    other = tmp_path / "other.gguf"
    other.write_bytes(b"not the same file")
    with pytest.raises(FileExistsError, match="already holds a model made from"):
        import_gguf(other, smol_folder)
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "x.txt").write_text("x")
    with pytest.raises(FileExistsError, match="not a webrl model folder"):
        import_gguf(packaged_gguf(SMOL), tmp_path / "busy")


def test_short_names_resolve_in_configs(smol_folder):
    assert resolve_model_ref("smollm2-135m") == str(smol_folder) == resolve_model_ref(SMOL)
    assert resolve_model_ref("runs/x/actor") == "runs/x/actor"
    s = load_config("demo", [], [f"models.actor={SMOL}", "models.orm=smollm2"])
    assert s.models.actor == str(smol_folder) and s.models.orm == str(smol_folder)


def test_a_missing_model_names_the_command_that_makes_it(tmp_path, monkeypatch):
    monkeypatch.setenv("WEBRL_MODEL_CACHE", str(tmp_path / "empty"))
    assert model_folder(SMOL) == tmp_path / "empty" / SMOL
    with pytest.raises(ConfigError, match=f"webrl models setup {SMOL}"):
        load_config("demo", [], [f"models.actor={SMOL}"])


def test_auto_dtype_follows_the_hardware(monkeypatch):
    assert auto_dtype("cpu", frozenset({"avx2", "amx_bf16", "amx_tile"}))[0] == "bfloat16"
    assert auto_dtype("cpu", frozenset({"avx512f", "avx512_bf16"}))[0] == "bfloat16"
    dtype, why = auto_dtype("cpu", frozenset({"avx2", "fma"}))
    assert dtype == "float32" and "emulated" in why
    m = ModelsConfig(device="cpu")  # the suite fixes the CPU's choice (tests/conftest.py)
    assert m.dtype == "float32" and m.dtype_reason == "auto: WEBRL_CPU_DTYPE=float32"
    monkeypatch.delenv("WEBRL_CPU_DTYPE")
    m = ModelsConfig(device="cpu")  # without it: this box's flags
    assert m.dtype in ("float32", "bfloat16") and m.dtype_reason.startswith("auto: CPU")
    monkeypatch.setenv("WEBRL_CPU_DTYPE", "float16")
    with pytest.raises(ValueError, match="WEBRL_CPU_DTYPE='float16'"):
        ModelsConfig(device="cpu")
    assert ModelsConfig(dtype="float32").dtype_reason == ""  # an explicit choice is kept as given
    assert ModelsConfig(dtype="float32").dtype_why == "set by models.dtype"  # and printed as such

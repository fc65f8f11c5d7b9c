"""The embedded default models: no hub downloads, so a run with no model folder trains its own tokenizer and
builds its own small causal LM.

- A byte-level BPE trained with ``tokenizers`` on our own corpus, with ``prompts.SPECIAL_TOKENS`` atomic (pad
  ``<pad>``, bos ``<|begin_of_text|>``, eos ``<|eot_id|>``) and "YES"/"NO" as added single tokens (the ORM reads
  their next-token logits, so each must be exactly one id).
- A small Llama / Qwen2 / GPT-NeoX built from ``models.embedded`` with random weights, saved by
  :func:`webrl_core.learn.models.save_model` as a normal HF folder (safetensors) that
  ``AutoModelForCausalLM.from_pretrained`` and vLLM load like any other checkpoint.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable

import torch

from webrl_core.config import EmbeddedModelConfig
from webrl_core.learn.models import ORM_ANSWER_TOKENS, load_tokenizer, save_model, stop_token_id
from webrl_core.prompts import BOS, EOT, SPECIAL_TOKENS


def train_embedded_tokenizer(texts: Iterable[str], vocab_size: int, out_dir: str | os.PathLike,
                             whole_tokens: Iterable[str] = ()):
    """Byte-level BPE on our own corpus, saved as an HF tokenizer folder; returns the loaded tokenizer.
    ``whole_tokens`` (e.g. the sites' entity names) become single tokens, matched before BPE (longest first)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    bpe.train_from_iterator(list(texts), trainer=trainer)
    # YES / NO: single ids for the ORM decision, matched before BPE so they never split.
    bpe.add_tokens([AddedToken(t, single_word=False, normalized=False, special=False) for t in ORM_ANSWER_TOKENS])
    bpe.add_tokens([AddedToken(t, single_word=True, normalized=False, special=False) for t in whole_tokens])
    bos_id = bpe.token_to_id(BOS)
    # tok(text) adds BOS like Llama-3 does, so servers (vLLM) and our code see the same ids.
    bpe.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", pair=f"{BOS} $A $B",
                                                       special_tokens=[(BOS, bos_id)])
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token=BOS, eos_token=EOT, pad_token="<pad>",
                                  additional_special_tokens=[t for t in SPECIAL_TOKENS if t not in ("<pad>", BOS, EOT)])
    tok.model_max_length = 1 << 30
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok.save_pretrained(str(out))
    return load_tokenizer(out)


def _arch_config(arch: str, tok, cfg: EmbeddedModelConfig):
    common = dict(vocab_size=len(tok), hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
                  num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads,
                  max_position_embeddings=cfg.max_length, bos_token_id=tok.bos_token_id,
                  eos_token_id=stop_token_id(tok), pad_token_id=tok.pad_token_id,
                  tie_word_embeddings=cfg.tie_embeddings)
    if cfg.hidden_size % cfg.num_heads:
        raise ValueError(f"models.embedded.hidden_size={cfg.hidden_size} is not divisible by num_heads={cfg.num_heads}")
    if arch == "llama":
        from transformers import LlamaConfig
        return LlamaConfig(num_key_value_heads=cfg.num_heads, **common)
    if arch == "qwen2":
        from transformers import Qwen2Config
        return Qwen2Config(num_key_value_heads=cfg.num_heads, **common)
    if arch == "gpt_neox":
        from transformers import GPTNeoXConfig
        return GPTNeoXConfig(**common)
    raise ValueError(f"models.embedded.arch={arch!r}; allowed: 'llama', 'qwen2', 'gpt_neox'")


def build_embedded_model(tokenizer_dir: str | os.PathLike, cfg: EmbeddedModelConfig, out_dir: str | os.PathLike,
                         seed: int = 0) -> Path:
    """A randomly initialised small causal LM (``cfg.arch``) + the tokenizer, saved as an HF folder."""
    from transformers import AutoModelForCausalLM, GenerationConfig

    tok = load_tokenizer(tokenizer_dir)
    mcfg = _arch_config(cfg.arch, tok, cfg)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(mcfg, dtype=torch.float32)
    model.generation_config = GenerationConfig(bos_token_id=tok.bos_token_id, eos_token_id=stop_token_id(tok),
                                               pad_token_id=tok.pad_token_id)
    return save_model(model, tok, out_dir)

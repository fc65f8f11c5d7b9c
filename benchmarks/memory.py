"""`webrl bench memory`: GPU memory of the WebRL models (actor, critic, reference) under each precision / LoRA /
checkpointing setting, computed from a transformers config -- not measured on a GPU, not guessed.

Parameters are COUNTED on a ``torch.device("meta")`` instance of the config (no memory, no download): the causal
LM, its LM head, the critic's backbone (the decoder without the head) plus the two value heads of
``webrl_core.learn.critic.value_head``, and the LoRA parameters of peft's ``all-linear`` target (every ``nn.Linear`` of
the decoder, not the output layer): r * (in + out) each. Bytes per parameter::

    full fine-tune, float32          4 weights + 4 grads + 8 AdamW (exp_avg, exp_avg_sq)            = 16
    mixed precision (ours)           4 float32 master + 4 float32 grads + 8 AdamW
                                     + 2 for the bf16 weight copies autocast caches until the forward
                                     ends (upper bound: grads are alive then only under gradient
                                     accumulation; the step itself needs 16)                      = 18
    pure bf16 AdamW (the old path)   2 + 2 + 4: fits, but lr 1e-6 does not move bf16 weights         =  8
    LoRA on a bf16 base              2 per frozen base parameter + 18 per adapter parameter
    frozen model (reference, critic precompute, serving)                                       2 (bf16)

Activations (:func:`activation_bytes`), batch x sequence tokens: an itemised count of what autograd saves in one
Llama-style decoder layer under bf16 autocast with SDPA attention (h hidden, k = kv heads * head dim, I = MLP width;
bytes per token)::

    float32, no autocast: 32h + 8k + 16I (fitted to torch's saved tensors, like the two counts below)
    full fine-tune, float32 master weights (the residual stream is float32):
        2 RMSNorms 2 * (4h + 4h)  float32 input + normalised output, kept for the norm weight's gradient
        q/k/v/gate/up inputs 5 * 2h   autocast casts the input of each Linear separately
        attention  2h + 2k + 2k + 2h  q, k, v (GQA: not repeated), output (= o_proj's input); no T x T matrix
        MLP        4 * 2I             gate, up, silu(gate), product (= down_proj's input)
        = 30h + 4k + 8I
    LoRA on a frozen bf16 base (the residual stream is bf16; frozen Linears keep no input):
        RMSNorms 2 * 4h, attention 4h + 4k, MLP 3 * 2I (gate, silu(gate), up)      = 12h + 4k + 6I
        + adapters: each adapter's own bf16 copy of its input (peft casts it to the float32 adapter dtype,
          autocast back to bf16), q/k/v/o/gate/up 6 * 2h, down 2I, and the rank-r outputs 7 * 2r
                                                                                     = 12h + 2I + 14r
        + LoRA dropout > 0: each adapter's dropout mask, m bytes per input element (m = 1: CUDA's bool mask;
          4 on CPU)                                                                  = m (6h + I)

    no checkpointing:   L * layer
    checkpointing:      L * r h (each layer's input; r = 4 / 2 bytes above) + layer (the one being recomputed)
    + the LM head: a full-sequence loss (SFT, ORM) keeps T x V logits in bf16, their float32 upcast and the
      float32 log-softmax (10 bytes per logit; 12 in float32); the WebRL actor runs its head on the action tokens
      only (``logits_to_keep``) and the critic has none.

The per-token layer count is checked against torch's own saved tensors on a tiny Llama
(``tests/learn/test_mixed_precision.py``). Not counted: the CUDA context (~0.5 GiB), allocator fragmentation,
kernel workspaces, and the optimizer's temporary buffers -- keep 10-15% headroom.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

import torch

GiB = 1 << 30

LLAMA3_8B = dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                 num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192,
                 tie_word_embeddings=False, rope_theta=500000.0)
"""Llama-3-8B / Llama-3.1-8B (the paper's 8B actor): 8,030,261,248 parameters."""


def llama3_8b_config():
    from transformers import LlamaConfig

    return LlamaConfig(**LLAMA3_8B)


@dataclass
class ParamCounts:
    causal_lm: int          # the actor / reference / ORM
    lm_head: int            # 0 when tied to the input embedding
    backbone: int           # the critic's decoder (AutoModel: no LM head)
    critic_heads: int       # two value heads (h*h, h*h, h*2 Linears)
    lora: int               # LoRA parameters of the decoder, all-linear, rank r
    lora_r: int
    hidden_size: int
    layers: int
    kv_dim: int
    intermediate_size: int
    vocab_size: int


def count_params(config, lora_r: int = 16) -> ParamCounts:
    """Parameter counts of a causal-LM config, from a meta-device instance (no memory allocated)."""
    from transformers import AutoModelForCausalLM

    from webrl_core.learn.critic import value_head, hidden_size_of
    from webrl_core.learn.model_folder import kv_width

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
        h = hidden_size_of(config)
        heads = 2 * sum(p.numel() for p in value_head(h, None).parameters())
    unique = {id(p): p for p in model.parameters()}
    total = sum(p.numel() for p in unique.values())
    head = model.get_output_embeddings()
    tied = head is not None and head.weight is model.get_input_embeddings().weight
    lm_head = 0 if head is None or tied else head.weight.numel() + (head.bias.numel() if head.bias is not None else 0)
    lora = sum(lora_r * (m.in_features + m.out_features) for m in model.get_decoder().modules()
               if isinstance(m, torch.nn.Linear))
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return ParamCounts(causal_lm=total, lm_head=lm_head, backbone=total - lm_head, critic_heads=heads, lora=lora,
                       lora_r=lora_r, hidden_size=h, layers=text.num_hidden_layers, kv_dim=kv_width(text.to_dict()),
                       intermediate_size=text.intermediate_size, vocab_size=text.vocab_size)


# bytes per parameter (module docstring)
FULL_FP32 = 16
MIXED = 18
PURE_BF16 = 8
FROZEN_BF16 = 2


SETTINGS = ("fp32", "mixed", "lora")


def layer_bytes_per_token(c: ParamCounts, setting: str = "mixed", lora_dropout: float = 0.0,
                          mask_bytes: int = 1) -> int:
    """What autograd keeps for one decoder layer, per token (module docstring). ``setting``: "fp32" (float32,
    no autocast), "mixed" (float32 master weights, bf16 autocast) or "lora" (frozen bf16 base, float32 adapters,
    bf16 autocast). ``mask_bytes``: bytes per element of a dropout mask (1 on CUDA, 4 on CPU)."""
    h, k, inter = c.hidden_size, c.kv_dim, c.intermediate_size
    if setting == "fp32":
        return 32 * h + 8 * k + 16 * inter
    if setting == "mixed":
        return 30 * h + 4 * k + 8 * inter
    if setting != "lora":
        raise ValueError(f"setting={setting!r}; allowed: {SETTINGS}")
    base = 12 * h + 4 * k + 6 * inter
    adapters = 12 * h + 2 * inter + 14 * c.lora_r
    masks = mask_bytes * (6 * h + inter) if lora_dropout > 0 else 0
    return base + adapters + masks


def activation_bytes(c: ParamCounts, tokens: int, checkpointing: bool, setting: str = "mixed",
                     lora_dropout: float = 0.0, full_logits: bool = False) -> int:
    """Activation memory of one forward/backward over ``tokens`` (batch x sequence) tokens."""
    per_layer = layer_bytes_per_token(c, setting, lora_dropout) * tokens
    residual = 2 if setting == "lora" else 4
    body = c.layers * residual * c.hidden_size * tokens + per_layer if checkpointing else c.layers * per_layer
    logits = tokens * c.vocab_size * (4 + 4 + (4 if setting == "fp32" else 2)) if full_logits else 0
    return body + logits


def memory_table(config=None, seq: int = 16384, batch: int = 1, lora_r: int = 16, gpus: int = 8,
                 lora_dropout: float = 0.05) -> dict:
    """Bytes of model states (weights, grads, AdamW) and activations of each WebRL model and setting."""
    c = count_params(config or llama3_8b_config(), lora_r)
    tokens = seq * batch
    actor, critic = c.causal_lm, c.backbone + c.critic_heads

    def states(kind: str, n: int, trainable_extra: int = 0, lora: int = 0) -> int:
        if kind == "full_fp32":
            return FULL_FP32 * n
        if kind == "mixed":
            return MIXED * n
        if kind == "pure_bf16":
            return PURE_BF16 * n
        if kind == "lora":
            return FROZEN_BF16 * (n - trainable_extra) + MIXED * (lora + trainable_extra)
        return FROZEN_BF16 * n  # frozen

    rows = []

    def add(model: str, setting: str, state: int, trainable: int, kind: str | None, full_logits: bool = False):
        row = {"model": model, "setting": setting, "trainable_params": trainable, "states_bytes": state}
        if kind is not None:  # trained: activations with and without gradient checkpointing
            kw = dict(setting=kind, lora_dropout=lora_dropout, full_logits=full_logits)
            row["activations_gc_bytes"] = activation_bytes(c, tokens, True, **kw)
            row["activations_no_gc_bytes"] = activation_bytes(c, tokens, False, **kw)
        rows.append(row)

    lora_name = f"LoRA r={lora_r} all-linear (dropout {lora_dropout:g}), bf16 base"
    add("actor", "full fine-tune, float32 + AdamW", states("full_fp32", actor), actor, "fp32")
    add("actor", "mixed bf16: fp32 master + AdamW", states("mixed", actor), actor, "mixed")
    add("actor", "pure bf16 AdamW (old; does not train at 1e-6)", states("pure_bf16", actor), actor, None)
    add("actor", lora_name, states("lora", actor, lora=c.lora), c.lora, "lora")
    add("reference", "frozen bf16 (ours: not held, precomputed)", states("frozen", actor), 0, None)
    add("critic", "mixed bf16: fp32 master + AdamW", states("mixed", critic), critic, "mixed")
    add("critic", lora_name + " + heads", states("lora", critic, c.critic_heads, c.lora), c.lora + c.critic_heads,
        "lora")
    add("critic", "frozen bf16 (advantage precompute)", states("frozen", critic), 0, None)
    add("SFT / ORM", lora_name + ", full-sequence loss", states("lora", actor, lora=c.lora), c.lora, "lora",
        full_logits=True)
    return {"params": asdict(c), "seq": seq, "batch": batch, "gpus": gpus, "lora_dropout": lora_dropout,
            "rows": rows}


def _gib(n: int | None) -> str:
    return "-" if n is None else f"{n / GiB:,.1f}"


COLUMNS = ("model", "setting", "trainable", "states", "act. GC", "act. no GC", "total GC", "total GC / GPU")


def table_rows(table: dict) -> list[list[str]]:
    """The printed cells: GiB; totals = states + activations with gradient checkpointing; per GPU = states
    sharded over ``gpus`` (FSDP / ZeRO-3) + the activations of one rank's micro-batch."""
    out = []
    for r in table["rows"]:
        act = r.get("activations_gc_bytes")
        out.append([r["model"], r["setting"], f"{r['trainable_params'] / 1e6:,.1f}M", _gib(r["states_bytes"]),
                    _gib(act), _gib(r.get("activations_no_gc_bytes")), _gib(r["states_bytes"] + (act or 0)),
                    _gib(r["states_bytes"] // table["gpus"] + (act or 0))])
    return out


def header(table: dict) -> list[str]:
    p = table["params"]
    return [f"parameters: causal LM {p['causal_lm']:,} (LM head {p['lm_head']:,}); critic backbone {p['backbone']:,} + "
            f"value heads {p['critic_heads']:,}; LoRA r={p['lora_r']} all-linear {p['lora']:,}",
            f"GiB; activations for {table['seq']:,} tokens x batch {table['batch']} under bf16 autocast "
            f"(GC = gradient checkpointing); last column: states sharded over {table['gpus']} GPUs (FSDP / ZeRO-3)",
            "80 GB GPU = 74.5 GiB (an H100 80GB reports 79.6 GiB). Our stages hold ONE model at a time: the critic's "
            "values are precomputed and the critic freed before the actor loads, and the reference log-probs come "
            "from the actor itself before its first update (no reference model in memory)."]


def markdown(table: dict) -> str:
    lines = [header(table)[0] + "  ", header(table)[1], "",
             "| " + " | ".join(COLUMNS) + " |", "|" + "|".join(["---"] * 2 + ["---:"] * (len(COLUMNS) - 2)) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in table_rows(table)]
    return "\n".join(lines + ["", header(table)[2]])


def print_table(table: dict, console=None) -> None:
    from rich.console import Console
    from rich.table import Table

    if console is None:
        console = Console()
        if not console.is_terminal:  # piped or redirected: rich would cut the table at 80 columns
            console = Console(width=1000)
    head = header(table)
    console.print(head[0])
    t = Table(title=head[1])
    for col in COLUMNS:
        t.add_column(col, justify="left" if col in ("model", "setting") else "right")
    for row in table_rows(table):
        t.add_row(*row)
    console.print(t)
    console.print(head[2])


def run(model: str | None = None, seq: int = 16384, batch: int = 1, lora_r: int = 16, gpus: int = 8,
        lora_dropout: float = 0.05, fmt: str = "table", out: str | None = None) -> dict:
    """Print the table for ``model`` (an HF folder or config.json; default: Llama-3-8B's config); ``fmt``:
    "table" (rich) or "markdown"; ``out``: also write the numbers as JSON."""
    config = None
    if model:
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(model)
    table = memory_table(config, seq, batch, lora_r, gpus, lora_dropout)
    if fmt == "markdown":
        print(markdown(table))
    else:
        print_table(table)
    if out:
        with open(out, "w", encoding="utf-8") as f:
            json.dump(table, f, indent=2)
    return table

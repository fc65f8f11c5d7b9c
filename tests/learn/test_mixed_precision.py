"""Mixed precision that trains: models.dtype bfloat16 keeps float32 master weights (compute under bf16 autocast),
so lr 1e-6 moves the weights; the old pure-bf16 AdamW path (weights and updates in bf16) rounds nearly every
update away. Plus LoRA in bf16 (frozen bf16 base, float32 adapters), the reference log-probs in the training
autocast, the fp16-on-CPU error and the launcher's --mixed_precision."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from webrl_core.learn import critic_trainer, models, sft_trainer, trainer_utils, webrl_trainer
from webrl_core.scale import launch
from webrl_core.config import EmbeddedModelConfig, ModelsConfig, TrainingConfig
from webrl_core.config_loader import load_config
from webrl_core.learn.critic import Critic
from webrl_core.learn.models import load_causal_lm, load_tokenizer, save_model, trainer_precision_args
from webrl_core.learn.embedded_model import build_embedded_model, train_embedded_tokenizer
from webrl_core.prompts import build_prompt
from webrl_core.learn.transitions import build_transitions

INPROCESS = TrainingConfig(launcher="inprocess")
STEPS = 5


def _pairs(n=8):
    return [(build_prompt(f"open item {i}", [], f"<button id={i}>Open {i}</button>"),
             f'do(action="Click", element="{i}")') for i in range(n)]


@pytest.fixture(scope="module")
def bf16_llama(tmp_path_factory):
    """A tiny real-architecture Llama whose weights are exact bf16 values (as a released bf16 checkpoint is)."""
    root = tmp_path_factory.mktemp("mp")
    train_embedded_tokenizer([p + a for p, a in _pairs(40)], 400, root / "tok")
    cfg = EmbeddedModelConfig(vocab_size=400, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=2,
                              max_length=512, arch="llama")
    f32 = build_embedded_model(root / "tok", cfg, root / "f32", seed=0)
    return save_model(load_causal_lm(f32, ModelsConfig(dtype="bfloat16")), load_tokenizer(f32), root / "bf16")


def _settings(*extra):
    return load_config(sets=["models.device=cpu", "models.dtype=bfloat16", "models.max_length=256",
                             "actor.batch_size=2", "bootstrap.sft_lr=1e-6", *extra])


def _weights(folder, name="model.safetensors"):
    return load_file(str(folder / name))


def _changed(after: dict, start: dict) -> tuple[int, int]:
    return (sum(int((after[k].float() != start[k].float()).sum()) for k in start),
            sum(v.numel() for v in start.values()))


def _record_compute_dtype(monkeypatch, seen: set):
    """Wrap load_causal_lm where the SFT and actor trainers call it: record the output dtype of one Linear during
    training."""
    original = models.load_causal_lm

    def loader(*a, **kw):
        model = original(*a, **kw)
        linear = next(m for n, m in models.unwrap(model).named_modules() if n.endswith("layers.0.mlp.down_proj"))
        linear.register_forward_hook(lambda mod, inp, out: seen.add(out.dtype))
        return model

    monkeypatch.setattr(sft_trainer, "load_causal_lm", loader)
    monkeypatch.setattr(webrl_trainer, "load_causal_lm", loader)


def test_bf16_mixed_precision_moves_weights_at_lr_1e6_where_pure_bf16_does_not(bf16_llama, tmp_path, monkeypatch):
    """The bootstrap SFT trainer (launch.sft_train, in-process), models.dtype=bfloat16, lr 1e-6, 5 steps.
    Measured: mixed 110,775 of 133,696 entries changed (82.9%; the rest are embedding rows of tokens not in the
    data, which get no gradient); pure bf16 1,830 (1.4%: only entries so close to 0 that a bf16 spacing is below
    1e-6; a weight of 0.02 has a spacing of 1.2e-4)."""
    pairs, settings = _pairs(), _settings()
    start = _weights(bf16_llama)
    seen: set = set()
    with monkeypatch.context() as m:
        _record_compute_dtype(m, seen)
        stats = launch.sft_train(pairs, bf16_llama, tmp_path / "mixed", settings, max_steps=STEPS, training=INPROCESS)
    assert stats["steps"] == STEPS and stats["trainable_params"] == stats["total_params"]
    assert seen == {torch.bfloat16}  # the compute ran under bf16 autocast
    mixed = _weights(tmp_path / "mixed")
    assert {v.dtype for v in mixed.values()} == {torch.float32}  # the float32 master weights are what is saved
    n_mixed, total = _changed(mixed, start)

    # the old path: weights loaded in bf16, trained by AdamW in bf16, no autocast (what load_causal_lm did before)
    seen.clear()
    with monkeypatch.context() as m:
        m.setattr(models, "training_dtype", lambda cfg: models.torch_dtype(cfg.dtype))
        m.setattr(models, "upcast_trainable", lambda model: model)
        m.setattr(trainer_utils, "trainer_precision_args", lambda *a, **kw: {"bf16": False, "fp16": False})
        _record_compute_dtype(m, seen)
        launch.sft_train(pairs, bf16_llama, tmp_path / "pure", settings, max_steps=STEPS, training=INPROCESS)
    assert seen == {torch.bfloat16}
    pure = _weights(tmp_path / "pure")
    assert {v.dtype for v in pure.values()} == {torch.bfloat16}
    n_pure, _ = _changed(pure, start)
    print(f"lr 1e-6, {STEPS} steps: mixed changed {n_mixed}/{total}, pure bf16 {n_pure}/{total}")
    assert n_mixed > 0.6 * total
    assert n_pure < 0.05 * total and n_mixed > 20 * n_pure
    # what pure bf16 did change are only entries near 0 (their bf16 spacing is below the step size)
    small = sum(int(((pure[k].float() != start[k].float()) & (start[k].float().abs() > 1e-3)).sum()) for k in start)
    assert small == 0


def test_bf16_lora_trains_float32_adapters_on_a_bf16_base(bf16_llama, tmp_path, monkeypatch):
    settings = _settings("models.lora.enabled=true", "models.lora.r=4", "models.lora.alpha=8")
    model = load_causal_lm(bf16_llama, settings.models, trainable=True)
    dtypes = {n: p.dtype for n, p in model.named_parameters()}
    assert all(d == torch.float32 for n, d in dtypes.items() if "lora_" in n)
    assert all(d == torch.bfloat16 for n, d in dtypes.items() if "lora_" not in n)  # the frozen base: 2 B/param
    seen: set = set()
    with monkeypatch.context() as m:
        _record_compute_dtype(m, seen)
        stats = launch.sft_train(_pairs(), bf16_llama, tmp_path / "lora", settings, max_steps=STEPS,
                                 training=INPROCESS)
    assert seen == {torch.bfloat16}
    assert 0 < stats["trainable_params"] < stats["total_params"] / 5
    adapter = _weights(tmp_path / "lora" / "adapter", "adapter_model.safetensors")
    lora_b = {k: v for k, v in adapter.items() if "lora_B" in k}
    assert {v.dtype for v in adapter.values()} == {torch.float32}
    moved = sum(int((v != 0).sum()) for v in lora_b.values())
    assert moved > 0.6 * sum(v.numel() for v in lora_b.values())  # lora_B starts at 0: lr 1e-6 moved it
    merged = _weights(tmp_path / "lora")
    assert {v.dtype for v in merged.values()} == {torch.bfloat16}  # merged into the bf16 base


def test_actor_reference_logprobs_use_the_training_autocast(bf16_llama, tmp_path, monkeypatch):
    """bf16 mixed actor: the reference log-probs are computed by the freshly loaded actor in the same autocast as
    the training forward, so the first micro-batch sees log_ratio = 0 exactly (without the autocast it would be the
    fp32-vs-bf16 difference of the two passes)."""
    samples = build_transitions([({"episode_id": f"e{e}", "success": True, "intent": f"open item {e}"},
                                  [{"idx": 0, "prompt": build_prompt(f"open item {e}", [], f"<p>{e}</p>"),
                                    "response": f'do(action="Click", element="{e}")'}]) for e in range(4)])
    Critic.from_backbone(bf16_llama, 0.05, 256, device="cpu").save(tmp_path / "critic")
    ratios = []
    original = webrl_trainer.webrl_actor_loss

    def loss(*a, **kw):
        value, stats = original(*a, **kw)
        ratios.append(stats["log_ratio"])
        return value, stats

    monkeypatch.setattr(webrl_trainer, "webrl_actor_loss", loss)
    settings = _settings("actor.lr=1e-6", "actor.micro_batch_size=1")
    stats = launch.train_actor(samples, bf16_llama, tmp_path / "actor", settings, critic_dir=tmp_path / "critic",
                               max_steps=1, progress=False, training=INPROCESS)
    assert stats["steps"] == 1 and stats["trainable_params"] == stats["total_params"]
    assert ratios and ratios[0] == 0.0
    saved = _weights(tmp_path / "actor")
    assert {v.dtype for v in saved.values()} == {torch.float32}


def test_precision_flags_and_fp16_on_cpu():
    assert trainer_precision_args(ModelsConfig(dtype="float32", device="cpu")) == {"bf16": False, "fp16": False}
    assert trainer_precision_args(ModelsConfig(dtype="bfloat16", device="cpu")) == {"bf16": True, "fp16": False}
    assert trainer_precision_args(ModelsConfig(dtype="float16"), "cuda") == {"bf16": False, "fp16": True}
    with pytest.raises(ValueError, match="fp16 mixed precision .* needs a GPU"):
        trainer_precision_args(ModelsConfig(dtype="float16", device="cpu"))
    with pytest.raises(ValueError, match="needs a GPU"):  # before any model is loaded
        sft_trainer.sft_train(_pairs(1), "/nonexistent", "/tmp/x", load_config(sets=["models.device=cpu",
                                                                                    "models.dtype=float16"]))
    assert models.training_dtype(ModelsConfig(dtype="bfloat16")) == torch.float32
    assert models.training_dtype(ModelsConfig(dtype="bfloat16", lora={"enabled": True})) == torch.bfloat16


def test_launch_passes_mixed_precision_from_models_dtype(tmp_path):
    tc = TrainingConfig(launcher="accelerate", accelerate_config="fsdp", num_processes=2)
    for dtype, mode in (("float32", "no"), ("bfloat16", "bf16"), ("float16", "fp16")):
        settings = load_config(sets=[f"models.dtype={dtype}"]).model_dump(mode="json")
        cmd = launch.launch_command(tc, tmp_path / "job.json", mixed_precision=launch.mixed_precision_of(settings))
        assert cmd[cmd.index("--mixed_precision") + 1] == mode
        assert mode == models.mixed_precision_mode(ModelsConfig(dtype=dtype))
    own = TrainingConfig(launcher="accelerate", extra_args=["--mixed_precision", "no"])
    cmd = launch.launch_command(own, tmp_path / "job.json", mixed_precision="bf16")
    assert cmd.count("--mixed_precision") == 1 and cmd[cmd.index("--mixed_precision") + 1] == "no"
    assert "--mixed_precision" not in launch.launch_command(tc, tmp_path / "job.json")


# ---------------------------------------------------------------------------------------------
# the memory table's counts (benchmarks.memory)

def _saved_bytes_per_layer_token(setting: str, lora_dropout: float = 0.0) -> float:
    """What autograd keeps per decoder layer and token, from torch's saved tensors (bf16 autocast on CPU): the
    difference between 2 and 1 layers and between 256 and 128 tokens, so embedding, weight casts and RoPE
    tables cancel out."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    from webrl_core.config import LoraConfig

    total = {}
    for layers in (1, 2):
        for tokens in (128, 256):
            cfg = LlamaConfig(vocab_size=512, hidden_size=256, intermediate_size=896, num_hidden_layers=layers,
                              num_attention_heads=8, num_key_value_heads=2, tie_word_embeddings=False)
            torch.manual_seed(0)
            model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16 if setting == "lora"
                                                     else torch.float32).train()
            if setting == "lora":
                model = models.apply_lora(model, LoraConfig(r=16, dropout=lora_dropout))
            params = {p.untyped_storage().data_ptr() for p in model.parameters()}
            saved = {}

            def pack(t):
                st = t.untyped_storage()
                if st.data_ptr() not in params:
                    saved[st.data_ptr()] = st.nbytes()
                return t

            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=setting != "fp32"):
                    models.unwrap(model).model(input_ids=torch.randint(0, 500, (1, tokens)), use_cache=False)
            total[layers, tokens] = sum(saved.values())
    return ((total[2, 256] - total[1, 256]) - (total[2, 128] - total[1, 128])) / 128


@pytest.mark.parametrize("setting,dropout", [("fp32", 0.0), ("mixed", 0.0), ("lora", 0.0), ("lora", 0.05)])
def test_activation_formula_matches_torch_saved_tensors(setting, dropout):
    from transformers import LlamaConfig

    from benchmarks.memory import count_params, layer_bytes_per_token

    c = count_params(LlamaConfig(vocab_size=512, hidden_size=256, intermediate_size=896, num_hidden_layers=1,
                                 num_attention_heads=8, num_key_value_heads=2, tie_word_embeddings=False), 16)
    formula = layer_bytes_per_token(c, setting, dropout, mask_bytes=4)  # CPU dropout masks are float32
    measured = _saved_bytes_per_layer_token(setting, dropout)
    assert formula == pytest.approx(measured, rel=0.01), (formula, measured)


def test_parameter_counts_of_the_8b_models():
    from transformers import AutoModelForCausalLM, LlamaConfig

    from benchmarks.memory import count_params, llama3_8b_config, memory_table
    from webrl_core.config import LoraConfig

    c = count_params(llama3_8b_config(), lora_r=16)
    assert c.causal_lm == 8_030_261_248 and c.lm_head == 128256 * 4096  # Llama-3-8B
    assert c.backbone == c.causal_lm - c.lm_head and c.critic_heads == 2 * (2 * (4096 * 4096 + 4096) + 2 * 4096 + 2)
    assert c.lora == 32 * 16 * (2 * (4096 + 4096) + 2 * (4096 + 1024) + 3 * (4096 + 14336))
    # the LoRA count is what peft builds (tiny config, same code path)
    tiny = LlamaConfig(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)
    peft_model = models.apply_lora(AutoModelForCausalLM.from_config(tiny), LoraConfig(r=4))
    assert count_params(tiny, 4).lora == models.count_parameters(peft_model)["trainable_params"]
    rows = {(r["model"], r["setting"].split(" ")[0]): r for r in memory_table(seq=16384)["rows"]}
    assert rows["actor", "mixed"]["states_bytes"] == 18 * c.causal_lm
    assert rows["actor", "LoRA"]["states_bytes"] == 2 * c.causal_lm + 18 * c.lora
    assert rows["critic", "LoRA"]["states_bytes"] == 2 * c.backbone + 18 * (c.lora + c.critic_heads)


def test_frozen_layers_live_in_the_compute_dtype_and_the_trained_ones_in_float32(bf16_llama, tmp_path):
    """models.train_layers with models.dtype bfloat16: the frozen lower layer, the embeddings and the LM head are
    stored in bf16 (autocast would cast them from float32 in every micro-batch otherwise), the trained top layer and
    the final norm keep float32 masters, for the actor and the critic alike; the SFT still moves the trained
    weights at lr 1e-6 and saves them in float32."""
    settings = _settings("models.train_layers=1")
    model = load_causal_lm(bf16_llama, settings.models, trainable=True)
    for name, p in model.named_parameters():
        assert p.dtype == (torch.float32 if p.requires_grad else torch.bfloat16), name
    assert any(p.requires_grad for p in model.parameters()) and not all(p.requires_grad for p in model.parameters())
    critic = Critic.from_backbone(bf16_llama, dtype=models.training_dtype(settings.models), device="cpu")
    critic.for_training(settings.models)
    for name, p in critic.named_parameters():
        assert p.dtype == (torch.float32 if p.requires_grad else torch.bfloat16), name
    assert any(p.requires_grad for p in critic.backbone.parameters())
    start = _weights(bf16_llama)
    stats = launch.sft_train(_pairs(), bf16_llama, tmp_path / "top", settings, max_steps=STEPS, training=INPROCESS)
    assert 0 < stats["trainable_params"] < stats["total_params"]
    after = _weights(tmp_path / "top")
    top = [k for k in after if ".layers.1." in k and k.endswith("proj.weight")]
    assert top and all(after[k].dtype == torch.float32 for k in top)
    assert all(after[k].dtype == torch.bfloat16 for k in after if ".layers.0." in k)
    assert all(torch.equal(after[k].float(), start[k].float()) for k in after if ".layers.0." in k)  # frozen
    assert sum(int((after[k].float() != start[k].float()).sum()) for k in top) > 0  # trained at lr 1e-6


def test_calibrated_stages_measure_under_the_training_autocast(bf16_llama, tmp_path, monkeypatch):
    """On a bf16 box the micro-batch is measured before ``train()`` starts the Trainer's autocast: the timed passes
    must run under it, or a bf16 frozen layer meets a float32 trained one (the actor stage failed there with
    "expected m1 and m2 to have the same dtype") and the rates measured are float32 ones."""
    from webrl_core.learn import box_measurements, micro_batch

    monkeypatch.setenv(box_measurements.CALIBRATE_ENV, "1")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(micro_batch, "PAYS", 0)  # stages this small would not pay for measuring
    seen: set = set()
    _record_compute_dtype(monkeypatch, seen)
    samples = build_transitions([({"episode_id": f"e{e}", "success": e % 2 == 0, "intent": f"open item {e}"},
                                  [{"idx": 0, "prompt": build_prompt(f"open item {e}", [], f"<p>{e}</p>"),
                                    "response": f'do(action="Click", element="{e}")'}]) for e in range(8)])
    settings = _settings("models.train_layers=1", "actor.lr=1e-6", "actor.loss=paper", "critic.batch_size=2")
    critic = critic_trainer.train_critic(samples, bf16_llama, tmp_path / "critic", settings)
    stats = webrl_trainer.train_actor(samples, bf16_llama, tmp_path / "actor", settings,
                                      critic_dir=tmp_path / "critic", progress=False)
    assert critic["steps"] > 0 and stats["steps"] > 0
    assert critic["calibrate_s"] > 0 and stats["calibrate_s"] > 0  # measured, and left out of train_s
    assert seen == {torch.bfloat16}
    kept = {e["stage"] for e in json.loads(micro_batch.cache_file().read_text()).values()}
    assert {"critic", "actor"} <= kept


class _WeightCasts(torch.utils._python_dispatch.TorchDispatchMode):
    """Counts float32 -> bf16 casts of 2-D parameters (the linear layers' weights)."""

    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if (func is torch.ops.aten._to_copy.default and args[0].dtype == torch.float32 and args[0].dim() == 2
                and kwargs.get("dtype") == torch.bfloat16 and isinstance(args[0], torch.nn.Parameter)):
            self.n += 1
        return func(*args, **kwargs)


def test_weights_cast_once_per_optimizer_step_train_the_same_weights(bf16_llama, tmp_path):
    """models.weight_casts: per_step reuses autocast's bf16 copy of each trained weight across the 4 micro-batches
    of a step (a quarter of the casts) and trains bit for bit the same weights as a copy per micro-batch."""
    casts, weights = {}, {}
    for mode in ("per_micro_batch", "per_step"):
        settings = _settings("actor.batch_size=4", "actor.micro_batch_size=1", "bootstrap.sft_lr=1e-4",
                             f"models.weight_casts={mode}")
        with _WeightCasts() as counter:
            launch.sft_train(_pairs(), bf16_llama, tmp_path / mode, settings, max_steps=3, training=INPROCESS)
        casts[mode], weights[mode] = counter.n, _weights(tmp_path / mode)
    assert casts["per_step"] > 0 and casts["per_micro_batch"] == 4 * casts["per_step"]
    assert weights["per_step"].keys() == weights["per_micro_batch"].keys()
    for k, v in weights["per_step"].items():
        assert torch.equal(v, weights["per_micro_batch"][k]), k
    start = _weights(bf16_llama)
    assert _changed(weights["per_step"], start)[0] > 0  # it trained

"""Embedded tokenizer/model build, save/load round trips, LoRA merge, and the prompt/action token alignment."""

from __future__ import annotations

import threading

import pytest
import torch
from transformers import AutoModelForCausalLM

from webrl_core.config import EmbeddedModelConfig, LoraConfig, ModelsConfig
from webrl_core.learn.models import (apply_lora, backbone_and_hidden_size, count_parameters, encode_prompt_action,
                                     load_causal_lm, load_tokenizer, save_model, stop_token_id)
from webrl_core.learn.embedded_model import build_embedded_model, train_embedded_tokenizer
from webrl_core.prompts import ASSISTANT_HEADER, BOS, EOT, SPECIAL_TOKENS, build_prompt

ACTION = '# Element: the search box\ndo(action="Type", argument="blue shirt", element="12")'


def corpus() -> list[str]:
    html = "".join(f'<div id="{i}"><a id="{i}">item {i} price ${i}.99</a><button id="{i}">Add</button></div>'
                   for i in range(40))
    return [build_prompt(f"Find the price of item {k}", [ACTION] * (k % 3), html) + ACTION for k in range(8)]


def tiny(arch: str) -> EmbeddedModelConfig:
    return EmbeddedModelConfig(vocab_size=400, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=2,
                               max_length=512, arch=arch)


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("tok")
    train_embedded_tokenizer(corpus(), 400, out)
    return out


def test_tokenizer_specials_and_answers(tok_dir):
    tok = load_tokenizer(tok_dir)
    for t in SPECIAL_TOKENS:  # every special token is one atomic id
        assert len(tok.encode(t, add_special_tokens=False)) == 1, t
    assert tok.pad_token == "<pad>" and tok.bos_token == BOS and tok.eos_token == EOT
    assert stop_token_id(tok) == tok.convert_tokens_to_ids(EOT)
    for word in ("YES", "NO"):
        assert len(tok.encode(word, add_special_tokens=False)) == 1
    assert tok("hello").input_ids[0] == tok.bos_token_id  # BOS added like Llama-3 (what vLLM will see)
    text = corpus()[0]
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text  # byte-level: lossless


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gpt_neox"])
def test_build_save_load_roundtrip(tok_dir, tmp_path, arch):
    out = build_embedded_model(tok_dir, tiny(arch), tmp_path / arch, seed=3)
    assert (out / "model.safetensors").exists() and (out / "tokenizer.json").exists()
    plain = AutoModelForCausalLM.from_pretrained(str(out))  # an ordinary HF folder
    assert plain.config.model_type == arch
    model = load_causal_lm(out, ModelsConfig(device="cpu"))
    assert not model.training and not any(p.requires_grad for p in model.parameters())
    backbone, hidden = backbone_and_hidden_size(model)
    assert hidden == 32 and backbone is not model
    ids = torch.tensor([[1, 5, 6, 7]])
    assert torch.equal(plain(ids).logits, model(ids).logits)
    # same seed -> same weights; another seed -> different
    again = load_causal_lm(build_embedded_model(tok_dir, tiny(arch), tmp_path / "again", seed=3), ModelsConfig())
    other = load_causal_lm(build_embedded_model(tok_dir, tiny(arch), tmp_path / "other", seed=4), ModelsConfig())
    assert torch.equal(again(ids).logits, model(ids).logits)
    assert not torch.equal(other(ids).logits, model(ids).logits)


def test_dtype_and_trainable(tok_dir, tmp_path):
    out = build_embedded_model(tok_dir, tiny("llama"), tmp_path / "m")
    m16 = load_causal_lm(out, ModelsConfig(dtype="bfloat16"))
    assert next(m16.parameters()).dtype == torch.bfloat16
    mt = load_causal_lm(out, ModelsConfig(gradient_checkpointing=True), trainable=True)
    assert mt.training and all(p.requires_grad for p in mt.parameters())
    assert getattr(mt, "is_activation_checkpointing", None) or mt.is_gradient_checkpointing
    # mixed precision: a model loaded for training keeps float32 master weights (compute: the Trainer's autocast)
    mb = load_causal_lm(out, ModelsConfig(dtype="bfloat16"), trainable=True)
    assert {p.dtype for p in mb.parameters()} == {torch.float32} and count_parameters(mb)["trainable_params"] > 0
    # ... and with LoRA the frozen base stays bf16 (2 bytes/param), the adapters are float32
    ml = load_causal_lm(out, ModelsConfig(dtype="bfloat16", lora=LoraConfig(enabled=True, r=4)), trainable=True)
    assert {p.dtype for p in ml.parameters() if p.requires_grad} == {torch.float32}
    assert {p.dtype for p in ml.parameters() if not p.requires_grad} == {torch.bfloat16}
    counts = count_parameters(ml)
    assert counts["trainable_params"] == sum(p.numel() for n, p in ml.named_parameters() if "lora_" in n)


def test_concurrent_bf16_loads_leave_the_default_dtype(tok_dir, tmp_path):
    """Rollout shards load their models in threads at once; transformers sets torch's process-wide default dtype
    during a load, so unserialised bf16 loads left the process at bf16 (and float32 code after them got bf16)."""
    out = build_embedded_model(tok_dir, tiny("llama"), tmp_path / "m")
    assert torch.get_default_dtype() == torch.float32
    errors = []

    def load():
        try:
            for _ in range(5):
                load_causal_lm(out, ModelsConfig(dtype="bfloat16"))
        except Exception as e:  # noqa: BLE001 -- surfaced below
            errors.append(e)

    threads = [threading.Thread(target=load) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert not errors and torch.get_default_dtype() == torch.float32
    finally:
        torch.set_default_dtype(torch.float32)  # never leak a failure's bf16 into later tests


def test_fresh_lora_adapter_on_a_merged_folder_is_the_phase_start_actor(tok_dir, tmp_path):
    """The actor's KL reference with LoRA: a phase loads the previous phase's MERGED folder and adds a fresh
    adapter (lora_B = 0), so before the first update the model is exactly that folder's model."""
    out = build_embedded_model(tok_dir, tiny("llama"), tmp_path / "base")
    cfg = ModelsConfig(lora=LoraConfig(enabled=True, r=4, alpha=8, dropout=0.0))
    phase1 = load_causal_lm(out, cfg, trainable=True)
    with torch.no_grad():
        for n, p in phase1.named_parameters():
            if "lora_B" in n:
                p.add_(0.05)
    saved = save_model(phase1, load_tokenizer(out), tmp_path / "phase1")  # merged
    start = load_causal_lm(saved, ModelsConfig())  # the phase-start actor, frozen
    phase2 = load_causal_lm(saved, cfg, trainable=True).eval()  # phase 2's trainable actor (fresh adapter)
    ids = torch.tensor([[1, 9, 10, 11, 12]])
    with torch.no_grad():
        assert torch.equal(phase2(ids).logits, start(ids).logits)
        with phase2.disable_adapter():  # the same as the adapter switched off, because phase 1 was merged
            assert torch.equal(phase2(ids).logits, start(ids).logits)


def test_lora_save_merged_loads(tok_dir, tmp_path):
    out = build_embedded_model(tok_dir, tiny("llama"), tmp_path / "base")
    cfg = ModelsConfig(lora=LoraConfig(enabled=True, r=4, alpha=8, dropout=0.0))
    model = load_causal_lm(out, cfg, trainable=True)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    with torch.no_grad():  # move the adapter away from its zero init so merging changes the weights
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.add_(0.05)
    tok = load_tokenizer(out)
    saved = save_model(model, tok, tmp_path / "saved")
    assert (saved / "adapter" / "adapter_config.json").exists() and (saved / "model.safetensors").exists()
    merged = AutoModelForCausalLM.from_pretrained(str(saved))
    assert not any("lora" in k for k in merged.state_dict())
    ids = torch.tensor([[1, 9, 10, 11, 12]])
    model.eval()
    with torch.no_grad():
        assert torch.allclose(merged(ids).logits, model(ids).logits, atol=1e-5)
        base = AutoModelForCausalLM.from_pretrained(str(out))
        assert not torch.allclose(base(ids).logits, merged(ids).logits, atol=1e-4)
    assert any("lora_" in n for n, _ in model.named_parameters())  # training model left intact
    with pytest.raises(FileNotFoundError):
        load_causal_lm(tmp_path / "missing", ModelsConfig())
    assert apply_lora(AutoModelForCausalLM.from_pretrained(str(out)), LoraConfig(r=2)).peft_config


def test_alignment_exact_and_truncation_cuts_observation(tok_dir):
    tok = load_tokenizer(tok_dir)
    html = "<p>" + " ".join(f"word{i}" for i in range(300)) + "</p>"
    prompt = build_prompt("Buy the red lamp", [ACTION], html)
    action_ids = tok.encode(ACTION, add_special_tokens=False)
    full = encode_prompt_action(tok, prompt, ACTION, 100_000)
    n_prompt = len(tok.encode(prompt, add_special_tokens=False)) + 1  # + BOS
    assert full["input_ids"][0] == tok.bos_token_id
    assert full["input_ids"][n_prompt:] == action_ids + [stop_token_id(tok)]
    assert full["action_mask"] == [0] * n_prompt + [1] * (len(action_ids) + 1)
    assert full["labels"] == [-100] * n_prompt + action_ids + [stop_token_id(tok)]
    # truncation: the action and the closing assistant header survive; the HTML loses its end
    short = encode_prompt_action(tok, prompt, ACTION, 150)
    assert len(short["input_ids"]) == 150
    assert short["input_ids"][-(len(action_ids) + 1):] == action_ids + [stop_token_id(tok)]
    n_act = sum(short["action_mask"])
    assert n_act == len(action_ids) + 1 and short["action_mask"][-n_act:] == [1] * n_act
    kept_prompt = tok.decode(short["input_ids"][:-n_act])
    assert kept_prompt.startswith(BOS + "Task Instruction: Buy the red lamp")
    assert kept_prompt.endswith("\n\n" + ASSISTANT_HEADER + "\n") and "word0" in kept_prompt
    assert "word299" not in kept_prompt
    with pytest.raises(ValueError, match="max_length"):
        encode_prompt_action(tok, prompt, ACTION, len(action_ids))


def test_whole_tokens_are_one_token_in_every_context(tmp_path):
    """Entity names (``models.embedded.entity_tokens``) are one token in the intent, in an action's argument and on
    the page alike, so typing a name from the intent is copying one id; a longer word that merely starts with one
    is not cut."""
    names = ["Maple Hotel", "Brightwell Grip Water Bottle", "001132"]
    tok = train_embedded_tokenizer(corpus(), 400, tmp_path / "tok", whole_tokens=names)
    ids = {n: tok.convert_tokens_to_ids(n) for n in names}
    assert len(set(ids.values())) == 3 and tok.unk_token_id not in ids.values()
    for text in ("Put the Brightwell Grip Water Bottle in my cart.",
                 'do(action="Search", argument="Brightwell Grip Water Bottle", element="3")',
                 '<a id="4">Brightwell Grip Water Bottle</a>'):
        assert ids["Brightwell Grip Water Bottle"] in tok(text).input_ids, text
    assert ids["001132"] in tok("Change the status of order #001132 to Canceled.").input_ids
    assert ids["Maple Hotel"] not in tok("Maple Hotels downtown").input_ids
    text = "Show me Maple Hotel on the map."
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text


def test_tied_embeddings(tok_dir, tmp_path):
    cfg = tiny("llama").model_copy(update={"tie_embeddings": True})
    model = load_causal_lm(build_embedded_model(tok_dir, cfg, tmp_path / "tied"), ModelsConfig(), trainable=True)
    assert model.get_output_embeddings().weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()
    untied = load_causal_lm(build_embedded_model(tok_dir, tiny("llama"), tmp_path / "untied"), ModelsConfig())
    assert count_parameters(model)["total_params"] < count_parameters(untied)["total_params"]


def test_smollm2_tokenizer_alignment_bos_stop_and_cut():
    """SmolLM2's tokenizer: <|eot_id|> is plain text, BOS (<|im_start|>) is not added to a text, the stop token is
    its EOS; a long prompt loses the end of its HTML, never the assistant header, and the action mask still
    covers exactly the action + stop."""
    from webrl_core.learn.models import adds_bos, encode_prompt, encode_prompt_action, eot_token_id, stop_token_id
    from webrl_core.pretrained import setup_model
    from webrl_core.prompts import build_prompt

    tok = load_tokenizer(setup_model("smollm2-135m-instruct"))
    assert eot_token_id(tok) is None and not adds_bos(tok) and stop_token_id(tok) == tok.eos_token_id == 2
    html = " ".join(f'<a id="{i}">item number {i}</a>' for i in range(400))
    prompt = build_prompt("Open item 7", [], html)
    action = 'do(action="Click", element="7")'
    full = encode_prompt_action(tok, prompt, action, 100_000)
    assert full["input_ids"][:len(full["input_ids"]) - sum(full["action_mask"])] == tok.encode(prompt)  # whole text
    cut = encode_prompt_action(tok, prompt, action, 300)
    assert len(cut["input_ids"]) == 300
    n_act = sum(cut["action_mask"])
    assert cut["input_ids"][-n_act:] == tok.encode(action) + [2]
    text = tok.decode(cut["input_ids"][:-n_act])
    assert text.startswith(prompt[:40]) and text.endswith(prompt[prompt.rindex("<|eot_id|>") - 2:])
    assert "item number 399" not in text  # the end of the HTML went
    assert encode_prompt(tok, prompt, 300 - n_act) == cut["input_ids"][:-n_act]


def test_a_loaded_models_head_reads_a_strided_slice_as_a_contiguous_one(tmp_path):
    """``contiguous_head_input``: the head's input is made contiguous (torch's CPU linear on a strided 3-D input
    copies the weight per row); the logits are the same."""
    import torch

    from webrl_core.config import EmbeddedModelConfig, ModelsConfig
    from webrl_core.learn.models import load_causal_lm
    from webrl_core.learn.embedded_model import build_embedded_model, train_embedded_tokenizer

    train_embedded_tokenizer([f"word {i} other {i * 7}" for i in range(50)], 300, tmp_path / "tok")
    folder = build_embedded_model(tmp_path / "tok", EmbeddedModelConfig(vocab_size=300, hidden_size=32,
                                  intermediate_size=64, num_layers=1, num_heads=2, max_length=64, arch="llama"),
                                  tmp_path / "m", seed=1)
    model = load_causal_lm(folder, ModelsConfig(device="cpu", dtype="float32"))
    head = model.get_output_embeddings()
    seen = []
    head.register_forward_hook(lambda mod, args, out: seen.append(args[0].is_contiguous()))
    hidden = torch.randn(3, 10, 32)[:, -4:, :]
    assert not hidden.is_contiguous()
    with torch.no_grad():
        out = head(hidden)
    assert seen == [True] and torch.allclose(out, hidden.contiguous() @ head.weight.T, atol=1e-6)


def test_to_device_excludes_cudnn_attention_on_cuda_unless_asked(monkeypatch):
    """On CUDA the cuDNN sdpa backend is off (a graph per new padded length: docs/benchmarks.md, "The training
    stages on a GPU"), back on with WEBRL_CUDNN_ATTENTION=1; a CPU placement leaves the process's setting alone."""
    import webrl_core.learn.models as M

    calls, moved = [], []

    class Module:
        def to(self, device):
            moved.append(device)
            return self

    monkeypatch.setattr(torch.backends.cuda, "enable_cudnn_sdp", calls.append)
    M.to_device(Module(), "cpu")
    assert calls == [] and moved == [torch.device("cpu")]
    monkeypatch.setattr(M, "resolve_device", lambda spec: torch.device("cuda"))
    monkeypatch.delenv(M.CUDNN_ATTENTION_ENV, raising=False)
    M.to_device(Module(), "auto")
    monkeypatch.setenv(M.CUDNN_ATTENTION_ENV, "1")
    M.to_device(Module(), "auto")
    assert calls == [False, True] and moved[1:] == [torch.device("cuda")] * 2


def test_compiled_layers_train_as_the_eager_ones(tok_dir, tmp_path):
    """models.compile_layers: on compiles every decoder layer (a causal LM's, a critic's backbone's); auto only a
    stage of COMPILE_PAYS_PASSES passes; the weights' names and the gradients of a padded batch at two lengths equal
    the eager model's up to rounding. A bad value is named."""
    from webrl_core.learn.critic import Critic
    from webrl_core.learn.models import (COMPILE_PAYS_PASSES, compile_layers, decoder_layers, head_logits,
                                         last_hidden_states)

    out = build_embedded_model(tok_dir, tiny("llama"), tmp_path / "m")
    cfg = ModelsConfig(train_layers=1)

    def grads(setting: str, passes: int):
        model = load_causal_lm(out, cfg, trainable=True)
        compiled = compile_layers(model, setting, passes)
        torch.manual_seed(0)
        for length in (19, 33):
            ids = torch.randint(5, 400, (2, length))
            mask = torch.ones_like(ids)
            mask[0, :4] = 0
            hidden = last_hidden_states(model, ids, mask)[:, -3:]
            head_logits(model, hidden.reshape(-1, hidden.shape[-1])).logsumexp(-1).mean().backward()
        return model, compiled, {n: p.grad for n, p in model.named_parameters() if p.grad is not None}

    eager, was, g0 = grads("auto", COMPILE_PAYS_PASSES - 1)
    compiled, now, g1 = grads("auto", COMPILE_PAYS_PASSES)
    assert (was, now) == (False, True)
    assert all(layer._compiled_call_impl is not None for layer in decoder_layers(compiled, "test")[1])
    assert all(layer._compiled_call_impl is None for layer in decoder_layers(eager, "test")[1])
    assert sorted(compiled.state_dict()) == sorted(eager.state_dict()) and g0.keys() == g1.keys() and g0
    for name in g0:
        torch.testing.assert_close(g1[name], g0[name], rtol=1e-4, atol=1e-6)
    critic = Critic.from_backbone(out, dtype="float32", device="cpu").for_training(cfg)
    assert compile_layers(critic, "on", 1)
    assert all(layer._compiled_call_impl is not None for layer in decoder_layers(critic.backbone, "test")[1])
    assert not compile_layers(critic, "off", 10 ** 6)
    with pytest.raises(ValueError, match="models.compile_layers='fast'"):
        compile_layers(eager, "fast", 1)


def test_a_bad_switch_value_is_named(monkeypatch):
    from webrl_core.learn.models import CUDNN_ATTENTION_ENV, env_switch

    monkeypatch.delenv(CUDNN_ATTENTION_ENV, raising=False)
    assert env_switch(CUDNN_ATTENTION_ENV) is False
    monkeypatch.setenv(CUDNN_ATTENTION_ENV, "yes")
    assert env_switch(CUDNN_ATTENTION_ENV) is True
    monkeypatch.setenv(CUDNN_ATTENTION_ENV, "on")
    with pytest.raises(ValueError, match="WEBRL_CUDNN_ATTENTION='on'"):
        env_switch(CUDNN_ATTENTION_ENV)

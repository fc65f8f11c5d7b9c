"""Critic: last-non-pad pooling under padding, the official loss on distinct prompts, save/load, training."""

import math

import pytest
import torch

from webrl_core.config import EmbeddedModelConfig
from webrl_core.config_loader import load_config
from webrl_core.learn.critic import Critic, critic_examples, critic_loss
from webrl_core.learn.models import left_pad
from webrl_core.learn.embedded_model import build_embedded_model, train_embedded_tokenizer
from webrl_core.prompts import build_prompt
from webrl_core.learn.critic_trainer import train_critic
from webrl_core.learn.transitions import build_transitions
from webrl_core.runs import loss_history


def _texts():
    return [build_prompt(f"open item {i}", [], f"<button id={i}>Open {i}</button>") + f'do(action="Click", element="{i}")'
            for i in range(40)]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("critic_models")
    train_embedded_tokenizer(_texts(), 400, root / "tok")
    out = {}
    for arch in ("llama", "qwen2", "gpt_neox"):
        cfg = EmbeddedModelConfig(vocab_size=400, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=2,
                                  max_length=512, arch=arch)
        out[arch] = build_embedded_model(root / "tok", cfg, root / arch, seed=1)
    return out


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gpt_neox"])
def test_pooling_reads_last_real_token_under_left_and_right_padding(tiny, arch):
    critic = Critic.from_backbone(tiny[arch], head_init_std=0.2, max_length=256, device="cpu").eval()
    prompts = [build_prompt("open item 3", [], "<p>x</p>"),
               build_prompt("open item 12", ['do(action="Click", element="1")'], "<button id=5>Open 5 now</button>")]
    ids = critic.encode(prompts)
    assert len(ids[0]) < len(ids[1])
    pad = critic.tokenizer.pad_token_id
    with torch.no_grad():
        single = [torch.cat(critic(torch.tensor([x]), torch.ones(1, len(x), dtype=torch.long)), -1) for x in ids]
        single = torch.cat(single)
        lids, lmask = left_pad(ids, pad)
        left = torch.cat(critic(lids, lmask), -1)
        width = max(map(len, ids))
        rids = torch.tensor([x + [pad] * (width - len(x)) for x in ids])
        rmask = torch.tensor([[1] * len(x) + [0] * (width - len(x)) for x in ids])
        right = torch.cat(critic(rids, rmask), -1)
        # what the official [:, -1] read gives with right padding: a pad position for the short prompt
        hidden = critic.backbone(input_ids=rids, attention_mask=rmask).last_hidden_state[:, -1]
        naive = torch.cat([critic.head1(hidden), critic.head2(hidden)], -1)
    assert torch.allclose(left, single, atol=1e-5), (left, single)
    assert torch.allclose(right, single, atol=1e-5), (right, single)
    assert not torch.allclose(naive[0], single[0], atol=1e-3)
    v, p1, p2 = critic.values(prompts, batch_size=2)
    v1, _, _ = critic.values(prompts, batch_size=1)
    assert torch.allclose(v, v1, atol=1e-6) and torch.equal(v, torch.minimum(p1, p2))


def test_critic_loss_by_hand():
    l1 = torch.tensor([[0.0, 0.0]])
    l2 = torch.tensor([[math.log(3.0), 0.0]])
    # CE1 = -log(1/2), CE2 = -log(1/4)  ->  log 8
    assert critic_loss(l1, l2, torch.tensor([1])).item() == pytest.approx(math.log(8.0))
    # weighted: w = [2, 2] for 2 samples' worth of (s, s') -> mean over samples
    l1b, l2b = l1.repeat(2, 1), l2.repeat(2, 1)
    assert critic_loss(l1b, l2b, torch.tensor([1, 0]), torch.tensor([2.0, 2.0])).item() == pytest.approx(
        math.log(8.0) + math.log(2.0) + math.log(4.0 / 3.0))


def _trajs():
    eps = []
    for e, ok in enumerate([True, False, True]):
        ep = {"episode_id": f"e{e}", "success": ok, "intent": f"{'open' if ok else 'close'} item {e}"}
        steps, past = [], []
        for k in range(2 + e % 2):
            steps.append({"idx": k, "prompt": build_prompt(ep["intent"], past, f"<p>page {k}</p>"), "response": f"r{k}"})
            past.append(f"r{k}")
        eps.append((ep, steps))
    return eps


def test_distinct_prompt_loss_equals_official_sum_of_four(tiny):
    torch.manual_seed(0)
    critic = Critic.from_backbone(tiny["llama"], head_init_std=0.2, max_length=256, device="cpu").eval()
    samples = build_transitions(_trajs())
    official = 0.0
    for s in samples:
        y = torch.tensor([int(s["mc_return"] > 0)])
        for prompt in (s["observation"], s["next_observation"]):
            x = critic.encode([prompt])[0]
            l1, l2 = critic(torch.tensor([x]), torch.ones(1, len(x), dtype=torch.long))
            official += (torch.nn.functional.cross_entropy(l1, y) + torch.nn.functional.cross_entropy(l2, y)).item()
    official /= len(samples)
    ex = critic_examples(samples)
    assert len(ex) == len(samples)  # s' of step t is s of step t+1: one pass per distinct prompt
    assert sum(e["weight"] for e in ex) == 2 * len(samples)
    ids, mask = left_pad(critic.encode([e["prompt"] for e in ex]), critic.tokenizer.pad_token_id)
    l1, l2 = critic(ids, mask)
    ours = critic_loss(l1, l2, torch.tensor([e["label"] for e in ex]), torch.tensor([e["weight"] for e in ex]))
    assert ours.item() == pytest.approx(official, rel=1e-5)


def test_train_save_load_and_learns_success(tiny, tmp_path):
    samples = build_transitions(_trajs())
    settings = load_config(sets=["models.device=cpu", "models.max_length=256", "critic.batch_size=4",
                                 "critic.lr=0.003", "critic.epochs=12", "critic.head_init_std=0.1"])
    before = Critic.from_backbone(tiny["gpt_neox"], 0.1, 256, device="cpu", seed=settings.run.seed)
    stats = train_critic(samples, tiny["gpt_neox"], tmp_path / "critic", settings)
    assert stats["n_prompts"] == len(samples) and stats["steps"] > 0
    history = loss_history.read(tmp_path / "critic")  # the loss at every step, in the saved folder
    assert history["training"] == "critic"
    assert [h["step"] for h in history["history"]] == list(range(1, 1 + stats["steps"]))
    assert [[h["step"], h["loss"]] for h in history["history"]] == stats["loss_curve"]
    critic = Critic.load(tmp_path / "critic", device="cpu")
    ok = [s["observation"] for s in samples if s["mc_return"] > 0]
    bad = [s["observation"] for s in samples if s["mc_return"] == 0]
    v_ok, v_bad = critic.values(ok)[0].mean(), critic.values(bad)[0].mean()
    b_ok, b_bad = before.values(ok)[0].mean(), before.values(bad)[0].mean()
    assert v_ok - v_bad > 0.3 and v_ok - v_bad > b_ok - b_bad
    again = Critic.load(tmp_path / "critic", device="cpu")
    assert torch.equal(again.values(ok)[0], critic.values(ok)[0])
    # resume from the saved critic (phase i > 1)
    stats2 = train_critic(samples, tiny["gpt_neox"], tmp_path / "critic2", settings, resume=tmp_path / "critic",
                          max_steps=1)
    assert stats2["steps"] == 1 and (tmp_path / "critic2" / "heads.safetensors").exists()


def _lora_models(dtype="float32", r=4, **kw):
    from webrl_core.config import ModelsConfig

    return ModelsConfig(device="cpu", dtype=dtype, lora={"enabled": True, "r": r, "alpha": 2 * r, "dropout": 0.0},
                        **kw)


@pytest.mark.parametrize("arch", ["llama", "gpt_neox"])
def test_lora_critic_trains_adapters_and_heads_and_round_trips(tiny, tmp_path, arch):
    """models.lora.enabled: the critic's backbone gets LoRA adapters, only adapters + heads train, and a saved
    LoRA critic (adapters merged into backbone/, adapters alone in adapter/) loads back with the same values."""
    mc = _lora_models(gradient_checkpointing=True)
    critic = Critic.from_backbone(tiny[arch], 0.2, 256, device="cpu", seed=0).for_training(mc)
    names = {n for n, p in critic.named_parameters() if p.requires_grad}
    assert names and all("lora_" in n or n.startswith(("head1.", "head2.")) for n in names)
    heads = sum(p.numel() for n, p in critic.named_parameters() if n.startswith(("head1.", "head2.")))
    lora = sum(p.numel() for n, p in critic.named_parameters() if "lora_" in n)
    counts = critic.parameter_counts()
    assert counts["trainable_params"] == heads + lora < counts["total_params"]
    prompts = [build_prompt("open item 3", [], "<p>x</p>"), build_prompt("close item 7", ["r0"], "<p>page 1</p>")]
    base = Critic.from_backbone(tiny[arch], 0.2, 256, device="cpu", seed=0)
    assert torch.allclose(base.values(prompts)[0], critic.values(prompts)[0], atol=1e-6)  # fresh adapter: lora_B = 0
    with torch.no_grad():  # move the adapters away from their zero init so merging matters
        for n, p in critic.named_parameters():
            if "lora_B" in n:
                p.add_(0.05)
    v, p1, p2 = critic.values(prompts)
    assert not torch.allclose(torch.cat([p1, p2]), torch.cat(base.values(prompts)[1:]), atol=1e-4)
    critic.save(tmp_path / "c")
    assert (tmp_path / "c" / "adapter" / "adapter_config.json").exists()
    again = Critic.load(tmp_path / "c", device="cpu")
    assert not any("lora" in n for n, _ in again.named_parameters())  # an ordinary critic folder
    v2, q1, q2 = again.values(prompts)
    assert torch.allclose(torch.cat([q1, q2]), torch.cat([p1, p2]), atol=1e-5)
    assert any("lora_" in n for n, _ in critic.named_parameters())  # the training critic keeps its adapters


def test_train_critic_with_lora_in_bf16(tiny, tmp_path):
    """train_critic under models.lora + bfloat16: frozen bf16 base, float32 adapters and heads, bf16 autocast;
    the stats report the trainable parameter count; resuming puts a fresh adapter on the merged critic."""
    samples = build_transitions(_trajs())
    settings = load_config(sets=["models.device=cpu", "models.dtype=bfloat16", "models.max_length=256",
                                 "models.lora.enabled=true", "models.lora.r=4", "critic.batch_size=4",
                                 "critic.lr=0.003"])
    critic = Critic.from_backbone(tiny["llama"], 0.2, 256, dtype="bfloat16", device="cpu").for_training(
        settings.models)
    dtypes = {p.dtype for n, p in critic.named_parameters() if p.requires_grad}
    assert dtypes == {torch.float32}
    assert {p.dtype for n, p in critic.named_parameters() if not p.requires_grad} == {torch.bfloat16}
    stats = train_critic(samples, tiny["llama"], tmp_path / "c", settings, max_steps=2)
    assert stats["steps"] == 2 and 0 < stats["trainable_params"] < stats["total_params"]
    assert stats["trainable_params"] == critic.parameter_counts()["trainable_params"]
    assert (tmp_path / "c" / "adapter").is_dir()
    stats2 = train_critic(samples, tiny["llama"], tmp_path / "c2", settings, resume=tmp_path / "c", max_steps=1)
    assert stats2["steps"] == 1 and stats2["trainable_params"] == stats["trainable_params"]
    assert Critic.load(tmp_path / "c2", dtype="bfloat16", device="cpu").values(["x"])[0].shape == (1,)

"""learn.frozen_prefix: the frozen bottom layers' hidden states kept per token sequence, on real tiny Llamas."""

from __future__ import annotations

import pytest
import torch
from actor_samples import four_layer_model, two_click_transitions

from webrl_core.config_loader import load_config
from webrl_core.learn import frozen_prefix as FP
from webrl_core.learn.critic import Critic
from webrl_core.learn.models import (autocast_context, encode_prompt_action, last_hidden_states, left_pad,
                                     load_causal_lm, load_tokenizer)
from webrl_core.prompts import build_prompt



@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return four_layer_model(tmp_path_factory.mktemp("frozen_prefix"))


@pytest.fixture(autouse=True)
def cache_on(monkeypatch):
    monkeypatch.setenv(FP.ENV, "64")
    FP.clear()
    yield
    FP.clear()


def _settings(*extra):
    return load_config(sets=["models.device=cpu", "models.dtype=float32", "models.train_layers=2", *extra])


def _batch(lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    rows = [torch.randint(3, 100, (n,), generator=g).tolist() for n in lengths]
    return left_pad(rows, 0)


def _plain(model, ids, mask):
    """The uncached pass: the cache turned off for this call."""
    with pytest.MonkeyPatch.context() as m:
        m.setenv(FP.ENV, "0")
        return last_hidden_states(model, ids, mask)


def test_rows_met_before_run_the_top_layers_from_the_kept_states(folder):
    model = load_causal_lm(folder, _settings().models)
    prefix = FP.attach(model, _settings().models)
    assert prefix is not None and prefix.n_frozen == 2
    ids, mask = _batch([9, 14, 5, 11])
    with torch.no_grad():
        ref = _plain(model, ids, mask)
        first = last_hidden_states(model, ids, mask)  # every row missed: run whole, kept
        assert FP.stats()["misses"] == 4 and FP.stats()["rows"] == 4
        again = last_hidden_states(model, ids, mask)  # every row kept: the top two layers only
        assert FP.stats()["hits"] == 4
    real = mask.bool()
    assert torch.allclose(first[real], ref[real], atol=1e-5)
    assert torch.allclose(again[real], ref[real], atol=1e-5)
    # the same rows in another batch: other padding, mixed with unseen rows, in another order
    rows = [ids[i][mask[i].bool()].tolist() for i in (2, 0)]
    ids2, mask2 = left_pad([torch.randint(3, 100, (17,)).tolist(), *rows], 0)
    with torch.no_grad():
        mixed = last_hidden_states(model, ids2, mask2)
        mixed_ref = _plain(model, ids2, mask2)
    assert FP.stats()["hits"] == 6 and FP.stats()["misses"] == 5
    assert torch.allclose(mixed[mask2.bool()], mixed_ref[mask2.bool()], atol=1e-5)


def test_a_calibrations_candidates_each_meet_the_cache_as_they_found_it(folder):
    """``micro_batch.round_robin`` passes every candidate over the same items: none may keep them, or every later
    candidate would be timed on the top layers alone against the first's whole pass."""
    from webrl_core.learn.micro_batch import round_robin

    model = load_causal_lm(folder, _settings().models)
    FP.attach(model, _settings().models)
    ids, mask = _batch([9, 14, 5, 11])
    with torch.no_grad():
        last_hidden_states(model, ids[:1], mask[:1])  # one row kept before the measurement
    seen = []

    def run(items, c):
        with torch.no_grad():
            last_hidden_states(model, ids[items], mask[items])
        seen.append(dict(FP.stats()))
        return 1.0, float(len(items))

    round_robin([(1,), (2,)], [[0, 1], [0, 1, 2, 3], [0, 1, 2, 3]], run, prune=False)
    assert FP.stats()["rows"] == 1  # nothing new kept
    hits = [b["hits"] - a["hits"] for a, b in zip([{"hits": 0}] + seen, seen)]
    assert hits == [1, 1, 1, 1, 1, 1]  # every pass found the one row kept before, and only it


def test_a_training_pass_from_kept_states_gives_the_same_gradients(folder):
    settings = _settings()
    model = load_causal_lm(folder, settings.models, trainable=True)
    assert FP.attach(model, settings.models) is not None
    ids, mask = _batch([7, 12, 10], seed=1)

    def grads(fn):
        model.zero_grad(set_to_none=True)
        fn(model, ids, mask)[mask.bool()].pow(2).sum().backward()
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}

    plain = grads(_plain)
    with torch.no_grad():
        last_hidden_states(model, ids, mask)  # keeps the rows
    cached = grads(last_hidden_states)
    assert FP.stats()["hits"] == 3
    assert set(plain) == set(cached) and all(n.startswith("model.layers.2") or n.startswith("model.layers.3")
                                             or n.startswith("model.norm") for n in plain)
    for n in plain:
        assert torch.allclose(plain[n], cached[n], atol=1e-5, rtol=1e-4), n


def test_the_critic_and_the_actor_share_the_pretrained_bottom_layers(folder, tmp_path):
    settings = _settings()
    actor = load_causal_lm(folder, settings.models)
    critic = Critic.from_backbone(folder, 0.05, 256, device="cpu").for_training(settings.models)
    a, c = FP.attach(actor, settings.models), FP.attach(critic.backbone, settings.models)
    assert a is not None and a == c  # the same frozen weights: one fingerprint, one set of kept rows
    ids, mask = _batch([8, 13], seed=2)
    with torch.no_grad():
        critic(ids, mask)
        assert FP.stats() == {**FP.stats(), "misses": 2, "hits": 0}
        last_hidden_states(actor, ids, mask)
    assert FP.stats()["hits"] == 2
    changed = load_causal_lm(folder, settings.models)
    with torch.no_grad():
        changed.model.layers[0].mlp.down_proj.weight.mul_(1.01)
    assert FP.attach(changed, settings.models).fingerprint != a.fingerprint


def test_the_replays_prompt_and_action_rows_serve_the_critics_values_of_their_prompts(folder, tmp_path):
    """1/PPL over prompt + action keeps each prompt's states under its own key; the critic's values of those prompts
    then run the top layers only, and equal the uncached values."""
    from webrl_core.learn.replay import inverse_perplexity

    settings = _settings()
    actor = load_causal_lm(folder, settings.models)
    critic = Critic.from_backbone(folder, 0.05, 256, device="cpu").for_training(settings.models)
    FP.attach(actor, settings.models), FP.attach(critic.backbone, settings.models)
    prompts = [build_prompt(f"open item {i}", [], f"<button id={i}>Open {i}</button>" * (1 + i)) for i in range(3)]
    pairs = [(p, f'do(action="Click", element="{i}")') for i, p in enumerate(prompts)]
    uncached = critic.values(prompts, batch_size=2)[0]
    FP.clear()
    inverse_perplexity(actor, critic.tokenizer, pairs, 256, batch_size=2)  # one checkpoint, one tokenizer
    assert FP.stats()["misses"] == 3 and FP.stats()["hits"] == 0
    values = critic.values(prompts, batch_size=2)[0]
    assert FP.stats()["hits"] == 3 and FP.stats()["misses"] == 3  # every prompt from the replay's rows
    assert torch.allclose(values, uncached, atol=1e-5)


def test_not_attached_where_the_bottom_layers_train_or_the_cache_is_off(folder, monkeypatch):
    everything = load_config(sets=["models.device=cpu", "models.dtype=float32"])
    assert FP.attach(load_causal_lm(folder, everything.models, trainable=True), everything.models) is None
    lora = _settings("models.lora.enabled=true")
    assert FP.attach(load_causal_lm(folder, lora.models), lora.models) is None
    model = load_causal_lm(folder, _settings().models)
    assert FP.attach(model, _settings().models) is not None
    model.model.layers[0].requires_grad_(True)  # unfrozen after attaching: the passes run whole, nothing kept
    ids, mask = _batch([6, 9], seed=3)
    last_hidden_states(model, ids, mask)
    assert FP.stats()["rows"] == 0
    monkeypatch.setenv(FP.ENV, "0")
    assert FP.attach(load_causal_lm(folder, _settings().models), _settings().models) is None
    monkeypatch.setenv(FP.ENV, "lots")
    with pytest.raises(ValueError, match="WEBRL_FROZEN_CACHE_MB='lots'"):
        FP.budget_bytes()


def test_the_least_recently_used_rows_leave_past_the_budget(folder, monkeypatch):
    model = load_causal_lm(folder, _settings().models)
    FP.attach(model, _settings().models)
    row_bytes = 10 * 48 * 4  # 10 real tokens of hidden size 48 in float32
    monkeypatch.setenv(FP.ENV, str(2.5 * row_bytes / 2 ** 20))  # room for two such rows
    with torch.no_grad():
        for seed in range(3):
            last_hidden_states(model, *_batch([10], seed=10 + seed))
    assert FP.stats()["rows"] == 2 and FP.stats()["bytes"] == 2 * row_bytes
    with torch.no_grad():
        last_hidden_states(model, *_batch([10], seed=10))  # the first row left: missed again
    assert FP.stats()["misses"] == 4


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_phase_runs_the_critic_values_and_the_actor_epoch_from_kept_states(folder, tmp_path, dtype):
    """The critic's epoch keeps its prompts; the actor stage's critic values (a loaded critic) then hit every one;
    the reference pass keeps the prompt + action rows and the epoch hits them. In bfloat16 the epochs run under
    autocast, so the values pass must too (the cache key includes it)."""
    from webrl_core.learn.critic import critic_examples
    from webrl_core.learn.critic_trainer import train_critic
    from webrl_core.learn.webrl_trainer import train_actor

    samples = two_click_transitions()
    settings = _settings("models.max_length=256", "actor.batch_size=2", "critic.batch_size=2", f"models.dtype={dtype}")
    train_critic(samples, folder, tmp_path / "critic", settings)
    prompts = {e["prompt"] for e in critic_examples(samples)}
    assert FP.stats()["rows"] == len(prompts) and FP.stats()["hits"] == 0
    stats = train_actor(samples, folder, tmp_path / "actor", settings, critic_dir=tmp_path / "critic",
                        progress=False)
    n_train = stats["n_train"]
    # critic values: one hit per distinct prompt; the reference pass: a miss per trained sample; the epoch: a hit
    assert FP.stats()["hits"] == len(prompts) + n_train and FP.stats()["misses"] == len(prompts) + n_train


def test_the_replay_stage_keeps_its_rows_for_the_bf16_actor_epoch(folder, tmp_path):
    """The replay's 1/PPL pass runs in the training autocast, so in bfloat16 the actor's epoch over the replayed
    steps runs their top layers only (a pass outside autocast keeps its rows under another key, and every replayed
    row missed)."""
    import json

    from webrl_core.artifacts import ArtifactRef, read_jsonl
    from webrl_core.pipeline.experience import replay_transitions
    from webrl_core.runs.store import TrajectoryStore

    run = tmp_path / "run"
    episodes = []
    for e in range(3):
        ep = {"episode_id": f"o{e}", "task_id": f"t{e}", "phase": 0, "policy_id": "oracle",
              "policy_digest": "oracle", "purpose": "rollout", "status": "done", "success": True, "env_score": 1.0,
              "intent": f"open item {e}", "site": "shopping"}
        steps = [{"idx": k, "prompt": build_prompt(f"open item {e}", [], f"<button id={e + k}>Open {e + k}</button>"),
                  "html": "<p/>", "response": f'do(action="Click", element="{e + k}")', "done": k == 1}
                 for k in range(2)]
        episodes.append((ep, steps))
    TrajectoryStore(run).write_episodes(episodes)
    current = tmp_path / "samples.jsonl"
    current.write_text("".join(json.dumps({"n": i}) + "\n" for i in range(3)))
    settings = _settings("models.max_length=256", "models.dtype=bfloat16", "replay.low=0.0", "replay.high=1.0")
    ref, info = replay_transitions(settings, str(run), 1, ArtifactRef.of(folder, "model"), ArtifactRef.of(current))
    replayed = read_jsonl(ref)
    assert info["replay_kept"] == len(replayed) == 6
    assert info["replay_s"] > 0 and info["replay_tokens"] > 0 and info["replay_flops"] > 0  # the scoring pass's cost
    assert "replay_share_of_peak" not in info  # no peak measured with the box's measurements off (the suite's)
    before = FP.stats()
    model = load_causal_lm(folder, settings.models, trainable=True)  # as train_actor loads the phase-start actor
    FP.attach(model, settings.models)
    tok = load_tokenizer(folder)
    rows = [encode_prompt_action(tok, s["observation"], s["action"], 256)["input_ids"] for s in replayed]
    with autocast_context(settings.models, "cpu"):
        last_hidden_states(model, *left_pad(rows, 0))
    assert FP.stats()["hits"] - before["hits"] == len(rows) and FP.stats()["misses"] == before["misses"]

"""training.launcher: accelerate -- the critic and actor stages as `accelerate launch` jobs of 2 CPU ranks (gloo).

DDP with 2 ranks takes the optimizer step one process takes with the same global batch (the launcher gives each
rank half of every batch): loss curve and final weights equal the in-process run's within float32 reduction-order
noise. Measured on the 2-core box (tiny Llama; critic: 16 prompts, 20 steps; actor: 32 samples, 32 steps):
loss curve max |diff| per logged step 3.1e-6 (critic, losses ~2.4) and 1.0e-7 (actor, losses 0.29 -> 0.004), every
step logged (with a loss logged per 10 steps, the window's mean: 5.7e-7 and 2.4e-8);
final weights max |diff| 2.2e-6 (critic, weights up to ~1.0) and 1.2e-7 (actor, moved up to 0.01 by training).
Tolerances below: 1e-5 (loss) and 5e-5 (weights). FSDP (FSDP2 over gloo, 2 ranks) runs end to end, saves the
gathered full weights, and lands within the same tolerances (actor: 1.5e-7 / 1.2e-7; ORM weights: 7e-9).
A rank that raises fails the stage with an error that quotes that rank's exception and last lines.

Every accelerate job starts 3 Python processes that import torch/transformers: 35-100 s per job on the 2-core box
depending on its load, so those tests are marked slow (about 6 minutes together; the fast ones take ~40 s).
"""

import json
from types import SimpleNamespace

import pytest
import torch
import yaml

from webrl_core.scale import launch
from webrl_core.config import EmbeddedModelConfig
from webrl_core.config_loader import load_config
from webrl_core.learn.critic import Critic
from webrl_core.scale.launch import LaunchError, TrainingConfig
from webrl_core.learn.embedded_model import build_embedded_model, train_embedded_tokenizer
from webrl_core.prompts import build_prompt
from webrl_core.learn.transitions import build_transitions
from webrl_core.runs import loss_history
from webrl_core import hardware

LOSS_TOL = 1e-5
WEIGHT_TOL = 5e-5
DDP = TrainingConfig(launcher="accelerate", accelerate_config="ddp", num_processes=2)
FSDP = TrainingConfig(launcher="accelerate", accelerate_config="fsdp", num_processes=2)
INPROC = TrainingConfig()


# ---------------------------------------------------------------------------------------------
# fast: config, command line, log parsing, failure report, dispatch

def test_training_config_fields_and_validation():
    tc = TrainingConfig()
    assert (tc.launcher, tc.accelerate_config, tc.num_processes, tc.python, tc.extra_args) == (
        "inprocess", "ddp", 2, None, [])
    for name, field in TrainingConfig.model_fields.items():
        assert field.description, name
    with pytest.raises(ValueError, match="neither a file nor one of"):
        TrainingConfig(launcher="accelerate", accelerate_config="nope")
    TrainingConfig(launcher="inprocess", accelerate_config="nope")  # only checked when used
    with pytest.raises(ValueError):
        TrainingConfig(launcher="torchrun")
    with pytest.raises(ValueError):
        TrainingConfig(num_processes=0)


def test_accelerate_configs_in_infra():
    assert set(launch.accelerate_config_names()) >= {"ddp", "fsdp", "deepspeed_zero3"}
    ddp = yaml.safe_load(launch.accelerate_config_path("ddp").read_text())
    assert ddp["distributed_type"] == "MULTI_GPU" and ddp["use_cpu"] is False  # torchrun starts N ranks
    fsdp = yaml.safe_load(launch.accelerate_config_path("fsdp.yaml").read_text())
    assert fsdp["distributed_type"] == "FSDP" and fsdp["fsdp_config"]["fsdp_version"] == 2
    assert fsdp["fsdp_config"]["fsdp_state_dict_type"] == "FULL_STATE_DICT"
    ds = yaml.safe_load(launch.accelerate_config_path("deepspeed_zero3").read_text())
    assert ds["distributed_type"] == "DEEPSPEED"
    assert {"zero_stage": 3, "offload_optimizer_device": "cpu", "offload_param_device": "cpu",
            "zero3_save_16bit_model": True}.items() <= ds["deepspeed_config"].items()
    path = launch.accelerate_config_path("ddp")
    assert launch.accelerate_config_path(str(path)) == path  # a path works too


def test_launch_command(tmp_path):
    cmd = launch.launch_command(TrainingConfig(launcher="accelerate", num_processes=3, python="/opt/py",
                                               extra_args=["--monitor_interval", "1"]), tmp_path / "job.json")
    assert cmd[:3] == ["/opt/py", "-m", "accelerate.commands.launch"]
    assert cmd[cmd.index("--config_file") + 1].endswith("infra/accelerate/ddp.yaml")
    assert cmd[cmd.index("--num_processes") + 1] == "3"
    port, ephemeral = int(cmd[cmd.index("--main_process_port") + 1]), hardware.ephemeral_start()
    assert port > 0 and (ephemeral is None or port < ephemeral)  # free, and no port the kernel hands out itself
    assert cmd[-3:] == ["-m", "webrl_core.scale.launch", str(tmp_path / "job.json")]
    assert cmd.index("--monitor_interval") < cmd.index("-m", 3)
    own = launch.launch_command(TrainingConfig(launcher="accelerate", extra_args=["--main_process_port", "29999"]),
                                tmp_path / "j.json")
    assert own.count("--main_process_port") == 1 and "29999" in own


def test_rank_prefixes_and_failure_report(tmp_path):
    assert launch._rank_of("[default1]:boom") == (1, "boom")
    assert launch._rank_of("[default12]:x]: y") == (12, "x]: y")
    assert launch._rank_of("W1123 torch/distributed/run.py: Setting OMP_NUM_THREADS") == (
        None, "W1123 torch/distributed/run.py: Setting OMP_NUM_THREADS")
    errors = tmp_path / "errors"
    errors.mkdir()
    for rank, t, msg in ((0, 20.0, "RuntimeError: connection closed by peer"), (1, 10.0, "bad sample 7")):
        (errors / f"rank{rank}.json").write_text(json.dumps(
            {"rank": rank, "time": t, "type": "ValueError", "message": msg, "traceback": "Traceback..."}))
    tails = {1: ["step 3", "ValueError: bad sample 7"], 0: ["waiting"], None: ["launcher line"]}
    err = launch._failure("critic", 1, errors, tails, DDP)
    assert err.rank == 1 and err.returncode == 1
    assert "rank 1 raised ValueError: bad sample 7" in str(err) and "rank(s) [0] failed too" in str(err)
    assert "--- last lines of rank 1 ---\nstep 3\nValueError: bad sample 7" in str(err)
    nothing = launch._failure("actor", -9, tmp_path / "none", tails, DDP)
    assert nothing.rank is None and "no rank reported" in str(nothing) and "launcher line" in str(nothing)
    # a rank killed by a signal raised nothing: its own last lines (a C++ abort's message) are in the report
    report = str(nothing)
    assert "--- last lines of rank 1 ---\nstep 3\n" in report and "--- last lines of rank 0 ---\nwaiting" in report


def test_per_rank_settings_split_the_global_batch():
    s = load_config(sets=["actor.batch_size=8", "actor.grad_accum=1", "critic.batch_size=6", "critic.grad_accum=4",
                          "actor.micro_batch_size=8"])
    a = launch.per_rank_settings(s, "actor", 2)["actor"]
    assert (a["batch_size"], a["grad_accum"], a["micro_batch_size"]) == (4, 1, 4)
    c = launch.per_rank_settings(s, "critic", 4)["critic"]
    assert (c["batch_size"], c["grad_accum"]) == (6, 1)  # 6 does not split in 4: the accumulation does
    with pytest.raises(ValueError, match="num_processes=4 must divide actor.batch_size=6 or actor.grad_accum=1"):
        launch.per_rank_settings(load_config(sets=["actor.batch_size=6"]), "sft", 4)
    assert launch.per_rank_settings(s, "actor", 1)["actor"]["batch_size"] == 8


def test_inprocess_dispatch_calls_the_trainers(monkeypatch, tmp_path):
    from webrl_core.learn import critic_trainer, webrl_trainer

    calls = []
    monkeypatch.setattr(critic_trainer, "train_critic", lambda *a, **kw: calls.append(("critic", a, kw)) or {"ok": 1})
    monkeypatch.setattr(webrl_trainer, "train_actor", lambda *a, **kw: calls.append(("actor", a, kw)) or {"ok": 2})
    settings = load_config()
    assert launch.train_critic([{"x": 1}], "b", tmp_path, settings, resume="r") == {"ok": 1}
    # settings.training (the section the flows will carry) is used when no config is passed
    holder = SimpleNamespace(training=TrainingConfig(), **{k: getattr(settings, k) for k in ("models", "actor")})
    assert launch.train_actor([{"x": 1}], "a", tmp_path, holder, critic_dir="c") == {"ok": 2}
    assert calls[0] == ("critic", ([{"x": 1}], "b", tmp_path, settings), {"resume": "r", "max_steps": None})
    assert calls[1][2] == {"critic_dir": "c", "max_steps": None, "progress": True}


# ---------------------------------------------------------------------------------------------
# slow: real accelerate jobs on a tiny model

def _texts():
    return [build_prompt(f"open item {i}", [], f"<button id={i}>Open {i}</button>")
            + f'do(action="Click", element="{i}")' for i in range(40)]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("launch_models")
    train_embedded_tokenizer(_texts(), 400, root / "tok")
    cfg = EmbeddedModelConfig(vocab_size=400, hidden_size=48, intermediate_size=96, num_layers=2, num_heads=2,
                              max_length=512, arch="llama")
    model = build_embedded_model(root / "tok", cfg, root / "llama", seed=2)
    Critic.from_backbone(model, 0.05, 256, device="cpu").save(root / "critic")  # untrained critic
    return {"root": root, "model": model, "critic": root / "critic"}


def _samples(n_eps: int, fail_every: int = 0) -> list[dict]:
    eps = []
    for e in range(n_eps):
        ep = {"episode_id": f"s{e}", "success": not (fail_every and e % fail_every == fail_every - 1),
              "intent": f"open item {e}"}
        steps, past = [], []
        for k in range(2):
            resp = f'do(action="Click", element="{e + k}")'
            steps.append({"idx": k, "prompt": build_prompt(ep["intent"], past, f"<button id={e + k}>Open</button>"),
                          "response": resp})
            past.append(resp)
        eps.append((ep, steps))
    return build_transitions(eps)


def _critic_settings():
    # 16 distinct prompts, global batch 8 (2 ranks x 4), 10 epochs = 20 steps, logged every step
    return load_config(sets=["models.device=cpu", "models.max_length=256", "critic.batch_size=8", "critic.lr=0.003",
                             "critic.epochs=10"])


def _actor_settings():
    # 32 samples, global batch 4 (2 ranks x micro 1 x accumulation 2), 4 epochs = 32 steps, logged every step
    # (by step ~40 the KL-constrained loss is exactly 0: nothing left to compare)
    return load_config(sets=["models.device=cpu", "models.max_length=256", "actor.batch_size=4", "actor.lr=0.0003",
                             "actor.epochs=4"])


def _weights(folder):
    from safetensors.torch import load_file

    return {f"{f.relative_to(folder)}:{k}": v for f in sorted(folder.rglob("*.safetensors"))
            for k, v in load_file(str(f)).items()}


def _compare(ref: dict, got: dict, ref_dir, got_dir, start_dir=None) -> dict:
    steps_ref, loss_ref = zip(*ref["loss_curve"])
    steps_got, loss_got = zip(*got["loss_curve"])
    assert steps_ref == steps_got and len(steps_ref) >= 2
    loss_diff = max(abs(a - b) for a, b in zip(loss_ref, loss_got))
    assert loss_diff < LOSS_TOL, (ref["loss_curve"], got["loss_curve"])
    # rank 0 wrote the curve into the saved folder
    assert [[h["step"], h["loss"]] for h in loss_history.read(got_dir)["history"]] == got["loss_curve"]
    assert got["steps"] == ref["steps"] and got["train_loss"] == pytest.approx(ref["train_loss"], abs=LOSS_TOL)
    w_ref, w_got = _weights(ref_dir), _weights(got_dir)
    assert w_ref.keys() == w_got.keys() and w_ref
    w_diff = max((w_ref[k] - w_got[k]).abs().max().item() for k in w_ref)
    start = _weights(start_dir) if start_dir else None
    moved = max((w_ref[k] - start[k]).abs().max().item() for k in w_ref) if start else None
    assert w_diff < WEIGHT_TOL, w_diff
    print(f"\n{got['launch']}: loss curve {got['loss_curve']} vs in-process {ref['loss_curve']}: max |diff| "
          f"{loss_diff:.2e}; weights max |diff| {w_diff:.2e}" + (f" (moved up to {moved:.3f})" if moved else "")
          + f"; train_s {got['train_s']} vs in-process {ref['train_s']}")
    return {"loss_diff": loss_diff, "weight_diff": w_diff}


class _OneThread:
    """In-process references on one thread, like each rank (torchrun sets OMP_NUM_THREADS=1): faster on a loaded
    2-core box, and the same kernels."""

    def __enter__(self):
        self.n = torch.get_num_threads()
        torch.set_num_threads(1)

    def __exit__(self, *exc):
        torch.set_num_threads(self.n)


@pytest.fixture(scope="module")
def actor_reference(tiny, tmp_path_factory):
    out = tmp_path_factory.mktemp("actor_ref") / "actor"
    with _OneThread():
        stats = launch.train_actor(_samples(16), tiny["model"], out, _actor_settings(), critic_dir=tiny["critic"],
                                   progress=False, training=INPROC)
    assert stats["n_train"] == 32  # all successful: every sample trains, 8 full global batches per epoch
    return stats, out


@pytest.mark.slow
def test_ddp_critic_matches_inprocess(tiny, tmp_path):
    samples = _samples(8, fail_every=4)  # both labels
    with _OneThread():
        ref = launch.train_critic(samples, tiny["model"], tmp_path / "ref", _critic_settings(), training=INPROC)
    lines = []
    got = launch.train_critic(samples, tiny["model"], tmp_path / "ddp", _critic_settings(), training=DDP,
                              log=lines.append)
    assert got["launch"] == {"distributed_type": "MULTI_CPU", "num_processes": 2}
    assert got["n_prompts"] == ref["n_prompts"] == 16 and got["steps"] == 20
    print("\n" + lines[-1])
    assert any(line.startswith("[default1]:") for line in lines)  # both ranks' output streamed to log
    assert any("train critic" in line and "loss" in line for line in lines)  # rank 0's progress line
    _compare(ref, got, tmp_path / "ref", tmp_path / "ddp")
    Critic.load(tmp_path / "ddp", device="cpu")  # a normal critic folder


@pytest.mark.slow
def test_ddp_actor_matches_inprocess(tiny, actor_reference, tmp_path):
    ref, ref_dir = actor_reference
    lines = []
    got = launch.train_actor(_samples(16), tiny["model"], tmp_path / "ddp", _actor_settings(),
                             critic_dir=tiny["critic"], progress=False, training=DDP, log=lines.append)
    print("\n" + lines[-1])
    assert got["launch"]["distributed_type"] == "MULTI_CPU" and got["n_train"] == 32 and got["steps"] == 32
    # the precompute was split over the ranks and gathered: same critic values and reference log-probs
    assert got["mean_v"] == pytest.approx(ref["mean_v"], abs=1e-6)
    assert got["mean_ref_prob"] == pytest.approx(ref["mean_ref_prob"], rel=1e-5)
    _compare(ref, got, ref_dir, tmp_path / "ddp", tiny["model"])


@pytest.mark.slow
def test_fsdp_actor_runs_end_to_end(tiny, actor_reference, tmp_path):
    ref, ref_dir = actor_reference
    lines = []
    got = launch.train_actor(_samples(16), tiny["model"], tmp_path / "fsdp", _actor_settings(),
                             critic_dir=tiny["critic"], progress=False, training=FSDP, log=lines.append)
    print("\n" + lines[-1])
    assert got["launch"]["distributed_type"] == "FSDP"  # not a silent DDP fallback
    # the full weights were gathered to rank 0 and saved as an ordinary HF folder
    from webrl_core.learn.models import load_causal_lm

    load_causal_lm(tmp_path / "fsdp", _actor_settings().models)
    _compare(ref, got, ref_dir, tmp_path / "fsdp", tiny["model"])


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_failed_rank_fails_the_stage_with_its_error(tiny, tmp_path, monkeypatch):
    monkeypatch.setenv(launch.FAULT_ENV, "1:1")  # rank 1 raises in its 2nd optimizer step; rank 0 waits in all-reduce
    lines = []
    with pytest.raises(LaunchError) as info:
        launch.train_critic(_samples(8, fail_every=4), tiny["model"], tmp_path / "c", _critic_settings(), training=DDP,
                            log=lines.append)
    err = info.value
    assert err.rank == 1 and err.returncode != 0
    assert "rank 1 raised RuntimeError: injected fault on rank 1 at step 1" in str(err)
    assert "--- last lines of rank 1 ---" in str(err) and "Traceback" in str(err)
    assert not (tmp_path / "c" / "heads.safetensors").exists()  # nothing saved
    print(str(err)[:3000])


@pytest.mark.slow
def test_fsdp_orm_saves_the_gathered_model_once(tiny, tmp_path):
    """orm.train_orm saves from every process; under the launcher only rank 0 saves, the FSDP shards gathered."""
    from webrl_core.config import ModelsConfig, OrmConfig

    examples = [{"prompt": build_prompt(f"open item {i}", [], f"<p>{i}</p>"), "completion": "YES" if i % 2 else "NO"}
                for i in range(16)]
    cfg, mcfg = OrmConfig(epochs=2, batch_size=4), ModelsConfig(device="cpu", max_length=256)
    with _OneThread():
        ref = launch.train_orm(examples, tiny["model"], tmp_path / "ref", cfg, mcfg, seed=0, training=INPROC)
    lines = []
    out = launch.train_orm(examples, tiny["model"], tmp_path / "fsdp", cfg, mcfg, seed=0, training=FSDP,
                           log=lines.append)
    assert out == tmp_path / "fsdp" and any(line.endswith("2 process(es), FSDP") for line in lines)
    w_ref, w_got = _weights(ref), _weights(out)
    diff = max((w_ref[k] - w_got[k]).abs().max().item() for k in w_ref)
    assert w_ref.keys() == w_got.keys() and diff < WEIGHT_TOL, diff
    steps = [[h["step"] for h in loss_history.read(d)["history"]] for d in (ref, out)]  # rank 0 wrote its history
    assert steps[0] == steps[1] == list(range(1, 9))  # 16 examples / 4 per step x 2 epochs, one point each

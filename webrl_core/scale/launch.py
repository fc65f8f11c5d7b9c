"""Training launcher: the critic, actor, SFT and ORM trainers in this process or as ``accelerate launch`` jobs.

``training.launcher: inprocess`` (default) calls the trainers directly (``webrl_core.learn``: the actor's
``webrl_trainer.train_actor``, ``critic_trainer.train_critic``, ``sft_trainer.sft_train``, ``orm.train_orm``).
``training.launcher: accelerate`` runs the same function in ``training.num_processes`` ranks::

    <python> -m accelerate.commands.launch --config_file infra/accelerate/<accelerate_config>.yaml \\
        --num_processes N --main_process_port <free port> --tee 3 --log_dir <job>/logs <extra_args> \\
        -m webrl_core.scale.launch <job>/job.json

Artifacts travel by path: the parent writes the samples / pairs / ORM examples as JSONL and a job file (kind,
data path, model dirs, out dir, the resolved settings as JSON) into a temporary job folder; every rank reads the
same data (the Trainer shards it per batch), rank 0 saves the model at ``out_dir`` and writes the metrics JSON,
which the parent returns. Every line of every rank (torchrun prefixes ``[default<rank>]:``) goes to ``log`` as it
is printed (the flows pass the Prefect task logger). A rank that raises writes its traceback to the job folder; the
launch then fails with :class:`LaunchError` naming the first rank that failed, its exception and its last lines.

Configs in ``infra/accelerate/``: ``ddp`` (one replica per process, gradients all-reduced), ``fsdp`` (FSDP2,
parameters, gradients and optimizer state sharded per decoder layer), ``deepspeed_zero3`` (ZeRO-3 with parameter and
optimizer offload to CPU, as the official WebRL run). On a machine without a GPU (``models.device`` resolving to
cpu) the ranks use gloo: DDP works as on GPUs, and FSDP is run by telling accelerate the ranks are GPU-like (it
otherwise refuses FSDP on CPU ranks; torch's FSDP2 itself works on CPU with gloo). DeepSpeed needs GPUs.

Precision: the command passes ``--mixed_precision`` from ``models.dtype`` (float32 -> no, bfloat16 -> bf16,
float16 -> fp16), overriding the config file's ``mixed_precision: 'no'``: the ranks keep float32 master weights
and compute in the low dtype, exactly like the in-process Trainer (``training`` module docstring).

Equivalence with in-process training (measured in tests/scale/test_launch.py): N ranks of micro-batch m and
accumulation g take the same optimizer step as one process with the same global batch (N*m*g samples), because
each rank's loss is a per-micro-batch mean divided by g and DDP averages the ranks' gradients. Identical data
order additionally needs the dataset to fit one ``group_by_length`` megabatch (50 x per-rank batch x g samples)
and a sample count divisible by the global batch (accelerate pads an uneven last batch with samples from the
start, a single process takes a short last batch).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections import deque
from pathlib import Path
from typing import Any, Callable, Sequence

from webrl_core.config import REPO_ROOT, TrainingConfig, accelerate_config_names, accelerate_config_path  # noqa: F401
from webrl_core.hardware import free_port

FAULT_ENV = "WEBRL_LAUNCH_FAULT"  # "<rank>[:<step>]": that rank raises in its training step (tests)
TAIL_LINES = 40

Log = Callable[[str], Any]


class LaunchError(RuntimeError):
    """An accelerate job failed; ``rank`` is the first rank that failed (None: not known), ``tail`` its last lines."""

    def __init__(self, message: str, rank: int | None = None, returncode: int | None = None, tail: str = ""):
        super().__init__(message)
        self.rank, self.returncode, self.tail = rank, returncode, tail


def _training_config(settings, training: TrainingConfig | None) -> TrainingConfig:
    if training is not None:
        return training
    return getattr(settings, "training", None) or TrainingConfig()


# ---------------------------------------------------------------------------------------------
# the public entry points: same signatures as the in-process trainers + training (config) and log

def train_actor(samples: list[dict], actor_dir: str | Path, out_dir: str | Path, settings,
                critic_dir: str | Path | None = None, max_steps: int | None = None, progress: bool = True, *,
                training: TrainingConfig | None = None, log: Log = print) -> dict:
    """``webrl_trainer.train_actor`` (the actor update: its loss and equations are there) in-process or as an
    accelerate job (``training`` defaults to ``settings.training``)."""
    tc = _training_config(settings, training)
    if tc.launcher == "inprocess":
        from webrl_core.learn import webrl_trainer as tr
        return tr.train_actor(samples, actor_dir, out_dir, settings, critic_dir=critic_dir, max_steps=max_steps,
                              progress=progress)
    args = {"actor_dir": actor_dir, "out_dir": out_dir, "critic_dir": critic_dir, "max_steps": max_steps,
            "progress": progress}
    return run_job("actor", samples, args, per_rank_settings(settings, "actor", tc.num_processes), tc, log)


def train_critic(samples: list[dict], backbone_dir: str | Path, out_dir: str | Path, settings,
                 resume: str | Path | None = None, max_steps: int | None = None, *,
                 training: TrainingConfig | None = None, log: Log = print) -> dict:
    """``critic_trainer.train_critic`` in-process or as an accelerate job."""
    tc = _training_config(settings, training)
    if tc.launcher == "inprocess":
        from webrl_core.learn import critic_trainer as tr
        return tr.train_critic(samples, backbone_dir, out_dir, settings, resume=resume, max_steps=max_steps)
    args = {"backbone_dir": backbone_dir, "out_dir": out_dir, "resume": resume, "max_steps": max_steps}
    return run_job("critic", samples, args, per_rank_settings(settings, "critic", tc.num_processes), tc, log)


def sft_train(pairs: list[tuple[str, str]], model_dir: str | Path, out_dir: str | Path, settings,
              max_steps: int | None = None, *, epochs: float | None = None, training: TrainingConfig | None = None,
              log: Log = print) -> dict:
    """``sft_trainer.sft_train`` in-process or as an accelerate job."""
    tc = _training_config(settings, training)
    if tc.launcher == "inprocess":
        from webrl_core.learn import sft_trainer as tr
        return tr.sft_train(pairs, model_dir, out_dir, settings, max_steps=max_steps, epochs=epochs)
    args = {"model_dir": model_dir, "out_dir": out_dir, "max_steps": max_steps, "epochs": epochs}
    return run_job("sft", [list(p) for p in pairs], args, per_rank_settings(settings, "sft", tc.num_processes), tc,
                   log)


def train_orm(examples: Sequence[dict], base_model_dir: str | os.PathLike, out_dir: str | os.PathLike,
              cfg=None, models_cfg=None, seed: int = 0, *, training: TrainingConfig | None = None,
              log: Log = print) -> Path:
    """``orm.train_orm`` in-process or as an accelerate job (``training`` defaults to in-process: the ORM
    call has no settings to read it from)."""
    from webrl_core.config import ModelsConfig, OrmConfig

    tc = training or TrainingConfig()
    if tc.launcher == "inprocess":
        from webrl_core.learn import orm
        return orm.train_orm(examples, base_model_dir, out_dir, cfg, models_cfg, seed=seed)
    settings = {"orm": (cfg or OrmConfig()).model_dump(mode="json"),
                "models": (models_cfg or ModelsConfig()).model_dump(mode="json")}
    settings["orm"]["batch_size"] = _split(settings["orm"]["batch_size"], 1, tc.num_processes, "orm.batch_size",
                                           None)[0]
    run_job("orm", list(examples), {"base_model_dir": base_model_dir, "out_dir": out_dir, "seed": seed}, settings,
            tc, log)
    return Path(out_dir)


def _split(batch: int, accum: int, n: int, batch_field: str, accum_field: str | None) -> tuple[int, int]:
    if batch % n == 0:
        return batch // n, accum
    if accum_field and accum % n == 0:
        return batch, accum // n
    raise ValueError(f"training.num_processes={n} must divide {batch_field}={batch}"
                     + (f" or {accum_field}={accum}" if accum_field else "")
                     + " (batch sizes are global: each rank takes its share of every optimizer step)")


def per_rank_settings(settings, kind: str, n: int) -> dict:
    """The settings JSON each of ``n`` ranks trains with. Batch sizes in the settings are GLOBAL (samples per
    optimizer step, as in-process): each rank gets 1/n of ``actor.batch_size`` (actor, SFT) or
    ``critic.batch_size`` (critic), or of the accumulation steps where the batch does not divide, so the ranks
    together take the optimizer step the single process takes."""
    d = settings.model_dump(mode="json")
    if n <= 1:
        return d
    if kind in ("actor", "sft"):
        a = d["actor"]
        a["batch_size"], a["grad_accum"] = _split(a["batch_size"], a["grad_accum"], n, "actor.batch_size",
                                                  "actor.grad_accum")
        if a.get("micro_batch_size") and a["micro_batch_size"] > a["batch_size"]:
            a["micro_batch_size"] = a["batch_size"]
    elif kind == "critic":
        c = d["critic"]
        c["batch_size"], c["grad_accum"] = _split(c["batch_size"], c["grad_accum"], n, "critic.batch_size",
                                                  "critic.grad_accum")
        if c.get("micro_batch_size") and c["micro_batch_size"] > c["batch_size"]:
            c["micro_batch_size"] = c["batch_size"]
    return d


# ---------------------------------------------------------------------------------------------
# parent side: write the job, launch, stream, collect

MIXED_PRECISION = {"float32": "no", "bfloat16": "bf16", "float16": "fp16"}
"""``accelerate launch --mixed_precision`` for each ``models.dtype`` (``models.mixed_precision_mode``)."""


def mixed_precision_of(settings: dict) -> str | None:
    """The ``--mixed_precision`` of a job's settings JSON (its ``models.dtype``); None without a models section."""
    dtype = (settings.get("models") or {}).get("dtype")
    return MIXED_PRECISION.get(dtype) if dtype else None


def launch_command(tc: TrainingConfig, job_file: Path, log_dir: Path | None = None,
                   mixed_precision: str | None = None) -> list[str]:
    """The ``accelerate launch`` command line of a job. ``mixed_precision`` ('no', 'bf16', 'fp16'; from
    ``models.dtype``) overrides the config file's, so the engine (DDP autocast, FSDP2's MixedPrecisionPolicy,
    DeepSpeed's bf16/fp16 optimizer with float32 masters) always computes in ``models.dtype``, unless
    ``training.extra_args`` names ``--mixed_precision`` itself."""
    cmd = [tc.python or sys.executable, "-m", "accelerate.commands.launch",
           "--config_file", str(accelerate_config_path(tc.accelerate_config)),
           "--num_processes", str(tc.num_processes)]
    own = {a.split("=")[0] for a in tc.extra_args}
    if "--main_process_port" not in own:
        cmd += ["--main_process_port", str(free_port())]
    if mixed_precision is not None and "--mixed_precision" not in own:
        if mixed_precision not in MIXED_PRECISION.values():
            raise ValueError(f"mixed_precision={mixed_precision!r}; allowed: {sorted(set(MIXED_PRECISION.values()))}")
        cmd += ["--mixed_precision", mixed_precision]
    cmd += ["--tee", "3"]  # torchrun: every line of rank r on the console as "[default<r>]:..."
    if log_dir is not None:
        cmd += ["--log_dir", str(log_dir)]
    return cmd + list(tc.extra_args) + ["-m", "webrl_core.scale.launch", str(job_file)]


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    # the ranks import this checkout's webrl_core, whatever the interpreter's site-packages hold
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), *paths])
    env["PYTHONUNBUFFERED"] = "1"  # lines reach the log as they are printed (stdout is a file under --tee)
    env.setdefault("TQDM_MININTERVAL", "10")  # progress bars: one line per 10 s in the task log, not per step
    return env


def _rank_of(line: str) -> tuple[int | None, str]:
    """torchrun --tee prefixes "[<role><local rank>]:"; other lines come from the launcher itself."""
    if line.startswith("[") and "]:" in line:
        head, rest = line[1:].split("]:", 1)
        digits = len(head) - len(head.rstrip("0123456789"))
        if digits:
            return int(head[len(head) - digits:]), rest
    return None, line


def _stop(proc: subprocess.Popen) -> None:
    """Terminate the launcher and its ranks (their own process group), SIGKILL after 15 s."""
    if proc.poll() is not None:
        return
    for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


def run_job(kind: str, data: list, args: dict, settings: dict, tc: TrainingConfig, log: Log = print) -> Any:
    """Run one training job under ``accelerate launch`` and return rank 0's metrics."""
    with tempfile.TemporaryDirectory(prefix=f"webrl-{kind}-") as tmp:
        job_dir = Path(tmp)
        data_file = job_dir / "data.jsonl"
        with open(data_file, "w", encoding="utf-8") as f:
            for row in data:
                f.write(json.dumps(row) + "\n")
        job = {"kind": kind, "data": str(data_file), "settings": settings,
               "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in args.items()},
               "metrics": str(job_dir / "metrics.json"), "errors": str(job_dir / "errors")}
        for k in ("out_dir", "actor_dir", "critic_dir", "backbone_dir", "resume", "model_dir", "base_model_dir"):
            if job["args"].get(k) is not None:
                job["args"][k] = str(Path(job["args"][k]).resolve())
        job_file = job_dir / "job.json"
        job_file.write_text(json.dumps(job))
        cmd = launch_command(tc, job_file, job_dir / "logs", mixed_precision_of(settings))
        log(f"launch {kind}: {' '.join(cmd)}")
        tails: dict[int | None, deque] = {}
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
                                env=_child_env(), start_new_session=True, errors="replace")
        try:
            for line in proc.stdout:
                line = line.rstrip("\n")
                if not line.strip():
                    continue
                log(line)
                rank, text = _rank_of(line)
                if text.strip():
                    tails.setdefault(rank, deque(maxlen=TAIL_LINES)).append(text)
            rc = proc.wait()
        finally:
            _stop(proc)
        wall = time.perf_counter() - t0
        if rc != 0:
            raise _failure(kind, rc, job_dir / "errors", tails, tc)
        metrics_file = Path(job["metrics"])
        if not metrics_file.exists():
            raise LaunchError(f"accelerate {kind} job exited 0 but rank 0 wrote no metrics ({metrics_file})",
                              returncode=rc)
        metrics = json.loads(metrics_file.read_text())
        log(f"launch {kind}: done in {wall:.1f}s, {tc.num_processes} process(es), "
            f"{metrics.get('launch', {}).get('distributed_type')}")
        return metrics


def _failure(kind: str, rc: int, err_dir: Path, tails: dict, tc: TrainingConfig) -> LaunchError:
    errors = []
    for f in sorted(err_dir.glob("rank*.json")) if err_dir.is_dir() else []:
        try:
            errors.append(json.loads(f.read_text()))
        except (OSError, ValueError):
            continue
    if errors:
        first = min(errors, key=lambda e: e["time"])
        rank = first["rank"]
        tail = "\n".join(tails.get(rank, [])) or first["traceback"]
        others = sorted(e["rank"] for e in errors if e is not first)
        msg = (f"accelerate {kind} job failed (exit code {rc}): rank {rank} raised {first['type']}: "
               f"{first['message']}" + (f" (then rank(s) {others} failed too)" if others else "")
               + f"\n--- last lines of rank {rank} ---\n{tail}")
        return LaunchError(msg, rank, rc, tail)
    # a rank killed by a signal (a C++ abort, the OOM killer) raised nothing: its own last lines say why, the
    # launcher's only that it died
    ranks = sorted(k for k in tails if k is not None)
    parts = [f"--- last lines of rank {r} ---\n" + "\n".join(tails[r]) for r in ranks]
    if tails.get(None):
        parts.append("--- last lines of the launcher ---\n" + "\n".join(tails[None]))
    tail = "\n".join(parts)
    return LaunchError(f"accelerate {kind} job failed (exit code {rc}, config {tc.accelerate_config}, "
                       f"{tc.num_processes} processes); no rank reported an exception (killed? out of memory?)\n"
                       f"{tail}", None, rc, tail)


# ---------------------------------------------------------------------------------------------
# rank side: python -m webrl_core.scale.launch job.json

def _init_distributed(device: str) -> None:
    """Initialise accelerate's process state before any trainer does: gloo for CPU ranks (accelerate picks no
    backend at all for CPU ranks started by torchrun unless told ``cpu=True``). With an FSDP config on CPU ranks,
    accelerate would silently fall back to DDP (it enables FSDP only for GPU-like ranks): the ranks are then
    declared GPU-like, which is all FSDP2 needs (its collectives run on gloo)."""
    from accelerate import PartialState
    from accelerate.utils import DistributedType

    from webrl_core.learn.models import resolve_device

    cpu = resolve_device(device).type == "cpu"
    state = PartialState(cpu=cpu)  # CPU ranks: initialises the gloo process group
    if not (cpu and state.distributed_type == DistributedType.MULTI_CPU):
        return
    if os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true":
        raise RuntimeError("the deepspeed_zero3 accelerate config needs GPUs (models.device resolves to cpu)")
    if os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true":
        # TrainingArguments re-creates the state later: from then on CPU ranks report MULTI_GPU (the process group
        # exists already, gloo), so AcceleratorState turns FSDP on; the device stays cpu (ACCELERATE_TORCH_DEVICE)
        os.environ["ACCELERATE_TORCH_DEVICE"] = "cpu"
        original = PartialState._prepare_backend

        def _prepare_backend(self, cpu: bool = False, sagemaker_dp=False, backend=None):
            backend, distributed_type = original(self, cpu, sagemaker_dp, backend)
            if distributed_type == DistributedType.MULTI_CPU:
                distributed_type = DistributedType.MULTI_GPU
            return backend, distributed_type

        PartialState._prepare_backend = _prepare_backend


def _inject_fault() -> None:
    spec = os.environ.get(FAULT_ENV)
    if not spec:
        return
    rank_s, _, step_s = spec.partition(":")
    if int(os.environ.get("RANK", "0")) != int(rank_s):
        return
    from transformers import Trainer

    step = int(step_s or 0)
    original = Trainer.training_step

    def training_step(self, *a, **kw):
        if self.state.global_step >= step:
            raise RuntimeError(f"injected fault on rank {rank_s} at step {self.state.global_step} ({FAULT_ENV})")
        return original(self, *a, **kw)

    Trainer.training_step = training_step


def _read_jsonl(path: str) -> list:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def run_here(job: dict) -> Any:
    """Run one job in this rank (after ``accelerate launch``); returns the trainer's metrics."""
    from webrl_core.config import ModelsConfig, OrmConfig, WebRLSettings

    kind, args = job["kind"], job["args"]
    if kind == "orm":
        models_cfg = ModelsConfig.model_validate(job["settings"]["models"])
        orm_cfg = OrmConfig.model_validate(job["settings"]["orm"])
        device = models_cfg.device
    else:
        settings = WebRLSettings.model_validate(job["settings"])
        device = settings.models.device
    _init_distributed(device)
    _inject_fault()
    data = _read_jsonl(job["data"])
    if kind == "actor":
        from webrl_core.learn import webrl_trainer as tr
        metrics = tr.train_actor(data, settings=settings, **args)
    elif kind == "critic":
        from webrl_core.learn import critic_trainer as tr
        metrics = tr.train_critic(data, settings=settings, **args)
    elif kind == "sft":
        from webrl_core.learn import sft_trainer as tr
        metrics = tr.sft_train([tuple(p) for p in data], settings=settings, **args)
    elif kind == "orm":
        from webrl_core.learn import orm
        from webrl_core.learn import trainer_utils as tr

        # orm.train_orm saves from every process: route its save through the gathering, rank-0 saver
        orm.save_model = tr.distributed_save_model(orm.save_model, args["base_model_dir"], models_cfg)
        out = orm.train_orm(data, args["base_model_dir"], args["out_dir"], orm_cfg, models_cfg, seed=args["seed"])
        metrics = {"out_dir": str(out)}
    else:
        raise ValueError(f"unknown job kind {kind!r}; allowed: actor, critic, sft, orm")
    from accelerate import PartialState
    from accelerate.state import AcceleratorState

    dt = AcceleratorState._shared_state.get("distributed_type") or PartialState().distributed_type
    return {**metrics, "launch": {"distributed_type": getattr(dt, "value", str(dt)),
                                  "num_processes": PartialState().num_processes}}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m webrl_core.scale.launch JOB.json  (under accelerate launch)", file=sys.stderr)
        return 2
    job = json.loads(Path(argv[0]).read_text())
    rank = int(os.environ.get("RANK", "0"))
    try:
        metrics = run_here(job)
        if rank == 0:
            tmp = Path(job["metrics"] + ".tmp")
            tmp.write_text(json.dumps(metrics, default=str))
            tmp.replace(job["metrics"])
        try:
            import torch.distributed as dist
            if dist.is_available() and dist.is_initialized():
                dist.destroy_process_group()
        except Exception:  # noqa: BLE001 - shutting down; the job is done
            pass
        return 0
    except BaseException as e:  # noqa: BLE001 - every failure is reported to the parent, then re-raised
        err_dir = Path(job["errors"])
        err_dir.mkdir(parents=True, exist_ok=True)
        (err_dir / f"rank{rank}.json").write_text(json.dumps(
            {"rank": rank, "time": time.time(), "type": type(e).__name__, "message": str(e)[:2000],
             "traceback": traceback.format_exc()[-8000:]}))
        raise


if __name__ == "__main__":
    sys.exit(main())

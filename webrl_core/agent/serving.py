"""Serving a phase's actor: an OpenAI-compatible engine started for the checkpoint a rollout needs, and stopped after.

Algorithm 1 of the WebRL paper rolls out phase k with actor k-1, and the official pipeline serves each new actor with
vLLM behind an OpenAI-compatible API (``--planner_ip`` of VAB-WebArena-Lite's ``run.py``). ``served_actor`` does
that for one stage:

1. starts the engine from a command template (``serving.command`` or ``config.SERVING_COMMANDS[engine]``: vLLM's
   OpenAI server, SGLang's ``launch_server`` or the project's own HF server ``webrl_core.agent.serve_hf``) with its own
   interpreter (``serving.python``: vLLM lives in a virtual environment of its own, ``infra/setup_vllm.sh``), in a
   process group of its own, its output in ``<run dir>/serving/<engine>-<digest>.log``, on ``serving.port`` or a port
   probed free below the ephemeral range (``hardware.free_port``; taken by another process before the engine bound it,
   the engine starts again on another: ``PORT_ATTEMPTS``);
2. waits until ``GET /v1/models`` answers (and fails at once, with the log's tail, if the engine exits);
3. checks that the engine serves exactly that checkpoint: the name ``serving.served_model_name`` with either the
   checkpoint's digest (``webrl_digest``, our server) or the checkpoint's folder as ``root`` (vLLM, SGLang);
4. stops the whole process group on exit, on failure and on a signal; a guard process stops it too if the stage's
   process is killed with SIGKILL and cannot clean up, so no orphan holds the GPU.

vLLM on a CPU sizes its key/value cache, unless told, at ``--gpu-memory-utilization`` (0.92) of the machine's memory,
allocated and touched at start-up: on a 24 GB box it took 20.3 GiB, and the rollout's own Chromium then timed out
on every reset (docs/benchmarks.md). ``cpu_kv_cache_env`` gives it the ``VLLM_CPU_KVCACHE_SPACE`` (GiB, vLLM's
``platforms/cpu.py``) that the stage's requests can fill, from the checkpoint's config:

    bytes = 2 (K, V) x n_layers x n_kv_heads x head_dim x bytes per element x models.max_length x policy.concurrency

``serving.engine: external`` starts nothing: ``policy.base_url`` must then report the expected checkpoint in the
same way, or the stage fails. The policy identity stored in every episode is ``<engine>:<served name>@hf:<sha256>``
(``served_policy_digest``): the served name and the checkpoint digest the endpoint vouched for.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from webrl_core.artifacts import ArtifactRef
from webrl_core.config import SERVING_COMMANDS
from webrl_core.agent.policy import served_model_card
from webrl_core.learn.model_folder import kv_width
from webrl_core.learn.models import resolve_device, torch_dtype
from webrl_core.hardware import free_port

GUARD_SOURCE = """
import os, signal, sys, time
pgid = int(sys.argv[1])
sys.stdin.buffer.read()  # EOF: the stage's process is gone (or closed the pipe after stopping the engine)
for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 0.0)):
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        break
    end = time.monotonic() + wait
    while time.monotonic() < end:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            sys.exit(0)
        time.sleep(0.2)
"""
"""The guard: a process that outlives a SIGKILLed stage only long enough to stop the engine's process group."""


class ServingError(RuntimeError):
    """The engine did not start, did not answer, or serves something other than the expected checkpoint."""


@dataclass(frozen=True)
class Endpoint:
    """An OpenAI-compatible endpoint serving one checkpoint."""

    base_url: str
    model_name: str
    policy_digest: str
    engine: str


def served_policy_digest(engine: str, model_name: str, actor_ref: ArtifactRef) -> str:
    """The policy identity of episodes acted by ``actor_ref`` served under ``model_name`` by ``engine``."""
    return f"{engine}:{model_name}@hf:{actor_ref.sha256}"


def cpu_kv_cache_gib(model_dir: str | Path, max_length: int, sequences: int, dtype: str) -> int:
    """Whole GiB of keys and values for ``sequences`` requests of ``max_length`` tokens of the checkpoint in
    ``model_dir`` (its ``config.json``), at least 1 (see module docstring)."""
    path = Path(model_dir) / "config.json"
    try:
        cfg = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ServingError(f"{path}: cannot read the model config to size vLLM's CPU KV cache: {e}") from None
    text = cfg.get("text_config") or cfg  # a multimodal checkpoint keeps its decoder's shape there
    try:
        width = kv_width(text)
        layers = int(text["num_hidden_layers"])
    except (KeyError, TypeError, ValueError) as e:
        raise ServingError(f"{path}: no {e} to size vLLM's CPU KV cache; set serving.env "
                           f"VLLM_CPU_KVCACHE_SPACE (GiB) yourself") from None
    total = 2 * layers * width * torch_dtype(dtype).itemsize * max_length * sequences
    return max(1, math.ceil(total / 2**30))


def cpu_kv_cache_env(settings: Any, model_dir: str | Path) -> dict[str, str]:
    """``VLLM_CPU_KVCACHE_SPACE`` for a vLLM engine on a CPU that was given no cache size (``serving.env``, the
    environment, or ``--kv-cache-memory-bytes`` in ``serving.extra_args`` / ``serving.command``); else nothing."""
    sv, models = settings.serving, settings.models
    given = ("VLLM_CPU_KVCACHE_SPACE" in sv.env or "VLLM_CPU_KVCACHE_SPACE" in os.environ
             or any("kv-cache-memory-bytes" in str(a) for a in [*sv.extra_args, sv.command or ""]))
    if sv.engine != "vllm" or given or resolve_device(models.device).type != "cpu":
        return {}
    gib = cpu_kv_cache_gib(model_dir, models.max_length, settings.policy.concurrency, models.dtype)
    return {"VLLM_CPU_KVCACHE_SPACE": str(gib)}


def engine_command(settings: Any, model: str, port: int) -> list[str]:
    """The engine's argv: ``serving.command`` (or the engine's default template) filled in, plus ``extra_args``."""
    sv, models = settings.serving, settings.models
    template = sv.command or SERVING_COMMANDS.get(sv.engine)
    if not template:
        raise ServingError(f"serving.engine={sv.engine!r} has no default command; set serving.command")
    values = {"python": sv.python or sys.executable, "model": model, "host": sv.host, "port": port,
              "served_model_name": sv.served_model_name, "dtype": models.dtype, "device": models.device,
              "max_length": models.max_length, "seed": settings.run.seed}
    try:
        text = template.format(**{k: shlex.quote(str(v)) for k, v in values.items()})
    except (KeyError, IndexError) as e:
        raise ServingError(f"serving.command {template!r}: unknown placeholder {e}; allowed: "
                           f"{', '.join('{' + k + '}' for k in values)}") from None
    return shlex.split(text) + [str(a) for a in sv.extra_args]


def _log_tail(path: Path, n: int = 25) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join(lines[-n:])


def verify_endpoint(base_url: str, model_name: str, actor_ref: ArtifactRef, api_key_env: str = "OPENAI_API_KEY",
                    timeout_s: float = 10.0) -> None:
    """Fail unless ``base_url`` serves ``model_name`` as the checkpoint ``actor_ref``: its card reports the
    checkpoint's digest (``webrl_digest``) or its folder (``root``, what vLLM and SGLang report)."""
    card = served_model_card(base_url, model_name, api_key_env, timeout_s)
    digest, root = card.get("webrl_digest"), card.get("root")
    if digest is not None:
        if digest != actor_ref.sha256:
            raise ServingError(f"{base_url} serves {model_name!r} with digest {str(digest)[:16]}..., but the actor "
                               f"is {actor_ref.path} ({actor_ref.sha256[:16]}...)")
        return
    if root and Path(str(root)).expanduser().resolve() == Path(actor_ref.path).resolve():
        return
    raise ServingError(f"{base_url} serves {model_name!r} from {root!r}, not the actor checkpoint {actor_ref.path}: "
                       f"serve that folder (or use a managed serving.engine) so its episodes are the actor's")


@contextlib.contextmanager
def served_actor(settings: Any, actor_ref: ArtifactRef, run_dir: str | Path) -> Iterator[Endpoint]:
    """An endpoint serving ``actor_ref`` for the block (see module docstring)."""
    sv = settings.serving
    if sv.engine == "external":
        base_url, name = settings.policy.base_url, settings.policy.model_name or sv.served_model_name
        if not base_url:
            raise ServingError("serving.engine=external needs policy.base_url (the endpoint that serves the actor)")
        verify_endpoint(base_url, name, actor_ref, settings.policy.api_key_env)
        yield Endpoint(base_url.rstrip("/"), name, served_policy_digest("external", name, actor_ref), "external")
        return
    log_dir = Path(run_dir) / "serving"
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{sv.engine}-{actor_ref.sha256[:12]}.log"
    sized = cpu_kv_cache_env(settings, actor_ref.path)  # logged; serving.env is not (it may hold secrets)
    host = f"[{sv.host}]" if ":" in sv.host else sv.host
    for attempt in range(1 if sv.port else PORT_ATTEMPTS):
        port = sv.port or free_port(sv.host)
        base_url = f"http://{host}:{port}/v1"
        proc, guard, started_at = _start_engine(settings, actor_ref, port, log_path, sized)
        try:
            _wait_until_serving(proc, base_url, sv, log_path)
            break
        except ServingError:
            _stop_engine(proc, guard)
            # a port picked free can be taken before the engine binds it (another process probed it too)
            if sv.port or attempt == PORT_ATTEMPTS - 1 or not _port_taken(log_path, started_at):
                raise
        except BaseException:
            _stop_engine(proc, guard)
            raise
    try:
        verify_endpoint(base_url, sv.served_model_name, actor_ref)
        yield Endpoint(base_url, sv.served_model_name,
                       served_policy_digest(sv.engine, sv.served_model_name, actor_ref), sv.engine)
    finally:
        _stop_engine(proc, guard)


PORT_ATTEMPTS = 3
"""Starts of an engine on a port picked free, each on a new one, while the last failed with its port taken."""


def _start_engine(settings: Any, actor_ref: ArtifactRef, port: int, log_path: Path, sized: dict
                  ) -> tuple[subprocess.Popen, subprocess.Popen, int]:
    """The engine serving ``actor_ref`` on ``port``, its output appended to ``log_path`` (from byte ``started_at``),
    and its guard process."""
    sv = settings.serving
    argv = engine_command(settings, str(Path(actor_ref.path).resolve()), port)
    with open(log_path, "ab") as log:
        started_at = log.tell()
        set_env = "".join(f"{k}={v} " for k, v in sized.items())
        log.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} {set_env}{shlex.join(argv)}\n".encode())
        log.flush()
        try:
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env={**os.environ, **sized, **sv.env}, start_new_session=True)
        except OSError as e:
            raise ServingError(f"serving.engine={sv.engine}: cannot start {argv[0]!r}: {e.strerror or e}") from None
    guard = subprocess.Popen([sys.executable, "-c", GUARD_SOURCE, str(proc.pid)], stdin=subprocess.PIPE,
                             start_new_session=True)
    return proc, guard, started_at


def _stop_engine(proc: subprocess.Popen, guard: subprocess.Popen) -> None:
    stop_process_group(proc)
    guard.stdin.close()  # the guard finds the group gone and exits
    with contextlib.suppress(subprocess.TimeoutExpired):
        guard.wait(timeout=15)


def _port_taken(log_path: Path, started_at: int) -> bool:
    """Whether the engine started at byte ``started_at`` of its log failed to bind its port (uvicorn, which vLLM,
    SGLang and our server run: "[Errno 98] ... address already in use")."""
    try:
        with open(log_path, "rb") as f:
            f.seek(started_at)
            return b"address already in use" in f.read().lower()
    except OSError:
        return False


def _wait_until_serving(proc: subprocess.Popen, base_url: str, sv: Any, log_path: Path) -> None:
    deadline = time.monotonic() + sv.startup_timeout_s
    while True:
        if proc.poll() is not None:
            raise ServingError(f"serving.engine={sv.engine} exited with code {proc.returncode} before serving "
                               f"(log {log_path}):\n{_log_tail(log_path)}")
        with contextlib.suppress(RuntimeError):
            served_model_card(base_url, sv.served_model_name, timeout_s=5.0)
            return
        if time.monotonic() > deadline:
            raise ServingError(f"serving.engine={sv.engine} did not serve {base_url}/models within "
                               f"serving.startup_timeout_s={sv.startup_timeout_s:g}s (log {log_path}):\n"
                               f"{_log_tail(log_path)}")
        time.sleep(1.0)


def stop_process_group(proc: subprocess.Popen, grace_s: float = 20.0) -> None:
    """SIGTERM the engine's process group, SIGKILL what is left after ``grace_s``; waits for the leader."""
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        end = time.monotonic() + wait
        while time.monotonic() < end:
            proc.poll()
            try:
                os.killpg(proc.pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.2)
        else:
            continue
        break
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)

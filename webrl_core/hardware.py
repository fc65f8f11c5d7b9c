"""The machine a run is on: the precision it computes in when ``models.dtype`` is ``auto`` (chosen from what the
hardware is fast at), the rates it runs at now (``matmul_peak_flops``, ``copy_bandwidth``), and free TCP ports for the
servers a run starts in other processes (``free_port``).

- CUDA (``models.device`` auto or cuda, a GPU present): bfloat16 where the GPU supports it, else float16.
- CPU: bfloat16 when the processor has native bf16 matrix instructions (``amx_bf16`` or ``avx512_bf16`` in its
  flags), where bf16 matmuls run several times faster than float32; float32 otherwise, because without them
  PyTorch emulates bf16 and runs it far slower than float32 (measured on an AVX2-only EPYC: 102 GFLOP/s float32,
  about 1 GFLOP/s bf16).

Training always keeps float32 master weights under bf16 autocast (``webrl_core.learn.models``); inference loads in the
chosen dtype.

Ports (an inference engine, the accelerate job's rendezvous store, a Ray node, the MLflow or Prefect server of a
test): a probe binds a port and releases it, so the port stays free only until somebody else binds it. A port from
the kernel's ephemeral range (Linux: ``/proc/sys/net/ipv4/ip_local_port_range``, 32768-60999 by default) can be
taken in that window by any socket the kernel numbers itself: another probe's bind to port 0, a gloo rank's
listener, or the source port of any outgoing connection, of which a test run or a rollout with browsers opens many a
second. A port below that range is only ever taken by a process that names it, which is why torchrun's default
(29500) lies there. So ``free_port`` draws from ``[PORT_LOW, ephemeral start)``: above Ray's default worker ports
(10002-19999), below the ephemeral range, with its own random generator (the global RNG untouched). Where the range
cannot be read (not Linux) or no drawn port is free, it falls back to the kernel's choice (bind to port 0).
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import os
import random
import socket
import time
from pathlib import Path

BF16_CPU_FLAGS = ("amx_bf16", "avx512_bf16")


def cpuinfo_fields(text: str) -> dict[str, str]:
    """The first processor's ``key: value`` fields of a ``/proc/cpuinfo`` text."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            if fields:  # the first processor's block ends at its blank line
                break
            continue
        fields.setdefault(key.strip(), value.strip())
    return fields


@functools.cache
def _this_cpu() -> dict[str, str]:
    """This machine's ``cpuinfo_fields`` (Linux ``/proc/cpuinfo``; empty elsewhere)."""
    try:
        return cpuinfo_fields(Path("/proc/cpuinfo").read_text())
    except OSError:
        return {}


def cpu_flags() -> frozenset[str]:
    """The processor's feature flags (Linux ``/proc/cpuinfo``; empty elsewhere)."""
    return frozenset(_this_cpu().get("flags", "").split())


def cpu_summary(cpuinfo: str | None = None) -> str:
    """The CPU in one phrase for benchmark figures and the keys of the box's kept measurements: model, family and
    model number, cores, and which bf16 path it has ("AMD EPYC (family 25, model 17), 2 cores, avx512_bf16").
    A virtual machine may name only the vendor's line: boxes named "AMD EPYC" with ``avx512_bf16`` ran a bf16
    matmul at 405-480 GFLOP/s a core in some sessions and at about 215 in another (family 25, model 17; docs/
    benchmarks.md), so the family and model numbers keep their figures and kept measurements apart.
    ``cpuinfo``: the text of a ``/proc/cpuinfo`` (this machine's when None)."""
    fields = _this_cpu() if cpuinfo is None else cpuinfo_fields(cpuinfo)
    name = fields.get("model name", "") or "unknown CPU"
    if fields.get("cpu family") and fields.get("model"):
        name += f" (family {fields['cpu family']}, model {fields['model']})"
    flags = set(fields.get("flags", "").split())
    bf16 = sorted(set(BF16_CPU_FLAGS) & flags)
    path = ", ".join(bf16) if bf16 else ("AVX2 only (bf16 emulated)" if "avx2" in flags else "no AVX2")
    return f"{name}, {os.cpu_count()} cores, {path}"


def device_summary(device: str) -> str:
    """The machine a figure was measured on: the GPU's name on CUDA ("NVIDIA H200"), else ``cpu_summary()``."""
    bf16 = _cuda_bf16(device)
    if bf16 is None:
        return cpu_summary()
    import torch

    return f"{torch.cuda.get_device_name()}, bf16" if bf16 else torch.cuda.get_device_name()


def _may_have_cuda() -> bool:
    """False when CUDA is certainly absent: a CPU build of torch ("+cpu"), or no NVIDIA driver on the machine. It
    spares importing torch (seconds) to learn that, so a command that refuses bad input does so at once."""
    try:
        if importlib.metadata.version("torch").endswith("+cpu"):
            return False
    except importlib.metadata.PackageNotFoundError:
        return False
    # /dev/dxg: the GPU of WSL2, where CUDA runs without /dev/nvidia*
    return Path("/proc/driver/nvidia").exists() or Path("/dev/dxg").exists() or any(Path("/dev").glob("nvidia*"))


def _cuda_bf16(device: str) -> bool | None:
    """None when the run is not on CUDA; else whether the GPU supports bf16."""
    if device == "cpu" or not (device == "auto" or device.startswith("cuda")):
        return None
    if importlib.util.find_spec("torch") is None or not _may_have_cuda():
        return None
    import torch

    if not torch.cuda.is_available():
        return None
    return bool(torch.cuda.is_bf16_supported())


CPU_DTYPE_ENV = "WEBRL_CPU_DTYPE"
"""Environment variable that fixes ``auto``'s CPU choice (``float32`` or ``bfloat16``) whatever the flags: the test
suite sets ``float32`` so that its exact comparisons mean the same on every box (tests/conftest.py)."""


def auto_dtype(device: str = "auto", flags: frozenset[str] | None = None) -> tuple[str, str]:
    """(dtype name, why) for ``models.dtype: auto`` on ``models.device``."""
    cuda = _cuda_bf16(device)
    if cuda is not None:
        return ("bfloat16", "CUDA GPU with bf16") if cuda else ("float16", "CUDA GPU without bf16")
    forced = os.environ.get(CPU_DTYPE_ENV)
    if forced and flags is None:
        if forced not in ("float32", "bfloat16"):
            raise ValueError(f"{CPU_DTYPE_ENV}={forced!r}: expected float32 or bfloat16")
        return forced, f"{CPU_DTYPE_ENV}={forced}"
    have = sorted(set(BF16_CPU_FLAGS) & (cpu_flags() if flags is None else flags))
    if have:
        return "bfloat16", f"CPU has {', '.join(have)}"
    return "float32", f"CPU has neither {' nor '.join(BF16_CPU_FLAGS)} (bf16 would be emulated)"


def synchronize(device: str) -> None:
    """Wait for the device's queued work (a GPU's kernels run after the call that launched them); nothing on a CPU."""
    if device != "cpu":
        import torch

        torch.cuda.synchronize()


PEAK_MATMUL_N = {"cpu": 2048, "cuda": 8192}
"""The side of the square matmul whose rate is a device's peak: large enough to reach the matrix units' rate (a
2048 x 2048 bf16 product runs at the rate of larger ones on the CPUs measured, docs/benchmarks.md) and small enough
to take about a second."""


def matmul_peak_flops(dtype=None, device: str = "cpu", n: int | None = None, reps: int = 5, rounds: int = 3
                      ) -> float:
    """The device's matmul peak now: the best FLOP/s (2 n^3 per product) of ``rounds`` rounds of ``reps`` n x n
    products in ``dtype`` (float32 when None; n: ``PEAK_MATMUL_N`` of the device's type). The share of the peak a
    stage reaches is measured against it, on the same box and in the same run: a box's rate moves between hours
    (the 2-core EPYCs of docs/benchmarks.md ran it at 210-437 GFLOP/s in one session)."""
    import torch

    dtype = dtype or torch.float32
    n = n or PEAK_MATMUL_N[torch.device(device).type]
    gen = torch.Generator(device).manual_seed(0)  # its own: a stage's draws stay as they were
    a, b = (torch.randn(n, n, device=device, dtype=dtype, generator=gen) for _ in range(2))
    torch.matmul(a, b)  # warm-up
    best = 0.0
    for _ in range(rounds):
        synchronize(device)
        t = time.perf_counter()
        for _ in range(reps):
            torch.matmul(a, b)
        synchronize(device)
        best = max(best, 2 * n ** 3 * reps / (time.perf_counter() - t))
    return best


COPY_MB = {"cpu": 64, "cuda": 2048}
"""The size in MB of the copy whose rate is a device's copy bandwidth: several times its caches (a 64 MB copy on an
H200 measures its 60 MB L2 cache, not its memory)."""


def copy_bandwidth(mb: int | None = None, rounds: int = 5, dtype=None, device: str = "cpu") -> float:
    """The device's copy bandwidth now: the best bytes/s (read + written) of ``rounds`` ``dst.copy_(src)`` of ``mb``
    MB (``COPY_MB`` of the device's type) in ``dtype`` (float32 when None). Beside ``matmul_peak_flops`` it tells a
    slow hour that moves bytes slowly from one whose matrix units are slow. Draws no random numbers."""
    import torch

    dtype = dtype or torch.float32
    mb = mb or COPY_MB[torch.device(device).type]
    n = mb * 2 ** 20 // torch.tensor([], dtype=dtype).element_size()
    src, dst = torch.ones(n, dtype=dtype, device=device), torch.empty(n, dtype=dtype, device=device)
    dst.copy_(src)  # warm-up: the pages are touched
    best = 0.0
    for _ in range(rounds):
        synchronize(device)
        t = time.perf_counter()
        dst.copy_(src)
        synchronize(device)
        best = max(best, 2 * src.numel() * src.element_size() / (time.perf_counter() - t))
    return best


PORT_LOW = 20_000
"""The lowest port drawn: above Ray's worker ports (``--min-worker-port`` 10002 .. ``--max-worker-port`` 19999)."""
PORT_TRIES = 64
EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_PORT_RNG = random.Random()  # seeded from os.urandom; a run's torch/numpy/random seeds do not pick its ports


def ephemeral_start(path: Path | None = None) -> int | None:
    """The first port the kernel hands out by itself (``path``: the range file), or None where that is not known."""
    try:
        return int((path or EPHEMERAL_RANGE_FILE).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _bindable(host: str, port: int) -> socket.socket | None:
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind((host, port))
        return sock
    except OSError:
        sock.close()
        return None


def _held_ports(n: int, host: str) -> list[socket.socket]:
    """``n`` sockets bound to distinct free ports (the module docstring's "Ports"), still open."""
    held: list[socket.socket] = []
    top = ephemeral_start()
    try:
        if top is not None and top - PORT_LOW > 4 * n:
            for port in _PORT_RNG.sample(range(PORT_LOW, top), min(top - PORT_LOW, PORT_TRIES + n)):
                if len(held) == n:
                    break
                sock = _bindable(host, port)
                if sock is not None:
                    held.append(sock)
        while len(held) < n:  # the kernel's choice
            sock = _bindable(host, 0)
            if sock is None:
                raise OSError(f"no free TCP port on {host}")
            held.append(sock)
        return held
    except BaseException:
        for s in held:
            s.close()
        raise


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """``n`` distinct ports free on ``host`` now, outside the ephemeral range where it is known."""
    held = _held_ports(n, host)
    ports = [s.getsockname()[1] for s in held]
    for s in held:
        s.close()
    return ports


def free_port(host: str = "127.0.0.1") -> int:
    """A port free on ``host`` now, outside the ephemeral range where it is known (the module docstring's "Ports")."""
    return free_ports(1, host)[0]

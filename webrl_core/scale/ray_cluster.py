"""The local Ray cluster: ``ray start`` processes on this machine's loopback addresses (``LocalRayCluster``), the
token authentication of the clusters this process starts (``local_auth_env``), and free ports for them.

``LocalRayCluster`` is the cluster ``rollout.engine: ray`` starts when the config names no address
(``ray_rollout.ray_connection``: one node, stopped when the last user leaves) and the several-node cluster of the
tests and ``webrl bench rollout --engine ray``. Its nodes are ``ray start --block`` processes, each in its own
process group (head on 127.0.0.2, node k on 127.0.0.{k+2}; Ray would put 127.0.0.1 on the network), each with
explicit ports so that two clusters on one machine never collide; ``stop()`` ends them and their workers. A node
whose agents miss the raylet's fixed 15 s start-up window on a loaded machine is started again. Nothing here
imports Ray at import time.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from webrl_core.hardware import free_ports

log = logging.getLogger("webrl.ray")

# Ray replaces 127.0.0.1 (and "localhost") by the machine's routable address, which would put a local cluster
# on the network; other loopback addresses keep it on this machine.
LOCAL_CLUSTER_IP = "127.0.0.2"

_token: dict[str, str] = {}


def local_auth_env() -> dict[str, str]:
    """Token authentication for the clusters this process starts: one random token per process (Ray's C++
    side caches the token a process first uses), also set in this process' environment for its driver."""
    if "token" not in _token:
        _token["token"] = os.environ.get("RAY_AUTH_TOKEN") or secrets.token_hex(32)
    env = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": _token["token"]}
    if any(os.environ.get(k) != v for k, v in env.items()):
        os.environ.update(env)
        if "ray" in sys.modules:  # Ray read its config when imported: make it read the mode again (as ray.init does)
            from ray._raylet import Config

            Config.initialize("")
    return env


class LocalRayCluster:
    """Ray nodes as ``ray start --block`` processes on this machine (head on 127.0.0.2, node k on 127.0.0.{k+2}),
    each in its own process group, with token authentication (``local_auth_env``): the local cluster of
    ``rollout.engine: ray`` without an address, tests and benchmarks. ``stop()`` ends them all (and their
    workers); ``num_cpus`` None: Ray counts the machine's cores."""

    # The raylet gives its Python agents a fixed 15 s to report their ports and aborts when they miss it (Ray
    # 2.60, not configurable); a loaded 2-core machine sometimes does: such a start is tried again.
    START_ATTEMPTS = 3

    def __init__(self, num_cpus: int | None = None, temp_dir: str | Path | None = None,
                 start_timeout_s: float = 180) -> None:
        self.num_cpus = num_cpus
        self._own_tmp = temp_dir is None
        self.temp_dir = Path(temp_dir or tempfile.mkdtemp(prefix="webrl-ray-"))
        self.start_timeout_s = start_timeout_s
        self.nodes: list[dict] = []  # {"proc", "ip", "log", "node_id"}
        self.port: int | None = None

    @property
    def address(self) -> str:
        return f"{LOCAL_CLUSTER_IP}:{self.port}"

    def _ray(self) -> str:
        exe = Path(sys.executable).with_name("ray")
        return str(exe) if exe.exists() else "ray"

    def _launch(self, args: list[str], ip: str, resources: str | None) -> dict:
        dash, agent, agent_grpc, rt_env, metrics = free_ports(5)
        k = len(self.nodes)
        log_path = self.temp_dir / f"node{k}.log"
        # explicit ports: two clusters on one machine (other users, parallel tests) never collide on defaults
        cmd = [self._ray(), "start", "--block", *args, f"--node-ip-address={ip}",
               "--disable-usage-stats", f"--dashboard-agent-listen-port={agent}",
               f"--dashboard-agent-grpc-port={agent_grpc}", f"--runtime-env-agent-port={rt_env}",
               f"--metrics-export-port={metrics}"]
        if k == 0:
            cmd += ["--include-dashboard=false", f"--dashboard-port={dash}", f"--temp-dir={self.temp_dir}"]
        if self.num_cpus is not None:
            cmd.append(f"--num-cpus={int(self.num_cpus)}")
        if resources:
            cmd.append(f"--resources={resources}")
        env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", **local_auth_env())
        env.pop("RAY_ADDRESS", None)
        with open(log_path, "ab") as out:
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                    start_new_session=True)
        node = {"proc": proc, "ip": ip, "log": log_path, "node_id": None}
        deadline = time.monotonic() + self.start_timeout_s
        while True:
            text = log_path.read_text(errors="replace")
            if "Ray runtime started" in text:
                break
            if proc.poll() is not None or time.monotonic() > deadline:
                self._kill(node)
                raise RuntimeError(f"ray node {k} ({ip}) did not start (exit {proc.poll()}):\n{text[-3000:]}")
            time.sleep(0.5)
        node["node_id"] = self._node_id(node)
        self.nodes.append(node)
        return node

    def start(self, resources: str | None = None) -> "LocalRayCluster":
        """Start the head node (its GCS on 127.0.0.2:<free port>)."""
        if self.nodes:
            return self
        self.temp_dir.mkdir(parents=True, exist_ok=True)
        for attempt in range(self.START_ATTEMPTS):
            self.port = free_ports(1)[0]
            try:
                self._launch(["--head", f"--port={self.port}"], LOCAL_CLUSTER_IP, resources)
                return self
            except RuntimeError as e:
                if attempt == self.START_ATTEMPTS - 1:
                    self.stop()
                    raise
                log.warning("ray head did not start; trying again: %s", str(e)[-600:])
        return self

    def add_node(self, resources: str | None = None) -> dict:
        """Start one more node that joins the head; returns ``{"ip", "node_id", "proc", "log"}``."""
        if not self.nodes:
            raise RuntimeError("start() the head first")
        ip = f"127.0.0.{len(self.nodes) + 2}"
        for attempt in range(self.START_ATTEMPTS):
            try:
                return self._launch([f"--address={self.address}"], ip, resources)
            except RuntimeError as e:
                if attempt == self.START_ATTEMPTS - 1:
                    raise
                log.warning("ray node %s did not start; trying again: %s", ip, str(e)[-600:])
        raise AssertionError("unreachable")

    def _descendants(self, pid: int) -> list[int]:
        import psutil

        try:
            return [c.pid for c in psutil.Process(pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def raylet_pid(self, k: int) -> int | None:
        """PID of node k's raylet."""
        import psutil

        for pid in self._descendants(self.nodes[k]["proc"].pid):
            try:
                p = psutil.Process(pid)
                if p.name() == "raylet" or "raylet/raylet" in " ".join(p.cmdline()[:1]):
                    return pid
            except psutil.NoSuchProcess:
                continue
        return None

    def _node_id(self, node: dict) -> str | None:
        import psutil

        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            for pid in self._descendants(node["proc"].pid):
                try:
                    cmd = " ".join(psutil.Process(pid).cmdline())
                except psutil.NoSuchProcess:
                    continue
                m = re.search(r"--node_id=([0-9a-f]+)", cmd) if "raylet" in cmd else None
                if m:
                    return m.group(1)
            time.sleep(0.2)
        return None

    def processes(self, k: int) -> list[int]:
        """Every live process of node k: its ``ray start``, raylet, GCS, workers and what they started."""
        return [self.nodes[k]["proc"].pid, *self._descendants(self.nodes[k]["proc"].pid)]

    def _kill(self, node: dict, grace_s: float = 5) -> None:
        proc = node["proc"]
        try:
            pgid = os.getpgid(proc.pid)
        except ProcessLookupError:
            pgid = None
        if pgid is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(grace_s)
        if pgid is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGKILL)  # workers and their children (browsers, sites) share the group
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(10)

    def stop(self) -> None:
        for node in reversed(self.nodes):
            self._kill(node)
        self.nodes = []
        if self._own_tmp:
            shutil.rmtree(self.temp_dir, ignore_errors=True)

    def __enter__(self) -> "LocalRayCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

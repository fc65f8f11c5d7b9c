"""Rollouts on a Ray cluster (``rollout.engine: ray``): the phase's episodes run as Ray tasks across machines.

Contract (``run_on_ray``; the stage ``pipeline.experience.rollout`` calls it for the episodes it has not stored yet):

* the driver (the stage's process) joins the cluster at ``rollout.ray_address``, else ``RAY_ADDRESS``, else it
  starts a single-node local cluster (``LocalRayCluster``: ``ray start`` on a loopback address, token
  authentication) and stops it at the end; a driver that is already connected (``ray.is_initialized()``) is
  used as it is and left connected;
* the (task, attempt) jobs are cut into shards of ``rollout.shard_size`` episodes, one Ray task each
  (``num_cpus=rollout.cpus_per_shard``, ``max_retries=rollout.retries``, SPREAD over the nodes). A shard owns
  its browser pool (the rollout engine with ``env.n_envs``) and, for the embedded sites, its own sites server
  on the worker's loopback (``sites.session.site_session``); nothing of the run dir is needed on the workers;
* the policy: scripted ones (oracle, random) are made in each shard; ``policy.backend: openai`` talks to its
  endpoint from every shard; ``policy.backend: hf`` is either served once by the driver (``policy_serving:
  shared``: the project's ``policy.openai_app`` under uvicorn on ``rollout.policy_host``, verified through
  ``/v1/models`` to serve the checkpoint whose digest is in the episode keys) or loaded by every shard from the
  checkpoint's path (``per_shard``: the path must exist on every node, i.e. a shared run dir);
* every episode a shard finishes is pushed at once to a collector actor on the driver's node; the driver
  drains it about twice a second and writes what arrived into ``TrajectoryStore(run_dir)``: the store has one
  writer, and each episode reaches it exactly once (the collector keeps the first push of an episode id);
* a worker or node that dies mid-shard: Ray runs the shard again elsewhere (up to ``rollout.retries`` times);
  the new attempt asks the collector which of its episodes are in and runs only the others, so finished
  episodes are kept as they were and nothing is doubled (episode ids are content identities:
  ``webrl_core.identity``);
* episodes record ``node = <hostname>/<node ip>/ray:<node id[:12]>`` (``node_label``);
* a shard that fails for good (an exception of its own, or its retries used up) fails the call after every
  episode that did arrive is stored; the stage's resume re-runs only the missing ones.

``LocalRayCluster`` (``scale/ray_cluster.py``) starts a cluster of ``ray start`` processes on this machine's
loopback addresses (the local default above; several nodes for tests and ``webrl bench rollout --engine ray``).
Nothing here imports Ray at import time, nor the config module: ``RolloutConfig`` is part of every config.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any, Iterator


from webrl_core.config import RolloutConfig
from webrl_core.prompts import prompt_format
from webrl_core.scale.ray_cluster import LocalRayCluster

SERVED_MODEL_NAME = "webrl-embedded"
SCRIPTED = ("oracle", "random")


# ----------------------------------------------------------------------------------------- connection
_conn_lock = threading.Lock()
_conn: dict[str, Any] = {"users": 0, "owned": False, "cluster": None}


def resolve_address(cfg: RolloutConfig) -> str | None:
    """The cluster to join: ``rollout.ray_address``, else ``RAY_ADDRESS``; None: start a local one."""
    return cfg.ray_address or os.environ.get("RAY_ADDRESS") or None


@contextlib.contextmanager
def ray_connection(cfg: RolloutConfig) -> Iterator[dict]:
    """Connect this process to the cluster for the block (reference-counted across threads). Without an
    address, a single-node local cluster (``LocalRayCluster``, loopback) is started and stopped when the last
    user leaves. A driver that is already connected is used as it is and left connected."""
    import ray

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    with _conn_lock:
        if _conn["users"] == 0 and not ray.is_initialized():
            address = resolve_address(cfg)
            if not address:
                cluster = LocalRayCluster().start()
                _conn["cluster"], address = cluster, cluster.address
            try:
                # log_to_driver off: the workers' and raylets' logs stay in each node's Ray session folder (a
                # shard's failure still arrives as its exception)
                ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False)
            except BaseException:
                if _conn["cluster"] is not None:
                    _conn["cluster"].stop()
                    _conn["cluster"] = None
                raise
            _conn["owned"] = True
        _conn["users"] += 1
    try:
        cluster = _conn["cluster"]
        yield {"address": cluster.address if cluster else resolve_address(cfg) or "(connected before)",
               "owned": _conn["owned"], "local_cluster_dir": str(cluster.temp_dir) if cluster else None}
    finally:
        with _conn_lock:
            _conn["users"] -= 1
            if _conn["users"] == 0 and _conn["owned"]:
                try:
                    ray.shutdown()
                finally:
                    _conn["owned"] = False
                    if _conn["cluster"] is not None:
                        _conn["cluster"].stop()
                        _conn["cluster"] = None


def node_label() -> str:
    """What an episode records as its node inside a Ray worker: ``<hostname>/<node ip>/ray:<node id[:12]>``."""
    import ray

    return (f"{socket.gethostname()}/{ray.util.get_node_ip_address()}/"
            f"ray:{ray.get_runtime_context().get_node_id()[:12]}")


# ----------------------------------------------------------------------------------------- collector
class _Collector:
    """Ray actor on the driver's node: the episodes shards finished, each id once, until the driver drains them."""

    def __init__(self) -> None:
        self.seen: set[str] = set()
        self.new: list[tuple[dict, list[dict]]] = []
        self.starts: list[tuple[int, str]] = []
        self.dropped = 0

    def start(self, shard: int, node: str, ids: list[str]) -> list[str]:
        """A shard attempt begins on ``node``: the ids of its episodes that are already in."""
        self.starts.append((shard, node))
        return [i for i in ids if i in self.seen]

    def push(self, episode: dict, steps: list[dict]) -> bool:
        eid = episode["episode_id"]
        if eid in self.seen:  # a shard re-run that raced its first attempt: the first one stays
            self.dropped += 1
            return False
        self.seen.add(eid)
        self.new.append((episode, steps))
        return True

    def drain(self) -> list[tuple[dict, list[dict]]]:
        out, self.new = self.new, []
        return out

    def stats(self) -> dict:
        return {"starts": list(self.starts), "dropped_duplicates": self.dropped, "received": len(self.seen)}


class _CollectorSink:
    """What the rollout engine writes finished episodes to inside a shard (``store.write_episode`` protocol)."""

    def __init__(self, collector) -> None:
        self.collector = collector

    def write_episode(self, episode: dict, steps: list[dict] | None = None) -> bool:
        import ray

        return ray.get(self.collector.push.remote(episode, list(steps or [])))


# ----------------------------------------------------------------------------------------- shards (workers)
def _worker_policy(spec: dict):
    settings, purpose, temperature = spec["settings"], spec["purpose"], spec["temperature"]
    served = spec["policy"]
    if served is not None:
        from webrl_core.agent.policy import OpenAIPolicy

        return OpenAIPolicy(served["base_url"], served["model_name"], cfg=settings.policy, temperature=temperature,
                            style=settings.prompt.style, compat=prompt_format(settings),
                            policy_id=served["policy_id"])
    from webrl_core.agent.rollout_policy import make_policy

    actor_ref = spec["actor_ref"]
    backend = settings.policy.backend if purpose not in SCRIPTED else purpose
    if backend == "hf" and actor_ref is not None and not Path(actor_ref.path).exists():
        raise FileNotFoundError(
            f"rollout.policy_serving=per_shard: the checkpoint {actor_ref.path} does not exist on node "
            f"{node_label()}; share the run dir at the same path on every node, or use policy_serving=shared")
    return make_policy(settings, actor_ref, temperature, purpose)


def _run_shard(spec: dict, shard: int, jobs: list[tuple[dict, int, str]], collector) -> dict:
    """One Ray task: run the shard's episodes that are not in yet, pushing each to the collector as it ends."""
    import ray

    from webrl_core.env.judge import judge_from_settings
    from webrl_core.env.rollout import run_rollout
    from webrl_core.sites.session import site_session

    settings = spec["settings"]
    node = node_label()
    done = set(ray.get(collector.start.remote(shard, node, [j[2] for j in jobs])))
    todo = [j for j in jobs if j[2] not in done]
    out = {"shard": shard, "node": node, "pid": os.getpid(), "ran": len(todo), "kept": len(done)}
    if not todo:
        return out
    policy = _worker_policy(spec)
    t0 = time.perf_counter()
    with site_session(settings) as hooks:
        eps = run_rollout([t for t, _, _ in todo], policy, settings.env.n_envs, cfg=settings.env, hooks=hooks,
                          store=_CollectorSink(collector), phase=spec["phase"], purpose=spec["purpose"],
                          seed=settings.run.seed, attempts=[a for _, a, _ in todo], progress=False,
                          screenshot_dir=spec["screenshot_dir"], node=node, judge=judge_from_settings(settings),
                          prompt_compat=prompt_format(settings), **spec["ident"])
    got = sorted(e["episode_id"] for e in eps)
    if got != sorted(j[2] for j in todo):  # the engine computes ids from the same inputs: a mismatch is a bug
        raise RuntimeError(f"shard {shard}: the engine produced episode ids {got[:3]}... for planned "
                           f"{[j[2] for j in todo][:3]}...")
    out.update(wall_s=time.perf_counter() - t0, steps=sum(e["n_steps"] for e in eps))
    return out


# ----------------------------------------------------------------------------------------- shared policy
def _is_loopback(host: str) -> bool:
    return host in ("localhost", "::1") or host.startswith("127.")


def _check_reachable(host: str) -> None:
    """A loopback policy server serves only the driver's machine: fail when the cluster has other machines."""
    import ray

    if not _is_loopback(host):
        return
    here = ray.util.get_node_ip_address()
    away = sorted({n["NodeManagerAddress"] for n in ray.nodes() if n.get("Alive")
                   and n["NodeManagerAddress"] != here and not _is_loopback(n["NodeManagerAddress"])})
    if away:
        raise RuntimeError(f"rollout.policy_host={host!r} is loopback, but the cluster has nodes on other machines "
                           f"({', '.join(away)}) that could not reach the shared policy server: set "
                           f"rollout.policy_host to this machine's IP ({here}), or policy_serving=per_shard")


def _bound_socket(host: str) -> socket.socket:
    """A socket bound to a port the kernel picks, handed to the server itself: held from the bind on, no race."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, 0))
    return sock


@contextlib.contextmanager
def shared_policy_server(settings, actor_ref, temperature: float, purpose: str, expected_digest: str,
                         host: str = "127.0.0.1", timeout_s: float = 120.0) -> Iterator[dict]:
    """Serve the actor checkpoint once (``policy.openai_app`` + uvicorn on ``host`` and a free port) for the
    block; yields ``{"base_url", "model_name", "policy_id"}`` after ``/v1/models`` reported the checkpoint
    digest ``expected_digest`` (``hf:<sha256>``) that the episode keys carry."""
    import uvicorn

    from webrl_core.agent.policy import openai_app, served_model_digest
    from webrl_core.agent.rollout_policy import make_policy

    hf = make_policy(settings, actor_ref, temperature, purpose)
    sock = _bound_socket(host)
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(openai_app(hf, model_name=SERVED_MODEL_NAME), log_level="warning",
                                           access_log=False, lifespan="off", timeout_keep_alive=30))
    th = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="webrl-policy-server", daemon=True)
    th.start()
    try:
        deadline = time.monotonic() + timeout_s
        while not server.started:
            if not th.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the shared policy server on {host}:{port} did not start within {timeout_s}s")
            time.sleep(0.05)
        base_url = f"http://{'[' + host + ']' if ':' in host else host}:{port}/v1"
        served = f"hf:{served_model_digest(base_url, SERVED_MODEL_NAME)}"
        if served != expected_digest:
            raise RuntimeError(f"the shared policy server at {base_url} serves {served}, but the episodes are keyed "
                               f"by {expected_digest}: the checkpoint changed under {actor_ref.path}")
        yield {"base_url": base_url, "model_name": SERVED_MODEL_NAME, "policy_id": hf.policy_id}
    finally:
        server.should_exit = True
        th.join(timeout=30)
        sock.close()


# ----------------------------------------------------------------------------------------- driver
def run_on_ray(settings, rollout_cfg: RolloutConfig, run_dir: str | Path, phase: int, purpose: str,
               tasks: list[dict], attempts: list[int], actor_ref, temperature: float, ident: dict[str, str],
               *, endpoint=None, poll_s: float = 0.5) -> dict:
    """Run ``tasks`` (with their ``attempts``) on the Ray cluster; every finished episode is written into
    ``TrajectoryStore(run_dir)`` exactly once, from this process (see module docstring). ``ident`` is the
    stage's ``rollout_identity(...)``. Returns ``{"episodes", "shards", "by_node", "starts", ...}``."""
    import ray

    from webrl_core.env.rollout import plan_episode_ids
    from webrl_core.runs.store import TrajectoryStore

    if len(attempts) != len(tasks):
        raise ValueError(f"run_on_ray: {len(attempts)} attempts for {len(tasks)} tasks")
    ids = plan_episode_ids(tasks, phase=phase, purpose=purpose, seed=settings.run.seed, attempts=attempts, **ident)
    if len(set(ids)) != len(ids):
        raise ValueError("run_on_ray: two jobs have the same episode id (a task listed twice with one attempt)")
    jobs = list(zip(tasks, attempts, ids))
    n = rollout_cfg.shard_size
    shards = [jobs[i:i + n] for i in range(0, len(jobs), n)]
    stats: dict[str, Any] = {"episodes": 0, "shards": len(shards), "by_node": {}, "starts": [], "results": [],
                             "policy_endpoint": None, "local_cluster_dir": None}
    if not shards:
        return stats
    store = TrajectoryStore(run_dir)
    backend = settings.policy.backend if purpose not in SCRIPTED else purpose
    shared = backend == "hf" and rollout_cfg.policy_serving == "shared"
    t0 = time.perf_counter()
    with contextlib.ExitStack() as stack:
        conn = stack.enter_context(ray_connection(rollout_cfg))
        stats.update(address=conn["address"], local_cluster_dir=conn["local_cluster_dir"])
        served = None
        if endpoint is not None:  # the actor served by webrl_core.agent.serving for this rollout: every shard calls it
            served = {"base_url": endpoint.base_url, "model_name": endpoint.model_name,
                      "policy_id": f"{endpoint.policy_digest}@T{temperature:g}"}
            stats["policy_endpoint"] = endpoint.base_url
        elif shared:
            _check_reachable(rollout_cfg.policy_host)
            served = stack.enter_context(shared_policy_server(settings, actor_ref, temperature, purpose,
                                                              ident["policy_digest"], host=rollout_cfg.policy_host))
            stats["policy_endpoint"] = served["base_url"]
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        here = ray.get_runtime_context().get_node_id()
        collector = ray.remote(num_cpus=0, max_restarts=0)(_Collector).options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=here, soft=False)).remote()
        stack.callback(ray.kill, collector)
        spec = {"settings": settings, "phase": phase, "purpose": purpose, "temperature": temperature,
                "ident": dict(ident), "policy": served, "actor_ref": None if shared else actor_ref,
                "screenshot_dir": str(Path(run_dir) / "screenshots") if settings.env.screenshots else None}
        options: dict[str, Any] = dict(num_cpus=rollout_cfg.cpus_per_shard, max_retries=rollout_cfg.retries,
                                       retry_exceptions=False, scheduling_strategy="SPREAD")
        key_env = settings.policy.api_key_env
        if backend == "openai" and os.environ.get(key_env):
            options["runtime_env"] = {"env_vars": {key_env: os.environ[key_env]}}
        remote = ray.remote(_run_shard).options(**options)
        pending = {remote.remote(spec, k, shard, collector): k for k, shard in enumerate(shards)}
        failures: list[str] = []

        def drain() -> None:
            items = ray.get(collector.drain.remote())
            if items:
                store.write_episodes(items)
                stats["episodes"] += len(items)
                for ep, _ in items:
                    stats["by_node"][ep["node"]] = stats["by_node"].get(ep["node"], 0) + 1

        waiting = list(pending)
        try:
            while waiting:
                ready, waiting = ray.wait(waiting, num_returns=len(waiting), timeout=poll_s)
                for ref in ready:
                    try:
                        stats["results"].append(ray.get(ref))
                    except Exception as e:  # its own error, or its worker/node died more than rollout.retries times
                        failures.append(f"shard {pending[ref]}: {type(e).__name__}: {str(e).strip()[:2000]}")
                drain()
        finally:
            for ref in waiting:  # the driver was interrupted: do not leave shards running on the cluster
                with contextlib.suppress(Exception):
                    ray.cancel(ref, force=True)
            with contextlib.suppress(Exception) if waiting else contextlib.nullcontext():
                drain()  # what arrived since the last poll (on an interruption: as much as can be saved)
        c = ray.get(collector.stats.remote())
        stats.update(starts=c["starts"], dropped_duplicates=c["dropped_duplicates"])
    stats["wall_s"] = time.perf_counter() - t0
    if failures:
        raise RuntimeError(f"rollout of {purpose} phase {phase} on Ray: {len(failures)} of {len(shards)} shard(s) "
                           f"failed ({stats['episodes']} of {len(ids)} episodes are stored; a re-run runs only the "
                           f"others):\n" + "\n".join(failures[:3]))
    return stats

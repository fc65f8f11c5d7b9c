"""``rollout.engine: ray`` on real Ray clusters of this machine, real Chromium and the embedded sites in every shard.

* a single-node local cluster started by the engine itself (no address), the HF actor served once by the
  driver to every shard, cluster and server gone afterwards;
* a head and a second node (``ray start`` processes on 127.0.0.2 and 127.0.0.3): a smoke rollout spreads over
  both nodes and stores exactly the local engine's episode keys (and outcomes), each once; the per-shard policy;
* the second node's raylet SIGKILLed mid-shard: the rollout completes, the episodes finished before the kill are
  kept as they were, the rest ran again on the head, nothing is lost or doubled, nothing of the node survives.

Sizes are tiny (2 cores): 1 browser per shard, 2-6 episodes of at most 6 steps.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time

import duckdb
import psutil
import pytest

from webrl_core.artifacts import ArtifactRef
from webrl_core.config import EmbeddedModelConfig
from webrl_core.config_loader import load_config
from webrl_core.env.rollout import default_attempts, plan_episode_ids, run_rollout
from webrl_core.learn.embedded_model import build_embedded_model, train_embedded_tokenizer
from webrl_core.prompts import build_prompt
from webrl_core.scale.ray_cluster import LocalRayCluster
from webrl_core.scale.ray_rollout import RolloutConfig, run_on_ray
from webrl_core.sites import OraclePolicy, train_tasks
from webrl_core.agent.rollout_policy import rollout_identity
from webrl_core.sites.session import site_session
from webrl_core.runs.store import TrajectoryStore

pytestmark = pytest.mark.slow


def smoke(*sets: str):
    return load_config("smoke", sets=["env.n_envs=1", "env.max_steps=6", *sets])


def stored_rows(run_dir) -> list[dict]:
    """Every episode row in the store's files (not the de-duplicated view): one per write of an episode."""
    files = sorted((run_dir / "store" / "episodes").glob("phase=*/*.parquet"))
    if not files:
        return []
    con = duckdb.connect()
    try:
        rel = con.execute("SELECT episode_id, _batch, node, status, env_score, n_steps, policy_id FROM "
                          "read_parquet($f)", {"f": [str(f) for f in files]})
        cols = [d[0] for d in rel.description]
        return [dict(zip(cols, r)) for r in rel.fetchall()]
    finally:
        con.close()


def actions(run_dir) -> dict[str, list[str]]:
    store = TrajectoryStore(run_dir)
    out: dict[str, list[str]] = {}
    for s in sorted(store.steps(), key=lambda s: (s["episode_id"], s["idx"])):
        out.setdefault(s["episode_id"], []).append(s["action"])
    return out


def alive(pids: list[int]) -> list[int]:
    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            pass
    return out


def tiny_actor(root) -> ArtifactRef:
    texts = [build_prompt(f"Open item {i}", [], f'<a id="{i}">item {i}</a>' * 20) + 'do(action="Click", element="3")'
             for i in range(8)]
    train_embedded_tokenizer(texts, 350, root / "tok")
    cfg = EmbeddedModelConfig(vocab_size=350, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=2,
                              max_length=1024)
    return ArtifactRef.of(build_embedded_model(root / "tok", cfg, root / "actor", seed=0), "model")


def test_local_cluster_and_shared_policy_server(tmp_path, monkeypatch):
    """No address: the engine starts a local cluster, serves the actor once, verifies its digest, cleans up."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    actor = tiny_actor(tmp_path)
    s = smoke("policy.backend=hf", "policy.max_new_tokens=8", "env.max_steps=3", "env.parse_failure_limit=2")
    tasks = train_tasks(2, seed=3, data_seed=0)
    ident = rollout_identity(s, actor, 1.0, "rollout")
    assert ident["policy_digest"] == f"hf:{actor.sha256}"
    cfg = RolloutConfig(engine="ray", shard_size=1, policy_serving="shared")
    stats = run_on_ray(s, cfg, tmp_path / "run", 1, "rollout", tasks, default_attempts(tasks), actor, 1.0, ident)

    planned = plan_episode_ids(tasks, phase=1, purpose="rollout", seed=s.run.seed, **ident)
    rows = stored_rows(tmp_path / "run")
    assert sorted(r["episode_id"] for r in rows) == sorted(planned)  # each once
    assert all(r["status"] != "error" for r in rows), rows
    assert {r["policy_id"] for r in rows} == {f"{actor.path.split('/')[-2]}/actor@T1"}  # as the local engine names it
    assert stats["policy_endpoint"].startswith("http://127.0.0.1:")
    host, port = stats["policy_endpoint"].split("//")[1].split("/")[0].split(":")
    with pytest.raises(OSError):  # the shared server is stopped
        socket.create_connection((host, int(port)), timeout=2).close()
    # the local cluster is stopped: none of its processes is left, its folder is gone
    cluster_dir = stats["local_cluster_dir"]
    assert cluster_dir and not os.path.exists(cluster_dir)
    left = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if any(cluster_dir in a for a in (p.info["cmdline"] or [])) and p.status() != psutil.STATUS_ZOMBIE:
                left.append(p.pid)
        except psutil.NoSuchProcess:
            pass
    assert not left


@pytest.fixture(scope="module")
def cluster():
    c = LocalRayCluster(num_cpus=1)  # one shard at a time per node: two shards land on two nodes
    try:
        c.start()
        c.add_node()
        yield c
    finally:
        c.stop()


def test_two_nodes_store_the_local_engines_episodes(cluster, tmp_path):
    s = smoke()
    tasks = train_tasks(4, seed=5, data_seed=0)
    attempts = default_attempts(tasks)
    ident = rollout_identity(s, None, 0.0, "oracle")
    with site_session(s) as hooks:  # the local engine, as stages.rollout runs it
        run_rollout(tasks, OraclePolicy(), 1, cfg=s.env, hooks=hooks, store=TrajectoryStore(tmp_path / "local"),
                    phase=0, purpose="oracle", seed=s.run.seed, attempts=attempts, progress=False, **ident)

    cfg = RolloutConfig(engine="ray", ray_address=cluster.address, shard_size=2, retries=1)
    stats = run_on_ray(s, cfg, tmp_path / "ray", 0, "oracle", tasks, attempts, None, 0.0, ident)

    local, ray_rows = stored_rows(tmp_path / "local"), stored_rows(tmp_path / "ray")
    planned = plan_episode_ids(tasks, phase=0, purpose="oracle", seed=s.run.seed, **ident)
    assert sorted(r["episode_id"] for r in local) == sorted(planned)
    assert sorted(r["episode_id"] for r in ray_rows) == sorted(planned)  # same keys, each written once
    # the same episodes: outcome, length and actions (oracle policy: deterministic)
    outcome = lambda rows: {r["episode_id"]: (r["status"], r["env_score"], r["n_steps"]) for r in rows}  # noqa: E731
    assert outcome(ray_rows) == outcome(local)
    assert actions(tmp_path / "ray") == actions(tmp_path / "local")
    # from both nodes, each named by its Ray node id
    node_ids = {n["node_id"][:12] for n in cluster.nodes}
    assert {r["node"].rsplit("ray:", 1)[1] for r in ray_rows} == node_ids
    assert stats["episodes"] == 4 and len(stats["by_node"]) == 2 and stats["dropped_duplicates"] == 0


def test_per_shard_policy_on_two_nodes(cluster, tmp_path):
    actor = tiny_actor(tmp_path)
    s = smoke("policy.backend=hf", "policy.max_new_tokens=8", "env.max_steps=3", "env.parse_failure_limit=2")
    tasks = train_tasks(2, seed=7, data_seed=0)
    ident = rollout_identity(s, actor, 1.0, "rollout")
    cfg = RolloutConfig(engine="ray", ray_address=cluster.address, shard_size=1, policy_serving="per_shard")
    stats = run_on_ray(s, cfg, tmp_path / "run", 1, "rollout", tasks, default_attempts(tasks), actor, 1.0, ident)
    rows = stored_rows(tmp_path / "run")
    assert sorted(r["episode_id"] for r in rows) == sorted(
        plan_episode_ids(tasks, phase=1, purpose="rollout", seed=s.run.seed, **ident))
    assert all(r["status"] != "error" for r in rows) and stats["policy_endpoint"] is None


def test_node_killed_mid_rollout_loses_and_doubles_nothing(cluster, tmp_path):
    s = smoke()
    tasks = train_tasks(6, seed=11, data_seed=0)
    attempts = default_attempts(tasks)
    ident = rollout_identity(s, None, 0.0, "oracle")
    planned = plan_episode_ids(tasks, phase=0, purpose="oracle", seed=s.run.seed, **ident)
    run_dir = tmp_path / "run"
    cfg = RolloutConfig(engine="ray", ray_address=cluster.address, shard_size=3, retries=2)
    out: dict = {}

    def drive() -> None:
        try:
            out["stats"] = run_on_ray(s, cfg, run_dir, 0, "oracle", tasks, attempts, None, 0.0, ident)
        except BaseException as e:  # noqa: BLE001 -- reported by the test thread
            out["error"] = e

    th = threading.Thread(target=drive, daemon=True)
    th.start()
    node2 = cluster.nodes[1]["node_id"][:12]
    deadline = time.monotonic() + 240
    while True:  # kill node 2 once it has stored an episode of its shard (3 episodes)
        on2 = [r for r in stored_rows(run_dir) if r["node"].endswith(node2)]
        if on2:
            break
        assert th.is_alive(), out
        assert time.monotonic() < deadline, "node 2 stored no episode in time"
        time.sleep(0.2)
    before = {r["episode_id"]: r["_batch"] for r in stored_rows(run_dir)}
    assert len(on2) < 3, "node 2 finished its whole shard before it could be killed"
    node2_procs = cluster.processes(1)
    os.kill(cluster.raylet_pid(1), signal.SIGKILL)

    th.join(timeout=400)
    assert not th.is_alive(), "the rollout did not finish after the node died"
    assert "error" not in out, out.get("error")
    rows = stored_rows(run_dir)
    ids = [r["episode_id"] for r in rows]
    assert sorted(ids) == sorted(planned)  # none lost, none doubled
    batches = {r["episode_id"]: r["_batch"] for r in rows}
    assert all(batches[i] == b for i, b in before.items())  # finished before the kill: kept as they were
    shard_of_node2 = {i for i in ids if i in {r["episode_id"] for r in on2}}
    assert shard_of_node2 and all(r["status"] != "error" for r in rows)
    head = cluster.nodes[0]["node_id"][:12]
    on_head = [r for r in rows if r["node"].endswith(head)]
    assert len(on_head) == 6 - len([r for r in rows if r["node"].endswith(node2)]) >= 3 + 1  # the rest ran on the head
    starts = out["stats"]["starts"]
    assert len(starts) == 3 and sum(n.endswith(node2) for _, n in starts) == 1  # node 2's shard ran again once
    deadline = time.monotonic() + 60  # nothing of node 2 survives: workers, browsers, sites servers
    while alive(node2_procs) and time.monotonic() < deadline:
        time.sleep(1)
    assert not alive(node2_procs), [psutil.Process(p).cmdline()[:3] for p in alive(node2_procs)]

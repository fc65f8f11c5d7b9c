"""Rollout-engine throughput: env steps/s, observation latency and memory per ``n_envs``, with a scripted policy.

For each n_envs: one browser pool; a warm-up round (n_envs episodes: browsers, renderers, page caches) is not
counted; then ``episodes`` episodes are timed. Reported numbers:

* steps/s = env steps of the timed round / its wall time (resets, policy, evaluation included);
* obs p50/p95 = percentiles of per-step ``obs_s`` (settle + one in-page extraction);
* peak memory = max over samples every 0.25 s of (sum of PSS of this process' chromium processes, from
  /proc/PID/smaps_rollup) and this Python process' RSS.

Targets: ``miniwob`` (MiniWoB++ oracle tasks, MiniWoB oracle) or ``embedded`` (the embedded sites' test set
and their OraclePolicy).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from webrl_core.env.browser import BrowserPool, chromium_pids
from webrl_core.env.rollout import default_attempts, rollout, run_rollout
from webrl_core.learn.model_folder import kv_width


def _pss_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _rss_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def memory_mb() -> tuple[float, float]:
    """(chromium PSS MB, python RSS MB) right now."""
    return sum(_pss_kb(p) for p in chromium_pids()) / 1024, _rss_kb(os.getpid()) / 1024


def _percentile(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def _target(target: str, episodes: int, seed: int, sites_workers: str = "process"):
    """(tasks, policy, hooks, stop) for a target."""
    if target == "miniwob":
        from webrl_core.env.miniwob import ORACLE_TASKS, MiniWoBHooks, MiniWoBOracle, MiniWoBServer, miniwob_tasks
        srv = MiniWoBServer().start()
        per = -(-episodes // len(ORACLE_TASKS))
        tasks = miniwob_tasks(list(ORACLE_TASKS), per, seed)
        return tasks, MiniWoBOracle(), MiniWoBHooks(srv), srv.stop
    if target == "embedded":
        from webrl_core.sites import EmbeddedSites, OraclePolicy, test_set
        sites = EmbeddedSites(data_seed=0, workers=sites_workers).start()
        tasks = test_set(0)
        return tasks, OraclePolicy(), sites, sites.stop
    raise ValueError(f"unknown bench target {target!r}; allowed: miniwob, embedded")


class _CallSizes:
    """``policy`` with the number of prompts of each ``act`` call recorded (``sizes``)."""

    def __init__(self, policy) -> None:
        self.policy, self.sizes = policy, []

    def __getattr__(self, name: str):
        return getattr(self.policy, name)

    async def act(self, prompts, *args, **kwargs):
        self.sizes.append(len(prompts))
        return await self.policy.act(prompts, *args, **kwargs)


async def _measure(tasks, policy, hooks, n_envs: int, episodes: int, cfg, keep_prompts: bool = False,
                   prompt_compat="webrl") -> dict:
    cfg = cfg.model_copy(update={"n_envs": n_envs})
    peak = {"pss": 0.0, "rss": 0.0}
    stop = asyncio.Event()

    async def sampler():
        # smaps_rollup of every Chromium process costs ~10 ms of kernel time: off the event loop, once a second
        # (at 4 Hz on the loop it blocked the rollout for a quarter of the measured time)
        while not stop.is_set():
            pss, rss = await asyncio.to_thread(memory_mb)
            peak["pss"], peak["rss"] = max(peak["pss"], pss), max(peak["rss"], rss)
            try:
                await asyncio.wait_for(stop.wait(), 1.0)
            except asyncio.TimeoutError:
                pass

    def pick(start: int, n: int) -> list[dict]:
        return [dict(tasks[(start + i) % len(tasks)]) for i in range(n)]

    async with BrowserPool(cfg) as pool:
        smp = asyncio.create_task(sampler())
        await rollout(pick(0, n_envs), policy, n_envs, cfg=cfg, hooks=hooks, pool=pool, progress=False,
                      purpose="bench-warmup", prompt_compat=prompt_compat)
        counted = _CallSizes(policy)
        t0 = time.perf_counter()
        eps = await rollout(pick(n_envs, episodes), counted, n_envs, cfg=cfg, hooks=hooks, pool=pool,
                            progress=False, purpose="bench", prompt_compat=prompt_compat)
        wall = time.perf_counter() - t0
        stop.set()
        await smp
    steps = [s for e in eps for s in e["steps"]]
    obs = [s["obs_s"] for s in steps]
    return {"n_envs": n_envs, "episodes": len(eps), "steps": len(steps), "wall_s": wall,
            "steps_per_s": len(steps) / wall if wall > 0 else 0.0,
            "episodes_per_s": len(eps) / wall if wall > 0 else 0.0,
            "obs_p50_ms": 1000 * _percentile(obs, 0.5), "obs_p95_ms": 1000 * _percentile(obs, 0.95),
            "action_p50_ms": 1000 * (statistics.median([s["action_s"] for s in steps]) if steps else float("nan")),
            "success": sum(bool(e["success"]) for e in eps) / max(1, len(eps)),
            "errors": sum(e["status"] == "error" for e in eps),
            # why, when an episode failed every try: an error count alone sends a user to a deleted temp store
            "first_error": next((e["error"] for e in eps if e["status"] == "error"), None),
            # prompts per policy call: n_envs when the envs wait on one call together (a batched policy)
            "policy_batch": statistics.mean(counted.sizes) if counted.sizes else float("nan"),
            "chromium_pss_mb": peak["pss"], "python_rss_mb": peak["rss"],
            **({"prompts": [s["prompt"] for s in steps]} if keep_prompts else {})}


def bench_rollout(target: str = "miniwob", n_envs_list: list[int] = (1, 4, 8, 16), episodes: int = 40,
                  cfg=None, seed: int = 0, on_row=None, sites_workers: str = "process") -> list[dict]:
    """One row per n_envs (see module docstring)."""
    from webrl_core.config import EnvConfig
    cfg = cfg or EnvConfig()
    tasks, policy, hooks, stop = _target(target, episodes + max(n_envs_list), seed, sites_workers)
    rows = []
    try:
        for n in n_envs_list:
            row = asyncio.run(_measure(tasks, policy, hooks, n, episodes, cfg))
            row["target"] = target
            rows.append(row)
            if on_row:
                on_row(row)
    finally:
        stop()
    return rows


# ----------------------------------------------------------------------------------------- engines (Ray)
def _engine_tasks(n: int, seed: int, data_seed: int) -> list[dict]:
    from webrl_core.sites import train_tasks

    return train_tasks(n, seed=seed, data_seed=data_seed)


def _bench_actor(settings, root) -> "ArtifactRef":  # noqa: F821 -- the config's embedded model, random init
    from webrl_core.artifacts import ArtifactRef
    from webrl_core.learn.embedded_model import build_embedded_model, train_embedded_tokenizer
    from webrl_core.prompts import build_prompt

    emb = settings.models.embedded
    texts = [build_prompt(t["intent"], [], t["start_url"] * 40) + 'do(action="Click", element="3")'
             for t in _engine_tasks(64, 99, settings.sites.data_seed)]
    train_embedded_tokenizer(texts, emb.vocab_size, root / "tok")
    return ArtifactRef.of(build_embedded_model(root / "tok", emb, root / "actor", seed=0), "model")


def _local_phase(settings, run_dir, tasks, purpose, actor_ref, temperature, ident) -> None:
    """A phase's rollout as ``pipeline.experience.rollout`` runs it with ``rollout.engine: local``."""
    from webrl_core.agent.rollout_policy import make_policy
    from webrl_core.sites.session import site_session
    from webrl_core.runs.store import TrajectoryStore

    policy = make_policy(settings, actor_ref, temperature, purpose)
    with site_session(settings) as hooks:
        run_rollout(tasks, policy, settings.env.n_envs, cfg=settings.env, hooks=hooks, store=TrajectoryStore(run_dir),
                    phase=0, purpose=purpose, seed=settings.run.seed, attempts=default_attempts(tasks),
                    progress=False, **ident)


def _steps(run_dir) -> tuple[int, int, int]:
    from webrl_core.runs.store import TrajectoryStore

    eps = TrajectoryStore(run_dir).sql("SELECT n_steps, status FROM episodes")
    return len(eps), sum(int(e["n_steps"] or 0) for e in eps), sum(e["status"] == "error" for e in eps)


def bench_engines(settings, nodes_list: list[int] = (1, 2), policies: list[str] = ("oracle", "hf"),
                  servings: list[str] = ("shared", "per_shard"), episodes: int = 8, shard_size: int = 4,
                  cpus_per_node: int = 1, temperature: float = 1.0, seed: int = 0, on_row=None) -> list[dict]:
    """env steps/s of a phase's rollout through the local engine and through Ray on a local multi-node cluster
    (``LocalRayCluster``: 1 node, then one more per ``nodes_list`` entry, each with ``cpus_per_node`` CPUs, on
    this machine's loopback), per policy: ``oracle`` (scripted) and ``hf`` (the config's embedded model, random
    init: generation cost without training), the latter served once by the driver (``shared``) or loaded by
    every shard (``per_shard``). Every row runs the same ``episodes`` embedded training tasks (into a store of its
    own) after a warm-up (one episode per node: worker imports, browser and site caches), timed end to end as the stage
    would see it: sites and browsers started by each shard included, cluster start excluded (reported as
    ``cluster_start_s``). The local ``hf`` baseline runs twice: torch's default threads and one thread (what a
    1-CPU Ray shard gets). ``vs_local`` = steps/s over the faster local row of the same policy."""
    import ray

    from webrl_core.scale.ray_rollout import LocalRayCluster, RolloutConfig, run_on_ray
    from webrl_core.agent.rollout_policy import rollout_identity

    root = Path(tempfile.mkdtemp(prefix="webrl-bench-engines-"))
    rows: list[dict] = []
    # every row runs the same timed tasks (into its own store); warm-ups take other tasks
    pool = _engine_tasks(episodes + 2 * max(8, settings.env.n_envs, *nodes_list), seed, settings.sites.data_seed)
    timed, spare = pool[:episodes], pool[episodes:]

    def warm_tasks(n: int) -> list[dict]:
        return spare[:n]

    actor = _bench_actor(settings, root / "model") if "hf" in policies else None

    def policy_args(policy: str):
        if policy == "oracle":
            s, purpose, ref, temp = settings, "oracle", None, 0.0
        else:
            s = settings.model_copy(update={"policy": settings.policy.model_copy(update={"backend": "hf"})})
            purpose, ref, temp = "rollout", actor, temperature
        return s, purpose, ref, temp, rollout_identity(s, ref, temp, purpose)

    def emit(row: dict) -> None:
        rows.append(row)
        if on_row:
            on_row(row)

    def measure(run, label: str) -> dict:
        run_dir = root / label
        t0 = time.perf_counter()
        run(run_dir)
        wall = time.perf_counter() - t0
        n, steps, errors = _steps(run_dir)
        return {"episodes": n, "steps": steps, "errors": errors, "wall_s": wall,
                "steps_per_s": steps / wall if wall > 0 else 0.0}

    cluster = None
    try:
        for policy in policies:  # the local engine first: the baselines
            s, purpose, ref, temp, ident = policy_args(policy)
            _local_phase(s, root / f"warm-local-{policy}", warm_tasks(s.env.n_envs), purpose, ref, temp, ident)
            # hf: also with one torch thread, as Ray runs a 1-CPU shard (OMP_NUM_THREADS=1): torch's default
            # threads compete with the browsers for the cores
            for threads in ([None, 1] if policy == "hf" else [None]):
                import torch

                before = torch.get_num_threads()
                if threads:
                    torch.set_num_threads(threads)
                try:
                    row = measure(lambda d: _local_phase(s, d, timed, purpose, ref, temp, ident),
                                  f"local-{policy}-{threads}")
                finally:
                    torch.set_num_threads(before)
                serving = "-" if policy != "hf" else "in-proc" if not threads else f"in-proc,{threads}t"
                emit({"engine": "local", "nodes": 0, "policy": policy, "serving": serving, **row,
                      "cluster_start_s": 0.0})
        cluster = LocalRayCluster(num_cpus=cpus_per_node)
        for nodes in sorted(set(nodes_list)):
            t0 = time.perf_counter()
            if not cluster.nodes:
                cluster.start()
            while len(cluster.nodes) < nodes:
                cluster.add_node()
            start_s = time.perf_counter() - t0
            if not ray.is_initialized():
                ray.init(address=cluster.address, logging_level="WARNING", log_to_driver=False)
            for policy in policies:
                for serving in (servings if policy == "hf" else ["shared"]):
                    s, purpose, ref, temp, ident = policy_args(policy)
                    cfg = RolloutConfig(engine="ray", shard_size=shard_size, policy_serving=serving)

                    def go(d, cfg=cfg, s=s, purpose=purpose, ref=ref, temp=temp, ident=ident):
                        run_on_ray(s, cfg, d, 0, purpose, timed, default_attempts(timed), ref, temp, ident)

                    warm_cfg = cfg.model_copy(update={"shard_size": 1})
                    warm = warm_tasks(nodes)
                    run_on_ray(s, warm_cfg, root / f"warm-{nodes}-{policy}-{serving}", 0, purpose, warm,
                               default_attempts(warm), ref, temp, ident)
                    row = measure(go, f"ray{nodes}-{policy}-{serving}")
                    emit({"engine": "ray", "nodes": nodes, "policy": policy,
                          "serving": serving if policy == "hf" else "-", **row, "cluster_start_s": start_s})
    finally:
        if ray.is_initialized():
            ray.shutdown()
        if cluster is not None:
            cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
    for row in rows:  # against the faster local row, now that all are in
        base = max((r["steps_per_s"] for r in rows if r["engine"] == "local" and r["policy"] == row["policy"]),
                   default=0.0)
        row["vs_local"] = row["steps_per_s"] / base if base else 1.0
    return rows


# ----------------------------------------------------------------------------------------- a model as the policy
def decoder_shape(folder: str) -> dict:
    """What the policy's limit needs of a checkpoint, from its config on the meta device (no weights read):
    parameters in the decoder layers, in the LM head, layers, hidden size and key/value width per layer."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.from_pretrained(folder)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    text = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    total = sum(p.numel() for p in model.parameters())  # a tied head is counted once, as the embedding
    emb = model.get_input_embeddings().weight.numel()
    head_w = model.get_output_embeddings().weight
    head = head_w.numel()
    untied_head = 0 if head_w is model.get_input_embeddings().weight else head
    return {"layer_params": total - emb - untied_head, "head_params": head, "layers": text.num_hidden_layers,
            "hidden": text.hidden_size, "kv_width": kv_width(text.to_dict())}


def policy_limit_s(shape: dict, calls: list[tuple[list[int], list[int]]], peak_flops: float, bandwidth: float,
                   bytes_per_param: int) -> dict[str, float]:
    """The fastest a batched decoder could serve ``calls`` (each: its prompts' token counts, its responses'
    token counts with the stop token) on this box, the larger of two bounds per phase of a call:

        prefill  FLOPs = sum_i (2 n T_i + 4 L d T_i^2) + 2 n_head B       (attention over the prompt; the head on
                                                                          the last position of each row)
                 limit = FLOPs / matmul peak
        decode   per step s = 1 .. max_i R_i - 1 (the first token comes with the prefill): every weight read once, and each live row's keys and values
                 bytes = (n + n_head) b + 2 L w b sum_i (T_i + s),   FLOPs = 2 (n + n_head) B
                 limit = sum_s max(FLOPs / peak, bytes / copy bandwidth)

    n: decoder-layer parameters, n_head: LM-head parameters, L layers, d hidden size, w key/value width per layer,
    b bytes per parameter, B rows of the call, T_i and R_i its prompt and response tokens. The batch decodes until
    its longest response ends, as ``generate`` does; padding and the rows already stopped are not counted."""
    n, n_head, L, d, w = (shape[k] for k in ("layer_params", "head_params", "layers", "hidden", "kv_width"))
    prefill = decode = 0.0
    for prompts, responses in calls:
        rows = len(prompts)
        prefill += (sum(2 * n * t + 4 * L * d * t * t for t in prompts) + 2 * n_head * rows) / peak_flops
        for step in range(1, max(responses, default=0)):
            kv_bytes = 2 * L * w * bytes_per_param * sum(t + step for t in prompts)
            decode += max(2 * (n + n_head) * rows / peak_flops,
                          ((n + n_head) * bytes_per_param + kv_bytes) / bandwidth)
    return {"prefill_limit_s": prefill, "decode_limit_s": decode, "policy_limit_s": prefill + decode}


class _PolicyLimit:
    """``policy_limit_s`` of the policy-alone calls, with the box's matmul peak in the model's dtype and its copy
    bandwidth measured once (``cpu``, ``peak_flops`` and ``copy_bytes_per_s`` go into every row)."""

    def __init__(self, folder: str, settings, policy) -> None:
        from webrl_core.hardware import copy_bandwidth, cpu_summary, matmul_peak_flops
        from webrl_core.learn.models import load_tokenizer, torch_dtype

        dtype = torch_dtype(settings.models.dtype)
        self.shape, self.policy = decoder_shape(folder), policy
        self.tok = getattr(policy, "tok", None) or load_tokenizer(folder)
        self.max_prompt = getattr(policy, "max_prompt_tokens", settings.models.max_length)
        self.max_new = settings.policy.max_new_tokens
        self.bytes_per_param = dtype.itemsize
        self.box = {"cpu": cpu_summary(), "peak_flops": matmul_peak_flops(dtype=dtype),
                    "copy_bytes_per_s": copy_bandwidth(dtype=dtype)}

    def _prompt_tokens(self, prompt: str) -> int:
        from webrl_core.learn.models import encode_prompt

        text = self.policy._prompt_text(prompt, None) if hasattr(self.policy, "_prompt_text") else prompt
        return len(encode_prompt(self.tok, text, self.max_prompt))

    def _response_tokens(self, response: str) -> int:
        # the decoded text re-tokenised, plus the stop token; a response cut at the cap had none
        return min(self.max_new, len(self.tok(response, add_special_tokens=False)["input_ids"]) + 1)

    def of(self, calls: list[tuple[list[str], list[str]]]) -> dict:
        counted = [([self._prompt_tokens(p) for p in prompts], [self._response_tokens(r) for r in responses])
                   for prompts, responses in calls]
        return self.box | policy_limit_s(self.shape, counted, self.box["peak_flops"], self.box["copy_bytes_per_s"],
                                         self.bytes_per_param)


def bench_model_rollout(model: str, settings, n_envs_list: list[int] = (4,), episodes: int = 8,
                        on_row=None, keep_prompts: bool = False) -> list[dict]:
    """Env steps/s of the embedded sites' test tasks (``eval.max_tasks`` of them, stratified by site as the
    evaluation takes them) with ``model`` (an HF folder) acting through the policy a
    training rollout builds from ``settings`` (``rollout_policy.make_policy``): in-process ``HFPolicy`` with
    ``policy.backend: hf``, or, with ``policy.backend: openai``, the engine ``serving.engine`` started for the
    checkpoint as the rollout stage starts it (``served_actor``; its start-up seconds reported apart), per n_envs;
    beside it the policy alone: the same prompts that the rollout sent, acted on again in batches of n_envs (what
    the rollout's policy calls would cost with no browser and no waiting), as steps/s, and against that the
    policy's limit on this box (``policy_limit_s``: ``policy_limit_share`` = limit / policy seconds). The prompts
    are the config's (``prompts.prompt_format``: ``prompt.style``, ``prompt.observation``), built as a rollout
    stage builds them; ``keep_prompts``: each row also holds them (``prompts``)."""
    from webrl_core.agent.rollout_policy import make_policy, needs_server
    from webrl_core.agent.serving import served_actor
    from webrl_core.artifacts import ArtifactRef
    from webrl_core.pipeline.task_sets import stratified
    from webrl_core.prompts import prompt_format
    from webrl_core.sites import EmbeddedSites, test_set

    ref = ArtifactRef.of(model, "model")
    sites = EmbeddedSites(data_seed=0, workers=settings.sites.workers).start()
    # the tasks `webrl eval` runs, in its order (one site after the other): the first 16 of the whole test set
    # are all shopping tasks, whose pages and actions are not the demo's mix
    tasks = stratified(test_set(0), settings.eval.max_tasks)
    rows = []
    with contextlib.ExitStack() as stack:
        stack.callback(sites.stop)
        endpoint, startup_s = None, 0.0
        if needs_server(settings, ref, "rollout"):
            run_dir = stack.enter_context(tempfile.TemporaryDirectory(prefix="webrl-bench-rollout-"))
            t0 = time.perf_counter()
            endpoint = stack.enter_context(served_actor(settings, ref, run_dir))
            startup_s = time.perf_counter() - t0
        policy = make_policy(settings, ref, settings.policy.temperature, "rollout", endpoint)
        prompt_compat = prompt_format(settings)
        limit = _PolicyLimit(str(model), settings, policy)
        for n in n_envs_list:
            row = asyncio.run(_measure(tasks, policy, sites, n, episodes, settings.env, keep_prompts=True,
                                       prompt_compat=prompt_compat))
            prompts = row["prompts"] if keep_prompts else row.pop("prompts")
            calls = []
            t0 = time.perf_counter()
            for i in range(0, len(prompts), n):
                calls.append((prompts[i:i + n], asyncio.run(policy.act(prompts[i:i + n]))))
            policy_s = time.perf_counter() - t0
            row |= {"target": "embedded", "model": str(model), "policy_only_steps_per_s": len(prompts) / policy_s,
                    "policy_share": policy_s / row["wall_s"], "backend": settings.policy.backend,
                    "engine": settings.serving.engine if endpoint else "in-process", "startup_s": startup_s,
                    "policy_s": policy_s, **limit.of(calls)}
            row["policy_limit_share"] = row["policy_limit_s"] / policy_s if policy_s > 0 else float("nan")
            rows.append(row)
            if on_row:
                on_row(row)
    return rows

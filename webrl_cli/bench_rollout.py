"""`webrl bench rollout`: env steps/s, observation latency and memory of the rollout engine per n_envs; with
`--engine ray`: env steps/s of a phase's rollout through Ray (1, 2, ... local nodes) against the local engine."""

from __future__ import annotations

from pathlib import Path

import typer


def _ints(value: str, flag: str) -> list[int]:
    try:
        return [int(x) for x in value.split(",") if x.strip()]
    except ValueError:
        raise typer.BadParameter(f"{flag} {value!r}: expected comma-separated integers") from None


def _words(value: str, flag: str, allowed: tuple[str, ...]) -> list[str]:
    out = [x.strip() for x in value.split(",") if x.strip()]
    bad = [x for x in out if x not in allowed]
    if bad or not out:
        raise typer.BadParameter(f"{flag} {value!r}: allowed (comma-separated): {', '.join(allowed)}")
    return out


def register(app: typer.Typer) -> None:
    @app.command("rollout")
    def rollout_cmd(
        target: str | None = typer.Option(None, help="miniwob | embedded (default: miniwob; --engine ray: "
                                          "embedded)"),
        n_envs: str | None = typer.Option(None, "--n-envs", help="comma-separated n_envs values to measure "
                                          "(default 1,4,8,16; --engine ray: one value, browsers per shard, default 2)"),
        episodes: int | None = typer.Option(None, min=1, help="timed episodes per setting (default 40; --engine "
                                            "ray: 8)"),
        engine: str = typer.Option("local", help="local: the engine's n_envs sweep; ray: a phase's rollout through "
                                   "Ray on 1, 2, ... local nodes against the local engine"),
        nodes: str = typer.Option("1,2", help="--engine ray: comma-separated node counts of the local Ray cluster"),
        policy: str = typer.Option("oracle,hf", help="--engine ray: oracle (scripted) and/or hf (the config's embedded "
                                   "model, random init)"),
        serving: str = typer.Option("shared,per_shard", help="--engine ray, policy hf: served once by the driver "
                                    "(shared) and/or a model copy per shard (per_shard)"),
        shard_size: int = typer.Option(4, "--shard-size", min=1, help="--engine ray: episodes per Ray task"),
        cpus_per_node: int = typer.Option(1, "--cpus-per-node", min=1, help="--engine ray: CPUs each local node offers "
                                            "(1: one shard at a time per node)"),
        model: str | None = typer.Option(None, help="HF causal-LM folder or short name (smollm2-135m-instruct) as the "
                                         "policy on the embedded sites' test tasks (the evaluation's stratified "
                                         "eval.max_tasks); prints env steps/s and the "
                                         "policy alone on the same prompts (default: the config's env.n_envs, 8 "
                                         "episodes, config demo)"),
        config: str | None = typer.Option(None, "--config", "-c", help="config file for the env section"),
        set_: list[str] = typer.Option([], "--set", help="section.key=value overrides"),
    ) -> None:
        """Measure the rollout engine with a scripted policy (no model): the browser side alone; or, with
        --engine ray, a phase's rollout through Ray against the local engine."""
        from rich.console import Console

        from webrl_core.config_loader import load_config

        if model:
            _bench_model(Console(), model, config or "demo", set_, _ints(n_envs, "--n-envs") if n_envs else None,
                         episodes or 8)
            return
        settings = load_config(config, sets=set_ or ())
        cfg = settings.env
        console = Console()
        if engine not in ("local", "ray"):
            raise typer.BadParameter(f"--engine {engine!r}: allowed: local, ray")
        if engine == "ray":
            _bench_ray(console, settings, target or "embedded", n_envs, episodes or 8, _ints(nodes, "--nodes"),
                       _words(policy, "--policy", ("oracle", "hf")),
                       _words(serving, "--serving", ("shared", "per_shard")), shard_size, cpus_per_node)
            return
        from benchmarks.rollout import bench_rollout

        target = target or "miniwob"
        episodes = episodes or 40
        ns = _ints(n_envs or "1,4,8,16", "--n-envs")
        from webrl_core.env.browser import chromium_executable

        console.print(f"target={target}, {episodes} timed episodes per setting, "
                      f"contexts_per_browser={cfg.contexts_per_browser}, batch_wait_s={cfg.batch_wait_s}, "
                      f"sites.workers={settings.sites.workers}, chromium={chromium_executable(cfg)}")
        rows = bench_rollout(target, ns, episodes, cfg=cfg, sites_workers=settings.sites.workers,
                             on_row=lambda r: console.print(f"  n_envs={r['n_envs']}: {r['steps_per_s']:.1f} steps/s"))
        # short headers: the table must fit an 80-column terminal
        cols = [("n_envs", "n_envs", "{}"), ("eps", "episodes", "{}"), ("steps", "steps", "{}"),
                ("steps/s", "steps_per_s", "{:.1f}"), ("eps/s", "episodes_per_s", "{:.2f}"),
                ("obs p50", "obs_p50_ms", "{:.0f}ms"), ("obs p95", "obs_p95_ms", "{:.0f}ms"),
                ("act p50", "action_p50_ms", "{:.0f}ms"), ("succ", "success", "{:.2f}"),
                ("err", "errors", "{}"), ("PSS MB", "chromium_pss_mb", "{:.0f}"),
                ("py MB", "python_rss_mb", "{:.0f}")]
        console.print(_table(f"webrl bench rollout ({target}, scripted policy)", cols, rows))
        best = max(rows, key=lambda r: r["steps_per_s"])
        console.print(f"best: {best['steps_per_s']:.1f} env steps/s at n_envs={best['n_envs']} "
                      f"(target >= 10 steps/s)")


def _table(title: str, cols: list[tuple[str, str, str]], rows: list[dict]):
    """A rich table of ``rows``, one column per (header, key, format)."""
    from rich.table import Table

    table = Table(title=title, padding=(0, 0))
    for name, _, _ in cols:
        table.add_column(name, justify="right")
    for r in rows:
        table.add_row(*[fmt.format(r[key]) for _, key, fmt in cols])
    return table


def _bench_model(console, model: str, config: str, sets: list[str], ns: list[int] | None, episodes: int) -> None:
    from benchmarks.rollout import bench_model_rollout
    from webrl_core.config_loader import load_config
    from webrl_core.hardware import cpu_summary

    settings = load_config(config, sets=[f"models.actor={model}", *sets])
    ns = ns or [settings.env.n_envs]  # the browsers a rollout stage of this config runs
    m = settings.models
    engine = settings.serving.engine if settings.policy.backend == "openai" else "in-process HF"
    console.print(cpu_summary())
    console.print(f"--model {m.actor}: policy.backend={settings.policy.backend} ({engine}), "
                  f"{m.dtype} ({m.dtype_why}), policy.batch_size={settings.policy.batch_size}, "
                  f"max_new_tokens={settings.policy.max_new_tokens}, temperature={settings.policy.temperature}, "
                  f"env.max_steps={settings.env.max_steps}, batch_wait_s={settings.env.batch_wait_s}; "
                  f"{episodes} timed episodes per n_envs on the evaluation's embedded test tasks "
                  f"(eval.max_tasks={settings.eval.max_tasks}, stratified by site)")
    rows = bench_model_rollout(str(m.actor), settings, ns, episodes,
                               on_row=lambda r: console.print(f"  n_envs={r['n_envs']}: {r['steps_per_s']:.2f} "
                                                              f"steps/s, policy alone "
                                                              f"{r['policy_only_steps_per_s']:.2f}"))
    cols = [("n_envs", "n_envs", "{}"), ("eps", "episodes", "{}"), ("steps", "steps", "{}"),
            ("steps/s", "steps_per_s", "{:.2f}"), ("alone/s", "policy_only_steps_per_s", "{:.2f}"),
            ("policy%", "policy_share", "{:.0%}"), ("batch", "policy_batch", "{:.1f}"),
            ("limit%", "policy_limit_share", "{:.0%}"), ("obs p50", "obs_p50_ms", "{:.0f}ms"),
            ("succ", "success", "{:.2f}"), ("err", "errors", "{}"), ("py MB", "python_rss_mb", "{:.0f}")]
    console.print(_table(f"webrl bench rollout --model {Path(str(m.actor)).name} ({engine})", cols, rows))
    console.print("alone/s: the rollout's prompts again with no browser; policy%: the rollout's time in the policy; "
                  "limit%: the policy's limit / the policy alone's seconds")
    if rows:
        console.print(f"the policy's limit on this box (benchmarks/rollout.py policy_limit_s): {m.dtype} matmul peak "
                      f"{rows[0]['peak_flops'] / 1e9:.0f} GFLOP/s, copy bandwidth "
                      f"{rows[0]['copy_bytes_per_s'] / 1e9:.1f} GB/s, measured in this run")
    for r in rows:
        console.print(f"  n_envs={r['n_envs']}: the policy alone {r['policy_s']:.1f}s, its limit "
                      f"{r['policy_limit_s']:.1f}s (prefill {r['prefill_limit_s']:.1f}s, decode "
                      f"{r['decode_limit_s']:.1f}s): {r['policy_limit_share']:.0%} of the limit")
    for r in rows:
        if r["errors"]:
            console.print(f"  n_envs={r['n_envs']}: {r['errors']} episode(s) failed every try; the first: "
                          f"{r['first_error']}")
    if rows and rows[0]["startup_s"]:
        console.print(f"{engine} started in {rows[0]['startup_s']:.0f}s (not in steps/s; a rollout stage pays it once)")
    best = max(rows, key=lambda r: r["steps_per_s"])
    print(f"steps/s={best['steps_per_s']:.2f} policy_only={best['policy_only_steps_per_s']:.2f} "
          f"of_limit={100 * best['policy_limit_share']:.3g}%")


def _bench_ray(console, settings, target: str, n_envs: str | None, episodes: int, nodes: list[int],
               policies: list[str], servings: list[str], shard_size: int, cpus_per_node: int) -> None:
    import os

    from benchmarks.rollout import bench_engines

    if target != "embedded":
        raise typer.BadParameter(f"--target {target!r}: --engine ray rolls out the embedded sites' tasks (a phase's "
                                 f"rollout); use --target embedded")
    if not nodes or min(nodes) < 1:
        raise typer.BadParameter("--nodes: node counts >= 1")
    n = _ints(n_envs, "--n-envs")[0] if n_envs else 2
    settings = settings.model_copy(update={"env": settings.env.model_copy(update={"n_envs": n})})
    console.print(f"--engine ray: {episodes} timed episodes per row (embedded training tasks), n_envs={n} per "
                  f"shard (and for the local engine), shard_size={shard_size}, {cpus_per_node} CPU(s) per node, "
                  f"nodes={nodes} (ray start processes on this machine's loopback), policies={policies}, "
                  f"machine: {os.cpu_count()} cores")
    rows = bench_engines(settings, nodes, policies, servings, episodes, shard_size, cpus_per_node,
                         temperature=settings.policy.temperature, seed=settings.run.seed,
                         on_row=lambda r: console.print(f"  {r['engine']} nodes={r['nodes']} {r['policy']} "
                                                        f"{r['serving']}: {r['steps_per_s']:.2f} steps/s"))
    # short headers and values: the table must fit an 80-column terminal
    cols = [("engine", "engine", "{}"), ("nodes", "nodes", "{}"), ("policy", "policy", "{}"),
            ("serving", "serving", "{}"), ("eps", "episodes", "{}"), ("steps", "steps", "{}"),
            ("wall s", "wall_s", "{:.1f}"), ("steps/s", "steps_per_s", "{:.2f}"), ("vs local", "vs_local", "{:.2f}x"),
            ("err", "errors", "{}"), ("start s", "cluster_start_s", "{:.0f}")]
    console.print(_table("webrl bench rollout --engine ray: env steps/s of a phase's rollout", cols, rows))
    console.print("nodes: 0 = the local engine in this process (hf: torch's default threads, and 1 thread as in a "
                  "1-CPU Ray shard); start s = seconds to start the Ray nodes (not in wall s); vs local = steps/s "
                  "over the faster local row of the same policy")

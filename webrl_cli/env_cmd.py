"""`webrl env ...`: run the agent loop on MiniWoB++ with scripted policies, or play a page by hand."""

from __future__ import annotations

import json
from pathlib import Path

import typer

app = typer.Typer(no_args_is_help=True)


def _env_cfg(config: str | None, sets: list[str]):
    from webrl_core.config_loader import load_config
    return load_config(config, sets=sets or ()).env


@app.command("miniwob")
def miniwob_cmd(
    tasks: str = typer.Option("click-button,click-link,enter-text,click-checkboxes,focus-text",
                              help="comma-separated MiniWoB++ task names"),
    policy: str = typer.Option("oracle", help="oracle | random"),
    episodes: int = typer.Option(5, min=1, help="seeds per task"),
    n_envs: int = typer.Option(4, "--n-envs", min=1, help="concurrent browser contexts"),
    seed: int = typer.Option(0, min=0, help="seed of the task instances (and of the random policy)"),
    max_steps: int = typer.Option(10, min=1, help="actions per episode (AgentLab's MiniWoB++ setting: 10)"),
    config: str | None = typer.Option(None, "--config", "-c", help="config file for the env section"),
    set_: list[str] = typer.Option([], "--set", help="section.key=value overrides"),
    out: Path | None = typer.Option(None, help="write the episodes (with steps) as JSONL here"),
) -> None:
    """Per-task success of a scripted policy on MiniWoB++ (ground-truth rewards from the tasks' own JS)."""
    import time

    from rich.console import Console
    from rich.table import Table

    from webrl_core.env.miniwob import MiniWoBHooks, MiniWoBOracle, MiniWoBServer, miniwob_tasks
    from webrl_core.env.rollout import run_rollout
    from webrl_core.env.scripted import RandomPolicy

    cfg = _env_cfg(config, set_).model_copy(update={"max_steps": max_steps})
    names = [t.strip() for t in tasks.split(",") if t.strip()]
    if policy == "oracle":
        pol = MiniWoBOracle()
    elif policy == "random":
        pol = RandomPolicy(seed)
    else:
        raise typer.BadParameter(f"--policy {policy!r}: allowed: oracle, random")
    task_list = miniwob_tasks(names, episodes, seed)
    t0 = time.perf_counter()
    with MiniWoBServer() as srv:
        eps = run_rollout(task_list, pol, n_envs, cfg=cfg, hooks=MiniWoBHooks(srv), purpose="eval", seed=seed)
    wall = time.perf_counter() - t0
    table = Table(title=f"MiniWoB++ / policy={policy} / {episodes} seeds / n_envs={n_envs}")
    for col in ("task", "episodes", "success", "mean steps", "errors"):
        table.add_column(col, justify="left" if col == "task" else "right")
    total_ok = 0
    for name in names:
        mine = [e for e in eps if e["task_id"].startswith(f"miniwob.{name}.")]
        ok = sum(bool(e["success"]) for e in mine)
        total_ok += ok
        steps = sum(e["n_steps"] for e in mine) / max(1, len(mine))
        table.add_row(name, str(len(mine)), f"{ok / max(1, len(mine)):.2f}", f"{steps:.1f}",
                      str(sum(e["status"] == "error" for e in mine)))
    table.add_row("ALL", str(len(eps)), f"{total_ok / max(1, len(eps)):.2f}",
                  f"{sum(e['n_steps'] for e in eps) / max(1, len(eps)):.1f}",
                  str(sum(e["status"] == "error" for e in eps)))
    console = Console()
    console.print(table)
    n_steps = sum(e["n_steps"] for e in eps)
    console.print(f"{len(eps)} episodes, {n_steps} steps in {wall:.1f} s (incl. browser start): "
                  f"{n_steps / wall:.1f} env steps/s")
    if out:
        with open(out, "w") as f:
            for e in eps:
                f.write(json.dumps(e, default=str) + "\n")
        console.print(f"episodes written to {out}")


@app.command("play")
def play_cmd(
    target: str = typer.Argument(..., help="a URL, or a task JSON file (WebArena-Lite schema; a list: --index picks)"),
    index: int = typer.Option(0, min=0, help="which task of a JSON list"),
    config: str | None = typer.Option(None, "--config", "-c", help="config file (env and sites sections)"),
    set_: list[str] = typer.Option([], "--set", help="section.key=value overrides"),
    show_prompt: bool = typer.Option(False, help="print the full policy prompt instead of the observation"),
) -> None:
    """Act by hand: type actions in the WebRL grammar (do(...), exit(...), go_backward()); ':q' quits."""
    import asyncio
    from urllib.parse import urlsplit

    from playwright.async_api import Error as PlaywrightError
    from rich.console import Console

    from webrl_core.config_loader import load_config
    from webrl_core.env.browser import BrowserPool, NoHooks, WebArenaHooks, url_host
    from webrl_core.env.web_env import WebEnv
    from webrl_core.errors import BadInput, MissingInput
    from webrl_core.prompts import build_prompt

    settings = load_config(config, sets=set_ or ())
    cfg = settings.env
    console = Console()
    by_url = ""
    if Path(target).is_file():
        from webrl_core.env.webarena import placeholder_sites, read_task_file, site_url_hint

        tasks = read_task_file(target)  # a TaskFileError names the file, the task and the field
        if not 0 <= index < len(tasks):
            raise BadInput(f"--index {index}: {target} holds {len(tasks)} task(s) (0 to {len(tasks) - 1})")
        task = tasks[index]
        # env play serves the sites in sites.urls only (it starts no embedded sites, whatever sites.mode says):
        # a placeholder of any other site would reach the browser as an invalid URL. Placeholders, not the
        # `sites` list: an exported task (URLs substituted) plays without sites.urls
        unserved = sorted(placeholder_sites(task) - set(settings.sites.urls))
        if unserved:
            raise BadInput(f"task #{index} (task_id={task.get('task_id')!r}) of {target} needs site"
                           f"{'s' if len(unserved) > 1 else ''} {', '.join(unserved)}: {site_url_hint(unserved)}")
        from webrl_core.env.webarena_login import LOGIN_SITES

        hooks = (WebArenaHooks(settings.sites.urls, settings.sites.auth_dir, reset_command=settings.sites.reset_command,
                               login_sites=LOGIN_SITES) if settings.sites.urls else NoHooks())
    elif urlsplit(target).scheme in ("http", "https") and urlsplit(target).netloc:
        task = {"task_id": "play", "intent": "(interactive)", "start_url": target, "sites": []}
        by_url = "; a URL given to env play is never scored"
        hooks = NoHooks(allowed=[url_host(target)] if url_host(target) else [])
    elif "://" in target:
        raise BadInput(f"{target}: not an http(s) URL; give a URL like http://127.0.0.1:PORT/ (`webrl sites serve` "
                       f"prints the embedded sites' URLs) or a task JSON file")
    else:
        raise MissingInput(f"{target}: no such task file (nor a URL: give http://... or a WebArena-Lite task JSON "
                           f"file)")

    async def start(env: WebEnv):
        try:
            return await env.reset(task, "play")
        except PlaywrightError as e:  # nothing listens there, a DNS name that does not resolve, ...
            said = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise BadInput(f"{task.get('start_url')}: the page did not load ({said}); is a server listening there? "
                           f"`webrl sites serve` prints the embedded sites' URLs (their ports change each start)") \
                from None

    async def loop() -> None:
        async with BrowserPool(cfg) as pool:
            env = WebEnv(pool, cfg, hooks)
            obs = await start(env)
            past: list[str] = []
            while True:
                text = build_prompt(env.task.get("intent", ""), past, obs.html, cfg.obs_char_budget) \
                    if show_prompt else obs.html
                console.rule(f"step {len(past)} | {obs.url} | {obs.n_elements} ids | obs {obs.obs_s * 1000:.0f} ms")
                console.print(text, markup=False, highlight=False)
                try:
                    line = await asyncio.to_thread(input, "action> ")
                except EOFError:
                    break
                if line.strip() in (":q", "quit", "exit"):
                    break
                obs, done, info = await env.step(line)
                past.append(line)
                if done:
                    console.print(f"episode over: status={env.status} answer={env.answer!r}")
                    try:
                        console.print(f"score = {await env.evaluate()}")
                    except Exception as e:  # a URL (no eval spec), a check that could not run: shown, not fatal
                        console.print(f"(not scored: {e}{by_url})", markup=False, highlight=False, soft_wrap=True)
                    break
            await env.close()

    asyncio.run(loop())

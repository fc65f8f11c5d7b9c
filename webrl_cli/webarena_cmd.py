"""`webrl webarena ...`: log in to the WebArena sites (real ones, or the embedded ones served as WebArena) and save
the storage states that tasks with ``require_login`` use."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional
from urllib.parse import urlsplit

import typer

app = typer.Typer(no_args_is_help=True)


@app.command()
def login(
    sites: Optional[str] = typer.Option(None, help="comma-separated sites to log in to (default: every site in "
                                                   "sites.urls that has a login: shopping, shopping_admin, gitlab, "
                                                   "reddit)"),
    auth_dir: Optional[Path] = typer.Option(None, "--auth-dir", help="folder for the states (default: sites.auth_dir)"),
    timeout: float = typer.Option(30.0, min=0.1, help="seconds per page load / element wait"),
    config: Optional[str] = typer.Option(None, "--config", "-c", help="config (path or packaged name)"),
    set_: List[str] = typer.Option([], "--set", "-s", help="section.key=value overrides"),
) -> None:
    """Sign in to each site with WebArena's account and write <auth_dir>/<site>_state.json, plus the combined
    <a>.<b>_state.json of each pair (multi-site tasks). Site URLs: sites.urls, or the SHOPPING, SHOPPING_ADMIN,
    GITLAB, REDDIT (or WA_...) environment variables; accounts: WEBARENA_<SITE>_USERNAME / _PASSWORD override
    WebArena's."""
    import asyncio

    from rich.console import Console
    from rich.table import Table

    from webrl_core.config_loader import load_config
    from webrl_core.env.webarena_login import LOGIN_SITES, login_sites, recipe_for

    settings = load_config(config, sets=set_)
    urls = settings.sites.urls
    if sites:
        wanted = [s.strip() for s in sites.split(",") if s.strip()]
        for s in wanted:
            recipe_for(s)  # ValueError naming the sites that have a login
    else:
        wanted = [s for s in LOGIN_SITES if s in urls]
        if not wanted:
            raise ValueError("no site with a login has a URL: set SHOPPING, SHOPPING_ADMIN, GITLAB and/or REDDIT "
                             "(or WA_SHOPPING, ...) to the sites' base URLs, or sites.urls in the config")
    folder = Path(auth_dir or settings.sites.auth_dir)
    out = asyncio.run(login_sites(urls, wanted, folder, settings.env, timeout_ms=int(timeout * 1000)))

    console = Console(width=max(Console().width, 120))  # the file names whole, also when piped
    table = Table(title=f"WebArena logins -> {folder}/")
    for col in ("site", "account", "login page", "state file", "s"):
        table.add_column(col, justify="right" if col == "s" else "left", overflow="fold")
    for row in out["logins"]:
        page = urlsplit(row["url"]).path or "/"
        if "error" in row:
            table.add_row(row["site"], row["account"], page, "[red]FAILED[/] (below)", "")
        else:
            table.add_row(row["site"], row["account"], page, Path(row["file"]).name, f"{row['seconds']:.1f}")
    for row in out["combined"]:
        name = Path(row["file"]).name if row.get("file") else f"[yellow]skipped[/]: {row['skipped']}"
        table.add_row("+".join(row["sites"]), "(merged)", "", name, "")
    console.print(table)
    failed = [row for row in out["logins"] if "error" in row]
    if failed:
        raise RuntimeError("\n".join(row["error"] for row in failed))


@app.command("local-setup")
def local_setup(
    out_dir: Optional[Path] = typer.Option(None, "--dir", help="folder for the inputs (default: "
                                           "runs/webarena-local-inputs, where configs/webarena-local.yaml reads them)"),
    demo_tasks: int = typer.Option(80, min=1, help="training tasks the oracle demonstrates (the SFT data)"),
    seed_tasks: int = typer.Option(24, min=1, help="training tasks in the seed task file (phase 0 rolls them out)"),
    data_seed: int = typer.Option(0, min=0, help="seed of the sites' data: the same as `webrl sites serve --data-seed`"),
    seed: int = typer.Option(0, min=0, help="seed of the task samples and of the models' initialisation"),
    arch: str = typer.Option("llama", help="architecture of the base and ORM models: llama or qwen2"),
    compat: str = typer.Option("webrl", help="prompt format of the SFT data (prompt.compat): webrl or official"),
    n_envs: int = typer.Option(4, min=1, help="browser contexts for the oracle's demonstrations"),
) -> None:
    """Write the real-model path's inputs for the embedded sites served as WebArena (`webrl sites serve`, URLs in
    SHOPPING, SHOPPING_ADMIN, GITLAB, REDDIT, MAP): an HF base model and ORM of a real architecture, the SFT data as
    a ShareGPT file from oracle demonstrations, seed and test task files in WebArena-Lite format. Then:
    `webrl train --config webarena-local`."""
    from webrl_core.config import LOCAL_INPUTS_DIR, EmbeddedModelConfig, EnvConfig
    from webrl_core.config_loader import env_site_urls
    from webrl_core.errors import BadInput
    from webrl_core.pipeline.local_webarena import prepare_local_inputs
    from webrl_core.prompts import COMPATS

    arches = EmbeddedModelConfig.model_fields["arch"].annotation.__args__
    for flag, value, allowed in (("--arch", arch, arches), ("--compat", compat, COMPATS)):
        if value not in allowed:
            raise BadInput(f"{flag} {value!r}: allowed {', '.join(allowed)}")
    model = EmbeddedModelConfig(hidden_size=128, intermediate_size=256, num_layers=2, num_heads=2, vocab_size=2048,
                                max_length=2048, arch=arch)  # head_dim 64: what vLLM's CPU attention takes
    paths = prepare_local_inputs(out_dir or Path(LOCAL_INPUTS_DIR), env_site_urls(), demo_tasks=demo_tasks,
                                 seed_tasks=seed_tasks, model=model, env_cfg=EnvConfig(n_envs=n_envs, max_steps=10), compat=compat,
                                 data_seed=data_seed, seed=seed)
    for field, path in paths.items():
        typer.echo(f"{field:>11}: {path}")
    typer.echo("next: webrl train --config webarena-local --phases 2")

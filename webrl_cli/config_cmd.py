"""`webrl config ...`."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

app = typer.Typer(no_args_is_help=True)

# the packaged configs, named in the help (listed from the folder: `webrl --help` stays fast)
PACKAGED = ", ".join(sorted(p.stem for p in (Path(__file__).resolve().parent.parent / "webrl_core" / "configs")
                            .glob("*.yaml")))


@app.command("show")
def show(file: Optional[str] = typer.Argument(None, help=f"config YAML: a path or a packaged name ({PACKAGED})"),
         overlay: List[str] = typer.Option([], "--overlay", "-o", help="overlay YAML files applied in order"),
         set_: List[str] = typer.Option([], "--set", "-s", help="section.key=value overrides"),
         doc: bool = typer.Option(False, "--doc", help="print every field with its description and default")):
    """Print the resolved config (defaults <- FILE <- overlays <- --set <- URL env vars)."""
    from rich.console import Console
    from rich.table import Table

    from webrl_core.config import RENAMED
    from webrl_core.config_loader import describe_fields, dump_config, load_config

    console = Console()
    if doc:
        table = Table(title="webrl config fields")
        for col in ("field", "default", "description"):
            table.add_column(col)
        for name, desc, default in describe_fields():
            table.add_row(name, repr(default), desc)
        console.print(table)
        renamed = Table(title="renamed fields (the old names still work, with a warning, until the next release)")
        for col in ("old name", "new name"):
            renamed.add_column(col)
        for old, new in RENAMED.items():
            renamed.add_row(old, new)
        console.print(renamed)
        return
    cfg = load_config(file, overlay, set_)  # a ConfigError is printed by webrl_cli.main
    typer.echo(dump_config(cfg), nl=False)


@app.command("list")
def list_packaged():
    """List the configs shipped with webrl."""
    from webrl_core.config_loader import packaged_config, packaged_config_names

    for n in packaged_config_names():
        typer.echo(f"{n}\t{packaged_config(n)}")

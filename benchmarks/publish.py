"""Where a `webrl bench` measurement goes: OUT.json (the numbers), OUT.png (the plot), one MLflow run in the
bench dir (a metric per row at the row's step, the two files as artifacts) and a table on the console, the same for
every bench program."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Iterable, Sequence


def publish(result: dict, out: str | Path, plot: Callable[[Path], Path], bench_dir: str | Path, run_name: str,
            settings, metrics: list[tuple[int, dict]], artifact_dir: str) -> Path:
    """Write ``result`` to OUT.json, ``plot(OUT.png)``, and log ``metrics`` ((step, {name: value}) per row) with
    both files under ``artifact_dir`` in an MLflow run ``run_name`` of the "webrl-bench" experiment; returns the
    JSON's path."""
    from webrl_core.runs import tracking

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    js = out.with_suffix(".json")
    js.write_text(json.dumps(result, indent=2))
    png = plot(out.with_suffix(".png"))
    with tracking.start_run(bench_dir, run_name, experiment="webrl-bench", config=settings.model_dump(mode="json")):
        for step, values in metrics:
            tracking.log_metrics(values, step=step)
        tracking.log_artifact(png, artifact_dir)
        tracking.log_artifact(js, artifact_dir)
    return js


def print_table(title: str, columns: Sequence[str], rows: Iterable[Sequence[str]]) -> None:
    """A bench program's numbers as one right-aligned rich table on the console."""
    from rich.console import Console
    from rich.table import Table

    t = Table(title=title)
    for col in columns:
        t.add_column(col, justify="right")
    for cells in rows:
        t.add_row(*cells)
    Console().print(t)


def save_figure(fig, path: str | Path, dpi: int = 110) -> Path:
    """Lay out, write and close a bench plot."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return Path(path)

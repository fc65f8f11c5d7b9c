"""What a run prints: our own progress lines and results; third-party output only when asked for.

By default the progress bars and info logs of transformers, datasets, huggingface_hub, TRL and MLflow are off, and
deprecation warnings raised from inside libraries (which a user cannot act on) are filtered: in this process by
``quiet_libraries`` and in every subprocess a run starts through the environment variables it sets (``QUIET_ENV``,
read by those libraries at import). ``webrl --verbose`` or ``WEBRL_VERBOSE=1`` keeps all of it.

Our own loops over a pass show ``track``'s bar: what it is, how many of how many, and the time elapsed.
"""

from __future__ import annotations

import logging
import os
import sys
import warnings
from typing import Iterable, Iterator, TypeVar

T = TypeVar("T")

VERBOSE_ENV = "WEBRL_VERBOSE"
# Read by the libraries themselves when they are imported (a subprocess inherits them).
QUIET_ENV = {
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",        # huggingface_hub, and transformers' tqdm follows it
    "HF_DATASETS_DISABLE_PROGRESS_BARS": "1",   # datasets' map/filter bars (TRL's "Building labels", "Truncating")
    "TRANSFORMERS_VERBOSITY": "error",
    "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1",
    "MLFLOW_LOGGING_LEVEL": "WARNING",           # "Creating initial MLflow database tables..."
}
# Deprecation warnings attributed to these packages come from their own code, not from ours.
LIBRARIES = ("transformers", "trl", "datasets", "accelerate", "peft", "torch", "huggingface_hub", "tokenizers",
             "prefect", "mlflow", "pydantic", "ray", "gguf", "starlette", "fastapi", "uvicorn", "websockets",
             "sqlalchemy", "alembic", "opentelemetry", "pkg_resources", "setuptools", "google", "pandas", "pyarrow")
_LIBRARY_MODULES = rf"^({'|'.join(LIBRARIES)})(\.|$)"


def is_verbose() -> bool:
    """Third-party output wanted: ``WEBRL_VERBOSE`` set to anything but empty or 0."""
    return os.environ.get(VERBOSE_ENV, "") not in ("", "0")


def quiet_libraries(verbose: bool | None = None) -> None:
    """Turn third-party bars, info logs and library-internal deprecation warnings off (idempotent); with
    ``verbose`` (default: ``is_verbose()``) leave them on and record the choice for subprocesses."""
    if verbose is None:
        verbose = is_verbose()
    if verbose:
        os.environ[VERBOSE_ENV] = "1"
        return
    for key, value in QUIET_ENV.items():
        os.environ.setdefault(key, value)
    for category in (DeprecationWarning, PendingDeprecationWarning, FutureWarning):
        warnings.filterwarnings("ignore", category=category, module=_LIBRARY_MODULES)
    # libraries imported before this call read the environment already: tell them directly
    if "mlflow" in sys.modules:
        logging.getLogger("mlflow").setLevel(logging.WARNING)
    if "huggingface_hub" in sys.modules:
        sys.modules["huggingface_hub"].utils.disable_progress_bars()
    if "transformers" in sys.modules:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
    if "datasets" in sys.modules:
        import datasets

        datasets.disable_progress_bars()
        datasets.utils.logging.set_verbosity_error()


def track(items: Iterable[T], description: str, total: int | None = None, disable: bool = False) -> Iterator[T]:
    """``items`` with a progress bar: the description, the bar, done of ``total`` (default ``len(items)``) and the time
    elapsed. rich's own ``track`` ends its line with the time *remaining* until the bar is full, which a loop that
    stops early (the replay's scoring stops at its cap) leaves on screen as if it were the pass's duration. An item
    counts as done when the loop asks for the next one or stops after it."""
    if disable:
        yield from items
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()) as bar:
        task = bar.add_task(description, total=len(items) if total is None else total)
        for item in items:
            try:
                yield item
            finally:  # a loop that breaks after this item closes the generator here
                bar.advance(task)

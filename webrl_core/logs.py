"""What a run prints: our own progress lines and results; third-party output only when asked for.

By default the progress bars and info logs of transformers, datasets, huggingface_hub, TRL and MLflow are off, and
deprecation warnings raised from inside libraries (which a user cannot act on) are filtered: in this process by
``quiet_libraries`` and in every subprocess a run starts through the environment variables it sets (``QUIET_ENV``,
read by those libraries at import). ``webrl --verbose`` or ``WEBRL_VERBOSE=1`` keeps all of it.
"""

from __future__ import annotations

import logging
import os
import sys
import warnings

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

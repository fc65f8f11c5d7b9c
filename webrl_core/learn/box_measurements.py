"""What a box measures about itself and keeps: the switch that turns measuring off, and the JSON files that keep
each measurement per CPU (``~/.cache/webrl/*.json``) so a box measures each shape once.

Used by the micro-batch and scoring-batch calibration (:mod:`webrl_core.learn.micro_batch`), the decode forms
(:mod:`webrl_core.agent.decode_linear`) and the attention crossover (:mod:`webrl_core.learn.matmul_attention`).
``WEBRL_CALIBRATE=0`` keeps every fixed default, as the test suite does for its exact comparisons.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

from webrl_core.artifacts import replace_text

CALIBRATE_ENV = "WEBRL_CALIBRATE"


def enabled() -> bool:
    """Whether this process measures its shapes (``WEBRL_CALIBRATE``, on unless 0 / false / no)."""
    return os.environ.get(CALIBRATE_ENV, "1") not in ("0", "false", "no")


def read_kept(path: Path) -> dict:
    """The measurements kept in a JSON cache file (``{key: entry}``; empty when missing or unreadable)."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def keep(path: Path, key: str, entry: dict) -> None:
    """Add one measurement to a JSON cache file, atomically; a read-only home keeps nothing (measured again)."""
    with contextlib.suppress(OSError):
        replace_text(path, json.dumps(read_kept(path) | {key: entry}, indent=1, sort_keys=True))

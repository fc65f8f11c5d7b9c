"""Quiet third-party output by default (webrl_core/logs.py), all of it with WEBRL_VERBOSE=1; each case runs in a
fresh interpreter so the libraries are imported after (or before) the switch as in a real run."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

PROGRAM = r"""
import sys, warnings
from webrl_core.logs import quiet_libraries
early = sys.argv[1] == "early"
if early:
    import datasets, transformers  # imported before the switch: told directly
quiet_libraries()
import datasets, transformers
datasets.Dataset.from_dict({"x": list(range(50))}).map(lambda r: r, desc="Building labels")
transformers.utils.logging.get_logger("transformers.modeling_utils").info("an info line from transformers")
transformers.utils.logging.get_logger("transformers.modeling_utils").warning("a warning from transformers")
warnings.warn_explicit("old api", FutureWarning, "x.py", 1, module="transformers.trainer")
warnings.warn_explicit("our own deprecation", FutureWarning, "y.py", 1, module="webrl_core.config")
"""


def _run(order: str, verbose: bool) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "TRANSFORMERS_", "WEBRL_VERBOSE"))}
    if verbose:
        env["WEBRL_VERBOSE"] = "1"
    p = subprocess.run([sys.executable, "-c", PROGRAM, order], capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0, p.stderr
    return p.stdout + p.stderr


@pytest.mark.parametrize("order", ["late", "early"])
def test_default_run_hides_library_bars_logs_and_their_deprecations(order):
    out = _run(order, verbose=False)
    assert "Building labels" not in out
    assert "an info line" not in out and "a warning from transformers" not in out
    assert "old api" not in out
    assert "our own deprecation" in out  # a warning about our code is ours to act on: kept


def test_verbose_shows_them():
    out = _run("late", verbose=True)
    assert "Building labels" in out
    assert "a warning from transformers" in out
    assert "old api" in out and "our own deprecation" in out


def test_a_loop_stopped_early_leaves_how_far_it_got_and_the_time_it_took(capsys):
    """The replay's scoring stops at its cap: the bar keeps the items done of the total and the time elapsed, where
    rich's own ``track`` showed its estimate of the time left for the items never scored."""
    from webrl_core.logs import track

    seen = []
    for i in track(range(10), "scoring"):
        seen.append(i)
        if i == 3:
            break
    out = capsys.readouterr().out
    assert seen == [0, 1, 2, 3]
    last = [line for line in out.replace("\r", "\n").splitlines() if "scoring" in line][-1]
    assert "4/10" in last and last.rstrip().endswith("0:00:00"), last  # 4 done, elapsed under a second
    assert list(track(iter("abc"), "quiet", total=3, disable=True)) == ["a", "b", "c"]
    assert "quiet" not in capsys.readouterr().out

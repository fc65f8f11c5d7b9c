"""`webrl bench train --model M --compare REF`: the same stages measured by an earlier commit's code and by this
checkout's, one run after the other on the same box, in one command.

On a shared or throttled box the rates drift by 2-4x within minutes (an AMX Xeon's bf16 matmul peak measured 522,
631 and 2,320 GFLOP/s in three runs of one hour), so a speed-up is only read from figures taken back to back. REF
(any git revision) is checked out in a temporary ``git worktree`` and its own ``webrl bench train --model`` runs
there in a subprocess with this environment's interpreter and packages (``PYTHONPATH`` = the worktree), with the
options both versions know; this checkout's run follows in the same process. The table gives each stage's tokens/s
for both and the ratio now / REF.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]  # the checkout: benchmarks/ sits at its top


def _git(*args: str, cwd: Path = REPO) -> str:
    done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)
    if done.returncode:
        raise ValueError(f"--compare: git {' '.join(args)} failed in {cwd}: {done.stderr.strip() or done.stdout}")
    return done.stdout.strip()


def reference_run(ref: str, argv: list[str]) -> dict:
    """``webrl bench train <argv> --out FILE`` by the code of git revision ``ref``; its JSON result, with the
    revision's short hash as ``ref``."""
    commit = _git("rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")
    with tempfile.TemporaryDirectory(prefix="webrl-bench-compare-") as tmp:
        tree, out = Path(tmp) / "tree", Path(tmp) / "ref.json"
        _git("worktree", "add", "--detach", str(tree), commit)
        try:
            env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), os.environ.get("PYTHONPATH", "")])}
            cmd = [sys.executable, "-c", "from webrl_cli.main import app; app()", "bench", "train", *argv,
                   "--out", str(out)]
            print(f"--compare {ref}: the stages by {commit[:10]}'s code first", flush=True)
            done = subprocess.run(cmd, cwd=tree, env=env)
            if done.returncode or not out.is_file():
                raise RuntimeError(f"--compare {ref}: its bench train exited with {done.returncode}")
            result = json.loads(out.read_text())
        finally:
            _git("worktree", "remove", "--force", str(tree))
    return result | {"ref": commit[:10]}


def stage_ratios(ref: dict, ours: dict) -> list[dict]:
    """Per stage present in both: tokens/s by REF and now, and now / REF."""
    theirs = {s["stage"]: s for s in ref["stages"]}
    rows = []
    for s in ours["stages"]:
        if s["stage"] in theirs:
            r = theirs[s["stage"]]["tokens"] / theirs[s["stage"]]["seconds"]
            rows.append({"stage": s["stage"], "ref_tokens_per_s": r, "tokens_per_s": s["tokens_per_s"],
                         "ratio": s["tokens_per_s"] / r})
    return rows

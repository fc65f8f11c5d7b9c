"""Loss histories of trainings: the ``loss_history.json`` each training (bootstrap SFT, ORM, critic, actor) writes
into the folder of the model it saves, and where a run dir's trainings and their histories are.

The file lives inside the model folder, so it is part of that versioned, content-addressed artifact: a cached
re-run points at the same folder and still has it. It holds only what training computed (no wall times), so the
same training writes the same bytes and the folder's digest stays reproducible::

    {"training": "sft" | "orm" | "critic" | "actor", "logging_steps": n, "max_steps": N, "global_step": N,
     "history": [{"step": s, "loss": l, "epoch": e, "learning_rate": lr, "grad_norm": g}, ...]}

``history`` is the Trainer's logged training steps (``TrainerState.log_history`` entries with a loss; each loss is
the mean over its logging window of ``logging_steps`` optimizer steps and, under DDP, over the ranks).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

FILE = "loss_history.json"
TRAININGS = ("sft", "orm", "critic", "actor")
"""The trainings of a run, in the order a run does them."""
TITLES = {"sft": "SFT", "orm": "ORM", "critic": "critic", "actor": "actor"}
_FIELDS = ("step", "loss", "epoch", "learning_rate", "grad_norm")


def history_entries(log_history: list[dict]) -> list[dict]:
    """The logged training steps of a ``TrainerState.log_history``: [{step, loss, epoch, learning_rate, grad_norm}]
    (the fields a step logged; the final summary entry, which has ``train_loss`` and timings, is left out)."""
    return [{k: (int(h[k]) if k == "step" else float(h[k])) for k in _FIELDS if h.get(k) is not None}
            for h in log_history if "loss" in h and "step" in h]


def write(out_dir: str | Path, training: str, state) -> Path:
    """Write the loss history of a finished training (its ``TrainerState``) into the model folder ``out_dir``."""
    if training not in TRAININGS:
        raise ValueError(f"unknown training {training!r}; one of {TRAININGS}")
    out = Path(out_dir) / FILE
    out.parent.mkdir(parents=True, exist_ok=True)
    doc = {"training": training, "logging_steps": state.logging_steps, "max_steps": state.max_steps,
           "global_step": state.global_step, "history": history_entries(state.log_history)}
    tmp = out.with_name(f".{FILE}.{os.getpid()}.tmp")  # atomic; *.tmp files are not part of a folder's digest
    tmp.write_text(json.dumps(doc, indent=1, sort_keys=True))
    os.replace(tmp, out)
    return out


def read(model_dir: str | Path) -> dict | None:
    """The loss history in a model folder; None when the folder has none (a model we did not train)."""
    f = Path(model_dir) / FILE
    return json.loads(f.read_text()) if f.is_file() else None


def label(phase: int, training: str) -> str:
    """How plots name a training: "bootstrap SFT", "bootstrap ORM", "phase 2 critic", "phase 2 actor"."""
    return f"{'bootstrap' if phase == 0 else f'phase {phase}'} {TITLES.get(training, training)}"


def run_trainings(run_dir: str | Path) -> list[dict]:
    """[{phase, training, label, path, history, ...the file's fields}] of every model of a run dir
    (``models/phase=k/{actor,critic,orm}``) that holds a loss history, by phase and then training order."""
    out = []
    for f in (Path(run_dir) / "models").glob(f"phase=*/*/{FILE}"):
        if f.parent.name.startswith("."):  # a publish's temporary link, not a model of the run
            continue
        phase = int(f.parent.parent.name.split("=")[1])
        doc = json.loads(f.read_text())
        out.append({**doc, "phase": phase, "label": label(phase, doc["training"]), "path": str(f)})
    order = {t: i for i, t in enumerate(TRAININGS)}
    return sorted(out, key=lambda d: (d["phase"], order.get(d["training"], len(order))))

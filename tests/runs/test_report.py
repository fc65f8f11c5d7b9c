"""The plots a researcher reads, from the files a run writes: each training's loss against its optimizer steps
(``losses.png``, from the ``loss_history.json`` in each trained model's folder), the curriculum funnel with the kept
tasks' solve rate, the ORM's agreement with the sites' evaluators, and their publication with a phase's report to
the phase's MLflow run. Run dirs are built from real files: versioned model folders published as links, loss
histories written from real ``TrainerState``s, reports and evaluations as the flows write them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from transformers import TrainerState

from webrl_core.artifacts import ArtifactRef
from webrl_core.runs import loss_history, report, tracking
from webrl_core.runs.rundir import publish, versioned
from webrl_core.websites import SITES

DPI = 110  # report._save


def _state(steps: int, loss0: float, every: int = 1) -> TrainerState:
    """A finished Trainer's state: a loss logged every ``every`` steps, then the summary entry with timings."""
    logs = [{"loss": loss0 / s, "grad_norm": 1.0 / s, "learning_rate": 1e-3, "epoch": s / steps, "step": s}
            for s in range(every, steps + 1, every)]
    logs.append({"train_runtime": 12.3, "train_samples_per_second": 4.5, "train_loss": loss0 / 2, "epoch": 1.0,
                 "step": steps})
    return TrainerState(max_steps=steps, global_step=steps, logging_steps=every, log_history=logs)


def _model(run_dir: Path, phase: int, name: str, training: str | None, steps: int = 0, loss0: float = 1.0) -> Path:
    """models/phase=k/<name>: a versioned folder published as a link, as the stages write it, with the loss
    history of ``training`` (None: a model that was not trained, like the phase-0 critic)."""
    real = versioned(run_dir / "models" / f"phase={phase}" / name, f"{name}{phase}")
    real.mkdir(parents=True)
    (real / "model.safetensors").write_bytes(b"weights of " + name.encode())
    if training:
        loss_history.write(real, training, _state(steps, loss0))
    publish(run_dir / "models" / f"phase={phase}" / name, real)
    return real


def _report(run_dir: Path, phase: int, metrics: dict) -> None:
    (run_dir / "reports").mkdir(parents=True, exist_ok=True)
    (run_dir / "reports" / f"phase={phase}.json").write_text(json.dumps(metrics))


def _eval(run_dir: Path, phase: int, solved: int) -> None:
    (run_dir / "eval").mkdir(parents=True, exist_ok=True)
    sites = {s: {"n": 2, "success": min(solved, 2), "failed": 2 - min(solved, 2), "errors": 0} for s in SITES}
    total = {"n": 2 * len(SITES), "success": min(solved, 2) * len(SITES),
             "failed": (2 - min(solved, 2)) * len(SITES), "errors": 0}
    (run_dir / "eval" / f"phase={phase}.json").write_text(json.dumps({"sites": sites, "total": total}))


def _png_size(path: Path) -> tuple[int, int]:
    """(width, height) in pixels, from the PNG's header."""
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n", path
    return int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")


def test_a_loss_history_holds_the_logged_steps_and_is_part_of_the_model_artifact(tmp_path):
    folder = tmp_path / "actor"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"w")
    before = ArtifactRef.of(folder, "model").sha256
    loss_history.write(folder, "actor", _state(6, 3.0, every=2))
    doc = loss_history.read(folder)
    assert doc["training"] == "actor" and doc["logging_steps"] == 2 and doc["global_step"] == 6
    assert [(h["step"], h["loss"]) for h in doc["history"]] == [(2, 1.5), (4, 0.75), (6, 0.5)]
    assert set(doc["history"][0]) == {"step", "loss", "epoch", "learning_rate", "grad_norm"}
    # no timings: the same training writes the same bytes, so the model folder's digest stays reproducible
    first = (folder / loss_history.FILE).read_bytes()
    again = _state(6, 3.0, every=2)
    again.log_history[-1]["train_runtime"] = 99.0
    loss_history.write(folder, "actor", again)
    assert (folder / loss_history.FILE).read_bytes() == first and b"runtime" not in first
    assert ArtifactRef.of(folder, "model").sha256 != before  # inside the cached artifact, not beside it
    assert loss_history.read(tmp_path) is None
    with pytest.raises(ValueError, match="unknown training 'dpo'"):
        loss_history.write(folder, "dpo", again)


def test_losses_plot_has_a_panel_per_kind_of_training_and_a_line_per_training(tmp_path):
    run = tmp_path / "run"
    _model(run, 0, "actor", "sft", steps=20, loss0=4.0)
    _model(run, 0, "orm", "orm", steps=8)
    _model(run, 0, "critic", None)  # initialised, not trained: no line
    for k in (1, 2):
        _model(run, k, "critic", "critic", steps=3 + k)
        _model(run, k, "actor", "actor", steps=5 * k)
    panels = report.loss_panels(run)
    assert [(kind, [t["label"] for t in ts]) for kind, ts in panels] == [
        ("sft", ["bootstrap SFT"]), ("orm", ["bootstrap ORM"]), ("critic", ["phase 1 critic", "phase 2 critic"]),
        ("actor", ["phase 1 actor", "phase 2 actor"])]
    assert [h["step"] for h in panels[3][1][1]["history"]] == list(range(1, 11))  # every step of phase 2's actor
    assert panels[0][1][0]["history"][-1] == pytest.approx(
        {"step": 20, "loss": 0.2, "epoch": 1.0, "learning_rate": 1e-3, "grad_norm": 0.05})
    out = report.plot_losses(run)
    assert out == run / "plots" / "losses.png"
    assert _png_size(out) == (round(2 * 5.5 * DPI), round(2 * 3.6 * DPI))  # four panels, 2 x 2

    boot = tmp_path / "boot"  # after the bootstrap: SFT and ORM side by side
    _model(boot, 0, "actor", "sft", steps=4)
    _model(boot, 0, "orm", "orm", steps=4)
    assert [kind for kind, _ in report.loss_panels(boot)] == ["sft", "orm"]
    assert _png_size(report.plot_losses(boot)) == (round(2 * 5.5 * DPI), round(3.6 * DPI))
    assert report.plot_losses(tmp_path / "empty") is None


def _phase_metrics(generated, kept, review, episodes, solved, yes, **extra) -> dict:
    return {"generated": generated, "kept_by_critic": kept - 1, "kept": kept, "kept_by_review": review,
            "rollout_episodes": episodes, "episodes": episodes, "unscored": 0, "env_successes": solved,
            "orm_yes": yes, "kept_solve_rate": solved / review, **extra}


def test_funnel_counts_every_stage_and_the_kept_tasks_solve_rate(tmp_path):
    _report(tmp_path, 0, {"oracle_success_rate": 1.0})
    assert report.plot_funnel(tmp_path) is None  # no curriculum before phase 1
    _report(tmp_path, 1, _phase_metrics(20, 10, 8, 8, 2, 3))
    # a report written before the counts existed: they follow from the rates over the scored episodes
    _report(tmp_path, 2, {"generated": 16, "kept_by_critic": 6, "kept": 6, "kept_by_review": 6,
                          "rollout_episodes": 6, "episodes": 6, "unscored": 1, "env_success_rate": 0.4,
                          "orm_success_rate": 0.5})
    counts = [report.funnel_counts(m) for _, m in report._phases(tmp_path, "reports")[1:]]
    assert counts == [{"generated": 20, "kept": 10, "kept_by_review": 8, "rollout_episodes": 8, "env_successes": 2,
                       "orm_yes": 3},
                      {"generated": 16, "kept": 6, "kept_by_review": 6, "rollout_episodes": 6, "env_successes": 2,
                       "orm_yes": 3}]
    out = report.plot_funnel(tmp_path)
    assert out == tmp_path / "plots" / "curriculum_funnel.png" and _png_size(out) == (7 * DPI, round(4.2 * DPI))


def test_orm_agreement_per_phase_and_on_the_bootstraps_held_out_examples(tmp_path):
    assert report.plot_orm_agreement(tmp_path) is None
    _report(tmp_path, 0, {"orm_heldout_accuracy": 0.9, "orm_heldout_precision": 0.8, "orm_heldout_recall": 1.0,
                          "orm_heldout_examples": 10})
    _report(tmp_path, 1, _phase_metrics(20, 10, 8, 8, 2, 3, orm_accuracy=0.75, orm_precision=0.5, orm_recall=1.0))
    _report(tmp_path, 2, _phase_metrics(20, 10, 8, 8, 2, 3, orm_accuracy=0.5, orm_precision=0.25, orm_recall=0.5,
                                        unscored=2))
    assert report.orm_agreement(tmp_path) == [
        {"phase": 0, "on": "held-out", "n": 10, "accuracy": 0.9, "precision": 0.8, "recall": 1.0},
        {"phase": 1, "on": "rollouts", "n": 8, "accuracy": 0.75, "precision": 0.5, "recall": 1.0},
        {"phase": 2, "on": "rollouts", "n": 6, "accuracy": 0.5, "precision": 0.25, "recall": 0.5}]
    out = report.plot_orm_agreement(tmp_path)
    assert out == tmp_path / "plots" / "orm_agreement.png" and _png_size(out) == (6 * DPI, 4 * DPI)


def test_publish_phase_writes_the_report_and_logs_every_plot_to_mlflow(tmp_path, monkeypatch):
    import mlflow

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    run = tmp_path / "run"
    _model(run, 0, "actor", "sft", steps=6)
    _model(run, 0, "orm", "orm", steps=4)
    _model(run, 1, "critic", "critic", steps=3)
    _model(run, 1, "actor", "actor", steps=3)
    _report(run, 0, {"orm_heldout_accuracy": 1.0, "orm_heldout_precision": 1.0, "orm_heldout_recall": 1.0,
                     "orm_heldout_examples": 4})
    _eval(run, 0, 0)
    _eval(run, 1, 1)
    metrics = _phase_metrics(12, 6, 6, 6, 3, 2, orm_accuracy=0.5, orm_precision=0.5, orm_recall=0.33)
    with tracking.start_run(run, "webrl-phase-1") as r:
        md = report.publish_phase(run, 1, metrics)
    assert json.loads((run / "reports" / "phase=1.json").read_text())["kept_solve_rate"] == 0.5
    assert "kept_solve_rate" in md
    names = {"success_per_site.png", "losses.png", "curriculum_funnel.png", "orm_agreement.png"}
    assert {p.name for p in (run / "plots").iterdir()} == names
    logged = mlflow.MlflowClient(tracking.tracking_uri(run)).list_artifacts(r.info.run_id, "plots")
    assert {Path(a.path).name for a in logged} == names

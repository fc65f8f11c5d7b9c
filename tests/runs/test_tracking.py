from pathlib import Path

from webrl_core.runs import tracking
from webrl_core.artifacts import ArtifactRef, read_json, sha256_path, write_json
from webrl_core.config_loader import load_config


def test_mlflow_run_is_read_back_with_client(tmp_path, monkeypatch):
    import mlflow

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    cfg = load_config("smoke")
    plot = tmp_path / "plot.txt"
    plot.write_text("a plot")
    with tracking.start_run(tmp_path, "webrl-train", config=cfg.model_dump(mode="json")) as parent:
        tracking.log_metrics({"success_rate": 0.25}, step=0)
        with tracking.start_run(tmp_path, "webrl-phase-1") as child:
            tracking.log_metrics({"success_rate": 0.5, "orm_accuracy": 0.9}, step=1)
            tracking.log_artifact(plot, "plots")
    assert (tmp_path / "mlflow.db").exists()
    client = mlflow.MlflowClient(tracking.tracking_uri(tmp_path))
    p = client.get_run(parent.info.run_id)
    c = client.get_run(child.info.run_id)
    assert p.data.params["env.max_steps"] == str(cfg.env.max_steps) and p.data.params["run.name"] == "smoke"
    assert p.data.metrics["success_rate"] == 0.25 and c.data.metrics["orm_accuracy"] == 0.9
    assert c.data.tags["mlflow.parentRunId"] == parent.info.run_id
    arts = [a.path for a in client.list_artifacts(child.info.run_id, "plots")]
    assert arts == ["plots/plot.txt"]
    # artifacts live in the run dir, not the cwd
    assert any(Path(tmp_path, "mlartifacts").rglob("plot.txt"))


def test_artifact_refs_are_content_addressed(tmp_path):
    a = write_json({"x": 1}, tmp_path / "a.json")
    b = write_json({"x": 1}, tmp_path / "sub" / "b.json")
    assert a.sha256 == b.sha256 and a.path != b.path
    assert read_json(a) == {"x": 1} and a.verify()
    (tmp_path / "a.json").write_text('{"x": 2}')
    assert not a.verify()
    d = tmp_path / "model"
    d.mkdir()
    (d / "w.bin").write_bytes(b"123")
    h1 = sha256_path(d)
    (d / "w.bin").write_bytes(b"124")
    assert sha256_path(d) != h1
    assert ArtifactRef.of(d).kind == "folder"

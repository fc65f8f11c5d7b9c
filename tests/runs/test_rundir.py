"""Versioned outputs (webrl_core/runs/rundir.py): a version is named by the settings, the inputs AND the library code
that made it, so a re-run after a code change never rewrites the version a cached result points at."""

from pathlib import Path

from webrl_core.runs import rundir
from webrl_core.config_loader import load_config


def test_output_key_changes_with_settings_inputs_and_library_code(monkeypatch):
    s = load_config("smoke")
    key = rundir.output_key(s.bootstrap, "input-a")
    assert key == rundir.output_key(s.bootstrap, "input-a")
    assert key != rundir.output_key(s.bootstrap, "input-b")
    assert key != rundir.output_key(s.bootstrap.model_copy(update={"sft_epochs": 3.0}), "input-a")
    monkeypatch.setattr(rundir, "library_source_digest", lambda: "0" * 64)  # the library's code changed
    assert key != rundir.output_key(s.bootstrap, "input-a")


def test_a_rerun_after_a_code_change_keeps_the_published_version(tmp_path, monkeypatch):
    s = load_config("smoke")
    out = tmp_path / "models" / "phase=0" / "actor"
    out.parent.mkdir(parents=True)
    first = rundir.versioned(out, rundir.output_key(s.bootstrap, "demos"))
    first.mkdir()
    (first / "weights").write_text("first")
    rundir.publish(out, first)
    monkeypatch.setattr(rundir, "library_source_digest", lambda: "1" * 64)
    second = rundir.versioned(out, rundir.output_key(s.bootstrap, "demos"))
    assert second != first and (first / "weights").read_text() == "first"  # not emptied for the re-run
    second.mkdir()
    (second / "weights").write_text("second")
    rundir.publish(out, second)
    assert (out / "weights").read_text() == "second" and Path(first / "weights").read_text() == "first"


def test_library_source_digest_is_the_library_code_identity(tmp_path):
    import shutil

    import webrl_core
    from webrl_core.runs.code_identity import CodeIndex

    copy = tmp_path / "webrl_core"
    shutil.copytree(Path(webrl_core.__file__).parent, copy, ignore=shutil.ignore_patterns("__pycache__"))
    assert CodeIndex(copy).library_identity() == rundir.library_source_digest()
    (copy / "runs" / "rundir.py").write_text((copy / "runs" / "rundir.py").read_text() + "\n# a comment\n")
    assert CodeIndex(copy).library_identity() == rundir.library_source_digest()
    (copy / "runs" / "rundir.py").write_text((copy / "runs" / "rundir.py").read_text() + "\nLIMIT = 3\n")
    assert CodeIndex(copy).library_identity() != rundir.library_source_digest()

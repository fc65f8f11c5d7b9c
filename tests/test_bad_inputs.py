"""Bad input a user will produce: each gets one clear error naming the file, the field or the value, and
nothing stored is changed, dropped or silently reused (issue "Trustworthy runs", item 7)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from webrl_core.pipeline import validate as V
from webrl_core.config_loader import ConfigError, load_config
from webrl_core.env import webarena as wa
from webrl_core.learn.model_folder import ModelFolderError, check_model_folder
from webrl_core.runs.store import StoreError, TrajectoryStore

REPO = Path(__file__).resolve().parent.parent
FIXTURE = REPO / "tests" / "fixtures" / "webarena" / "mini_lite.raw.json"


def raw_tasks() -> list[dict]:
    return json.loads(FIXTURE.read_text())


def write_json(path: Path, obj) -> Path:
    path.write_text(json.dumps(obj))
    return path


# ------------------------------------------------------------------------------------------------ configs
def test_config_wrong_type_unknown_key_and_non_utf8_name_the_field_and_file(tmp_path):
    with pytest.raises(ConfigError, match=r"field 'env.max_steps'.*got 'abc'"):
        load_config("smoke", sets=["env.max_steps=abc"])
    with pytest.raises(ConfigError, match=r"field 'env.max_stepz': unknown key; allowed keys here: .*max_steps"):
        load_config("smoke", sets=["env.max_stepz=3"])
    binary = tmp_path / "bin.yaml"
    binary.write_bytes(b"\xff\xfe\x00run: 1")
    with pytest.raises(ConfigError, match=rf"{binary}: not UTF-8"):
        load_config(binary)
    child = tmp_path / "child.yaml"
    child.write_text("extends: no-such-parent\n")
    with pytest.raises(ConfigError, match=r"'no-such-parent' \(referenced from .*child.yaml\)"):
        load_config(child)


def test_site_url_without_scheme_names_the_env_var():
    with pytest.raises(ConfigError, match=r"env GITLAB[\s\S]*'localhost:8023' is not an http\(s\) URL.*GITLAB"):
        load_config("smoke", environ={"GITLAB": "localhost:8023"})


# ------------------------------------------------------------------------------------------------ task files
@pytest.mark.parametrize("case, pattern", [
    ("truncated", r"not valid JSON"),
    ("empty", r"the task list is empty"),
    ("unknown_eval", r"task #1 \(task_id=1\): field 'eval.eval_types': unknown eval type 'llm_judge'"),
    ("no_start_url", r"task #1 \(task_id=1\): field 'start_url': missing"),
    ("binary", r"not UTF-8"),
])
def test_bad_task_files_name_the_file_task_and_field(tmp_path, case, pattern):
    tasks = raw_tasks()[:2]
    f = tmp_path / f"{case}.json"
    if case == "truncated":
        f.write_text(json.dumps(tasks)[:-40])
    elif case == "empty":
        write_json(f, [])
    elif case == "unknown_eval":
        tasks[1]["eval"]["eval_types"] = ["string_match", "llm_judge"]
        write_json(f, tasks)
    elif case == "no_start_url":
        del tasks[1]["start_url"]
        write_json(f, tasks)
    else:
        f.write_bytes(b"\x89PNG\r\n\x1a\n\xff\xff")
    with pytest.raises(wa.TaskFileError, match=pattern) as ei:
        wa.read_task_file(f)
    assert str(f) in str(ei.value)


def test_placeholder_without_url_fails_up_front_instead_of_erroring_every_episode(tmp_path):
    wiki = write_json(tmp_path / "wiki.json", [raw_tasks()[6]])  # __WIKIPEDIA__ |AND| __MAP__
    embedded = load_config("smoke", sets=[f"eval.test_set={wiki}"], environ={})
    with pytest.raises(V.BadInputError, match=r"task #0 \(task_id=6\) needs site\(s\) \['wikipedia'\] \(__WIKIPEDIA__\)"
                       r"[\s\S]*embedded sites serve"):
        V.check_task_file(embedded)
    webarena = load_config("smoke", sets=[f"eval.test_set={wiki}", "sites.mode=webarena"],
                           environ={"MAP": "http://127.0.0.1:3000"})
    with pytest.raises(V.BadInputError, match=r"WIKIPEDIA=<url>"):
        V.check_task_file(webarena)
    from webrl_core.sites.server import SITE_APPS

    assert set(V.SITES) == set(SITE_APPS)
    # the library: substitute only what is configured, keep the rest for the embedded sites, or fail by name
    kept = wa.load_webarena_tasks(FIXTURE, {"gitlab": "http://h:1/"}, missing="keep")
    assert kept[2]["start_url"] == "http://h:1" and kept[0]["start_url"] == "__SHOPPING_ADMIN__"
    with pytest.raises(wa.TaskFileError, match=r"task #6 \(task_id=6\) needs site\(s\) \['map', 'wikipedia'\]"):
        wa.load_webarena_tasks(FIXTURE, {"gitlab": "http://h:1"}, missing="error")


def test_empty_or_missing_test_set(tmp_path):
    empty = write_json(tmp_path / "empty.json", [])
    with pytest.raises(wa.TaskFileError, match=rf"{empty}: the task list is empty"):
        V.check_task_file(load_config("smoke", sets=[f"eval.test_set={empty}"], environ={}))
    with pytest.raises(V.BadInputError, match=r"eval.test_set: no file '.*nope.json'"):
        V.check_task_file(load_config("smoke", sets=[f"eval.test_set={tmp_path / 'nope.json'}"], environ={}))
    with pytest.raises(V.BadInputError, match="the test set is empty"):
        V.check_test_set([], "embedded test set (eval.max_tasks=...)")
    with pytest.raises(ConfigError, match=r"field 'eval.max_tasks'.*greater than or equal to 1 \(got 0\)"):
        load_config("smoke", sets=["eval.max_tasks=0"])


# ------------------------------------------------------------------------------------------------ model folders
def fake_model(folder: Path, weights=True, tokenizer=True, model_type="llama") -> Path:
    """A folder that looks like an HF checkpoint (only what the checks read; never loaded)."""
    import torch
    from safetensors.torch import save_file

    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"model_type": model_type, "architectures": ["X"]}))
    if weights:
        save_file({"w": torch.zeros(64, 64)}, str(folder / "model.safetensors"))
    if tokenizer:
        (folder / "tokenizer.json").write_text("{}")
    return folder


def test_model_folders_name_the_missing_or_broken_file(tmp_path):
    check_model_folder(fake_model(tmp_path / "ok"))
    with pytest.raises(ModelFolderError, match=r"no_w: no weights \(none of model.safetensors"):
        check_model_folder(fake_model(tmp_path / "no_w", weights=False))
    with pytest.raises(ModelFolderError, match=r"no_t: no tokenizer .*it has: config.json, model.safetensors"):
        check_model_folder(fake_model(tmp_path / "no_t", tokenizer=False))
    with pytest.raises(ModelFolderError, match=r"arch/config.json: model_type 'frobnicator' is not an architecture"):
        check_model_folder(fake_model(tmp_path / "arch", model_type="frobnicator"))
    cut = fake_model(tmp_path / "cut")
    data = (cut / "model.safetensors").read_bytes()
    (cut / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelFolderError, match=r"cut/model.safetensors: \d+ bytes but its header describes \d+"):
        check_model_folder(cut)
    with pytest.raises(FileNotFoundError, match=r"--model: model folder '.*missing' does not exist"):
        V.check_model(tmp_path / "missing", "--model")
    with pytest.raises(ModelFolderError, match=r"models.orm: .*config.json' is a file"):
        V.check_model(cut / "config.json", "models.orm")


# ------------------------------------------------------------------------------------------------ store
def _store_with_episodes(run_dir: Path, n: int = 3) -> TrajectoryStore:
    store = TrajectoryStore(run_dir)
    store.write_episodes([({"episode_id": f"e{i}", "task_id": f"t{i}", "phase": 0, "status": "done", "success": True,
                            "purpose": "eval", "site": "map"}, [{"prompt": "p" * 2000, "response": "r"}])
                          for i in range(n)])
    store.write_episodes([({"episode_id": "late", "task_id": "t9", "phase": 0, "status": "done", "success": False,
                            "purpose": "eval", "site": "map"}, [{"prompt": "q", "response": "r"}])])
    return store


def test_truncated_parquet_names_the_file_and_loses_nothing(tmp_path):
    store = _store_with_episodes(tmp_path)
    f = sorted((tmp_path / "store" / "episodes").glob("phase=*/*.parquet"))[-1]
    before = {p: p.read_bytes() for p in (tmp_path / "store").rglob("*.parquet")}
    f.write_bytes(before[f][: len(before[f]) // 2])
    with pytest.raises(StoreError, match=rf"1 damaged Parquet file[\s\S]*{f}[\s\S]*move the batch's files aside") as ei:
        store.sql("SELECT count(*) FROM episodes")
    with pytest.raises(StoreError, match=str(f)):
        V.check_store(tmp_path)
    assert sorted((tmp_path / "store").rglob("*.parquet")) == sorted(before)  # nothing moved or deleted
    # the advice works: the batch's files go to quarantine/ and the rest reads again
    cmd = next(line.strip() for line in str(ei.value).splitlines() if line.strip().startswith("cd "))
    subprocess.run(cmd, shell=True, check=True)
    assert sorted(e["episode_id"] for e in store.sql("SELECT episode_id FROM episodes")) == ["e0", "e1", "e2"]
    assert len(list((tmp_path / "store" / "quarantine").rglob("*.parquet"))) == 3  # steps, episodes, digest


def test_corrupt_data_page_is_named_too(tmp_path):
    store = _store_with_episodes(tmp_path)
    f = sorted((tmp_path / "store" / "steps").glob("phase=*/*.parquet"))[0]
    b = bytearray(f.read_bytes())
    for i in range(100, 400):  # inside the data, the footer stays intact
        b[i] ^= 0xFF
    f.write_bytes(bytes(b))
    with pytest.raises(StoreError, match=rf"{f}"):
        store.sql("SELECT * FROM steps")


# ------------------------------------------------------------------------------------------------ run dirs
def test_run_dir_under_a_file_or_not_writable(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    s = load_config("smoke", environ={})
    with pytest.raises(V.BadInputError, match=rf"run dir {blocker}/run: {blocker} is a file, not a folder"):
        V.check_run_dir(blocker / "run", s)
    with pytest.raises(V.BadInputError, match=rf"run dir {blocker} is a file"):
        V.check_run_dir(blocker, s)
    if os.geteuid() != 0:  # root writes anywhere; the read-only case is covered by the mkstemp failure below
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o555)
        with pytest.raises(V.BadInputError, match="cannot write in"):
            V.check_run_dir(ro, s)


def test_run_dir_on_read_only_disk_is_named(tmp_path, monkeypatch):
    def refuse(*a, **kw):
        raise OSError(30, "Read-only file system")
    monkeypatch.setattr(V.tempfile, "mkstemp", refuse)
    s = load_config("smoke", environ={})
    with pytest.raises(V.BadInputError, match=rf"run dir {tmp_path}: cannot write in {tmp_path} \(Read-only file system\)"):
        V.check_run_dir(tmp_path, s)
    with pytest.raises(V.BadInputError, match=rf"run dir {tmp_path}/new/run: cannot create it in {tmp_path} \(Read-only"):
        V.check_run_dir(tmp_path / "new" / "run", s)
    assert not (tmp_path / "new").exists()  # a failed check creates nothing


def test_run_dir_of_another_config_is_refused_and_config_history_kept(tmp_path):
    smoke = load_config("smoke", environ={})
    assert V.check_run_dir(tmp_path, smoke) == [] and V.record_config(tmp_path, smoke) is None
    first = (tmp_path / "config.yaml").read_text()
    with pytest.raises(V.BadInputError, match=r"belongs to another config: its config.yaml has run.name='smoke', "
                                              r"this config run.name='demo'"):
        V.check_run_dir(tmp_path, load_config("demo", environ={}))
    changed = load_config("smoke", sets=["replay.low=0.3"], environ={})
    (warning,) = V.check_run_dir(tmp_path, changed)
    assert "replay.low: 0.5 -> 0.3" in warning
    kept = V.record_config(tmp_path, changed)
    assert kept.read_text() == first and "low: 0.3" in (tmp_path / "config.yaml").read_text()
    assert V.record_config(tmp_path, changed) is None  # unchanged: nothing archived


def test_run_dir_made_before_per_action_seeds_names_the_setting_that_reuses_its_episodes(tmp_path):
    import yaml
    smoke = load_config("smoke", environ={})
    V.record_config(tmp_path, smoke)
    old = yaml.safe_load((tmp_path / "config.yaml").read_text())
    del old["policy"]["seeded"]  # a config.yaml written before the field existed
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(old))
    changed, hint = V.check_run_dir(tmp_path, smoke)
    assert "policy.seeded: '<unset>' -> True" in changed
    assert "(policy.seeded was '<unset>')" in hint
    assert "rolled out anew" in hint and "--set policy.seeded=false reuses them" in hint
    unseeded = load_config("smoke", sets=["policy.seeded=false"], environ={})
    assert len(V.check_run_dir(tmp_path, unseeded)) == 1  # only the changed-config warning
    V.record_config(tmp_path, smoke)
    assert V.check_run_dir(tmp_path, smoke) == []  # seeded before and now: nothing to say


def test_phase_inputs(tmp_path):
    s = load_config("smoke", environ={})
    with pytest.raises(V.BadInputError, match=r"--phase 0: phases start at 1; phase 0 is the bootstrap"):
        V.check_phase_inputs(tmp_path, 0, s)
    with pytest.raises(V.BadInputError, match=r"phase 1 needs .*models/phase=0/actor.*run the bootstrap"):
        V.check_phase_inputs(tmp_path, 1, s)
    with pytest.raises(V.BadInputError, match=r"phase 3 needs .*models/phase=2/actor.*`webrl phase --phase 2"):
        V.check_phase_inputs(tmp_path, 3, s)


# ------------------------------------------------------------------------------------------------ policy endpoints
class _Garbage(BaseHTTPRequestHandler):
    def _send(self, body: str):
        b = body.encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(b)))
        self.end_headers()
        self.wfile.write(b)

    def do_GET(self):
        self._send(json.dumps({"data": [{"id": "x"}]}))

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self._send("<html>nginx default page</html>")

    def log_message(self, *a):
        pass


def test_unreachable_or_garbage_policy_endpoint(tmp_path):
    srv = HTTPServer(("127.0.0.1", 0), _Garbage)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        port = srv.server_address[1]
        ok = ["policy.backend=openai", "policy.model_name=x"]
        garbage = load_config("smoke", sets=ok + [f"policy.base_url=http://127.0.0.1:{port}/v1"], environ={})
        with pytest.raises(V.BadInputError, match=rf"POST http://127.0.0.1:{port}/v1/completions answered "
                                                  r"'<html>nginx default page</html>', not an OpenAI completion"):
            V.check_policy_endpoint(garbage)
        wrong_name = load_config("smoke", sets=["policy.backend=openai", "policy.model_name=llama",
                                                f"policy.base_url=http://127.0.0.1:{port}/v1"], environ={})
        with pytest.raises(V.BadInputError, match=r"does not serve policy.model_name='llama'; it serves \['x'\]"):
            V.check_policy_endpoint(wrong_name)
    finally:
        srv.shutdown()
    closed = load_config("smoke", sets=ok + [f"policy.base_url=http://127.0.0.1:{port}/v1"], environ={})
    with pytest.raises(V.BadInputError, match=rf"policy.base_url='http://127.0.0.1:{port}/v1' did not answer GET "
                                              r"[\s\S]*Is the server running"):
        V.check_policy_endpoint(closed, timeout_s=2)


# ------------------------------------------------------------------------------------------------ the CLI
def test_cli_prints_known_errors_without_traceback_and_keeps_tracebacks_for_bugs(tmp_path):
    from webrl_cli.main import known_error

    bad = tmp_path / "bad.yaml"
    bad.write_bytes(b"\xff\xfe")
    env = {**os.environ, "WEBRL_TRACEBACK": ""}
    r = subprocess.run([sys.executable, "-m", "webrl_cli.main", "config", "show", str(bad)], capture_output=True,
                       text=True, env=env, timeout=120)
    assert r.returncode == 2 and f"{bad}: not UTF-8" in r.stderr and "Traceback" not in r.stderr
    _store_with_episodes(tmp_path / "run")
    f = sorted((tmp_path / "run" / "store" / "episodes").glob("phase=*/*.parquet"))[0]
    f.write_bytes(f.read_bytes()[:100])
    r = subprocess.run([sys.executable, "-m", "webrl_cli.main", "store", "stats", str(tmp_path / "run")],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 2 and r.stderr.startswith("webrl: error: store ") and str(f) in r.stderr
    assert "Traceback" not in r.stderr and "╭" not in r.stderr
    assert known_error(KeyError("x")) is None and known_error(ValueError("from a library")) is None
    assert known_error(V.BadInputError("x")) == 2 and known_error(FileNotFoundError(2, "No such file", "/x")) == 1

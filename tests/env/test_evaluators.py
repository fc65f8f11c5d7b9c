"""WebArena-Lite's evaluators (env/evaluators.py): string_match through a real HTTP judge, and program_html and
url_match on real Chromium pages. The string checks are tested in test_string_match.py, the func: parsing in
test_site_queries.py, the judge's own parts in test_judge.py."""

from __future__ import annotations

import asyncio
import copy
import json
import re
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pytest

from chat_endpoint import ChatHandler, serve
from webrl_core.env import evaluators as ev
from webrl_core.env.judge import VAB_UA_PROMPT, FallbackJudge, JudgeError, LLMJudge, fallback_ua_match
from webrl_core.env.site_queries import webarena_site_helpers
from webrl_core.env.string_match import required_values_match
from webrl_core.env.webarena import load_webarena_tasks

FIXTURE = Path(__file__).parent.parent / "fixtures" / "webarena" / "mini_lite.raw.json"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def run(coro):
    return asyncio.run(coro)


# ---------------------------------------------------------------------------------------------
# string_match through the evaluator: must_include's |OR| alternatives and bare strings, must_exclude,
# required_values, a missing answer (the checks themselves: test_string_match.py)

def test_must_include_or_alternatives():
    task = {"intent": "", "eval": {"reference_answers": {"must_include": ["Earl Grey |OR| Earl-Grey", "12"]}}}
    ok, det = run(ev.evaluate_string_match(task, "It was earl-grey with 12 units"))
    assert ok == 1.0 and [d["score"] for d in det] == [1.0, 1.0]
    bad, det = run(ev.evaluate_string_match(task, "It was Darjeeling with 12 units"))
    assert bad == 0.0 and det[0]["score"] == 0.0 and det[1]["score"] == 1.0


def test_must_include_bare_string_is_one_item():
    # WebArena-Lite task 81 stores must_include as a string; VAB's assert would crash on it
    task = {"intent": "", "eval": {"reference_answers": {"must_include": "yjlou"}}}
    assert run(ev.evaluate_string_match(task, "The user is yjlou."))[0] == 1.0
    assert run(ev.evaluate_string_match(task, "The user is yjlou2"))[0] == 0.0


def test_must_exclude_and_required_values():
    task = {"intent": "", "eval": {"reference_answers": {"must_exclude": ["refund"]}}}
    assert run(ev.evaluate_string_match(task, "no returns possible"))[0] == 1.0
    assert run(ev.evaluate_string_match(task, "a refund is possible"))[0] == 0.0
    assert required_values_match(["< 10"], "5") == 1.0
    assert required_values_match(["< 10"], "1,200") == 0.0
    assert required_values_match([">= 3 |OR| == 0"], "0") == 1.0
    assert required_values_match(["< 10"], "many") == 0.0


def test_missing_answer_scores_as_empty_string():
    task = {"intent": "", "eval": {"reference_answers": {"exact_match": "Yes"}}}
    assert run(ev.evaluate_string_match(task, None))[0] == 0.0


# ---------------------------------------------------------------------------------------------
# a real OpenAI-compatible judge on 127.0.0.1 (deterministic rules over VAB's prompts it receives)

class JudgeHandler(ChatHandler):
    """Answers VAB's two prompts by fixed rules: fuzzy_match -> "Correct." when every reference part is in the
    student answer, "Partially correct." when some are, "Incorrect." when none; ua_match -> "same" when the
    reported reason holds half of the actual reason's words, else "different". ``reply`` (class attribute)
    overrides the answer; ``fail`` answers 500. tests/env/test_web_env.py and tests/pipeline/test_evaluation.py
    serve it too."""

    fail = False
    reply: str | None = None

    def answer(self, body):
        if type(self).fail:
            return 500, None
        prompt = body["messages"][-1]["content"]
        ref = re.search(r"^reference answer: (.*)$", prompt, re.M)
        if type(self).reply is not None:
            return type(self).reply
        if ref:
            pred = re.search(r"^student answer: (.*)$", prompt, re.M).group(1).lower()
            parts = [p.strip().lower() for p in ref.group(1).split(",")]
            hits = sum(p in pred for p in parts)
            return "Correct." if hits == len(parts) else "Partially correct." if hits else "Incorrect."
        actual = set(re.search(r"^actual unachievable reason: (.*)$", prompt, re.M).group(1).lower().split())
        told = set(re.search(r"^reported unachievable reason: (.*)$", prompt, re.M).group(1).lower().split())
        return "same" if len(actual & told) * 2 >= len(actual) else "different"


@pytest.fixture(scope="module")
def judge_url():
    with serve(JudgeHandler) as url:
        yield url


@pytest.fixture
def judge(judge_url, monkeypatch):
    monkeypatch.setenv("WEBRL_TEST_JUDGE_KEY", "sk-test")
    JudgeHandler.requests.clear()
    JudgeHandler.fail = False
    JudgeHandler.reply = None
    return LLMJudge(judge_url, model="judge-mini", api_key_env="WEBRL_TEST_JUDGE_KEY", retries=0)


def _fuzzy_task(value, note=""):
    return {"intent": "How far by bike?", "eval": {"eval_types": ["string_match"],
                                                   "reference_answers": {"fuzzy_match": value}, "string_note": note}}


def test_fuzzy_match_through_the_judge_sends_vab_prompt(judge):
    task = _fuzzy_task(["4.2 km", "17 min"])
    ok, det = run(ev.evaluate_string_match(task, "It is 4.2 km, about 17 min", judge))
    assert ok == 1.0 and det[0]["judge"] == "judge-mini" and det[0]["judge_reply"] == "Correct."
    partial, det = run(ev.evaluate_string_match(task, "It is 4.2 km", judge))
    assert partial == 0.0 and det[0]["judge_reply"] == "Partially correct."
    wrong, det = run(ev.evaluate_string_match(task, "No idea", judge))
    assert wrong == 0.0 and det[0]["judge_reply"] == "Incorrect."
    body = JudgeHandler.requests[0]["body"]
    assert JudgeHandler.requests[0]["auth"] == "Bearer sk-test"
    assert (body["model"], body["temperature"], body["max_tokens"], body["top_p"]) == ("judge-mini", 0, 768, 1.0)
    # VAB helper_functions_eval.py llm_fuzzy_match: system prompt and user message, reference joined with ", ",
    # the cleaned (lowercased) answer as the student's
    assert body["messages"] == [
        {"role": "system", "content": "You are a helpful assistant"},
        {"role": "user", "content": (
            "Help a teacher to grade the answer of a student given a question. Keep in mind that the student may use "
            "different phrasing or wording to answer the question. The goal is to evaluate whether the answer is "
            "semantically equivalent to the reference answer.\nquestion: How far by bike?\nreference answer: 4.2 km, "
            "17 min\nall the string 'N/A' that you see is a special sequence that means 'not achievable'\nstudent "
            "answer: it is 4.2 km, about 17 min\nConclude the judgement by 'correct', 'incorrect', or 'partially "
            "correct'. Only output one of these options, and nothing else.")}]


def test_na_exact_then_ua_match_through_the_judge(judge):
    task = _fuzzy_task("N/A", note="the store has no refund policy page")
    ok, det = run(ev.evaluate_string_match(task, '"n/a"', judge))
    assert ok == 1.0 and det[0]["check"] == "fuzzy_match:N/A exact" and JudgeHandler.requests == []
    ok, det = run(ev.evaluate_string_match(task, "N/A: there is no refund policy page in the store", judge))
    assert ok == 1.0 and det[0]["check"] == "fuzzy_match:N/A ua_match" and det[0]["judge_reply"] == "same"
    bad, det = run(ev.evaluate_string_match(task, "N/A: the site was down", judge))
    assert bad == 0.0 and det[0]["judge_reply"] == "different"
    # VAB llm_ua_match: the task, the actual reason (string_note) and the reported (cleaned) answer
    prompt = JudgeHandler.requests[0]["body"]["messages"][1]["content"]
    assert prompt.startswith("task: How far by bike?\nactual unachievable reason: the store has no refund policy page\n"
                             "reported unachievable reason: n/a: there is no refund policy page in the store\n"
                             "The task described above is inherently unachievable")
    assert prompt == VAB_UA_PROMPT.format(question="How far by bike?", reference="the store has no refund policy page",
                                             pred="n/a: there is no refund policy page in the store")
    assert prompt.endswith("respond with 'same'. Otherwise, respond with 'different'.")


def test_no_judge_leaves_judge_checks_unscored():
    task = _fuzzy_task(["4.2 km", "17 min"])
    s, det = run(ev.evaluate_string_match(task, "4.2 km, 17 min by bike"))
    assert s is None and det[0]["score"] is None and det[0]["judge"] is None and "eval.judge" in det[0]["unscored"]
    na = _fuzzy_task("N/A", note="the store has no refund policy page")
    assert run(ev.evaluate_string_match(na, "N/A"))[0] == 1.0  # the exact "N/A" needs no judge
    s, det = run(ev.evaluate_string_match(na, "N/A: there is no refund policy page in the store"))
    assert s is None and det[0]["check"] == "fuzzy_match:N/A ua_match" and det[0]["judge"] is None
    # another check that fails decides the product: 0, not unscored
    both = {"intent": "", "eval": {"eval_types": ["string_match"], "reference_answers": {
        "must_include": ["17"], "fuzzy_match": ["4.2 km"]}}}
    assert run(ev.evaluate_string_match(both, "about 20 minutes"))[0] == 0.0
    assert run(ev.evaluate_string_match(both, "17 minutes"))[0] is None
    res = run(ev.evaluate_task(task, None, "4.2 km, 17 min"))
    assert res.score is None and res.unscored and not res.success and res.judges == [None]
    assert res.details[-1] == {"evaluator": "string_match", "check": "total", "score": None}


def test_mul_treats_unscored_as_unknown():
    assert ev.mul(1.0, None) is None and ev.mul(None, 0.0) == 0.0 and ev.mul(0.0, None) == 0.0
    assert ev.mul(1.0, 1.0) == 1.0 and ev.mul(None, None) is None


def test_fallback_judge_scores_deterministically():
    fb = FallbackJudge()
    task = _fuzzy_task(["4.2 km", "17 min"])
    ok, det = run(ev.evaluate_string_match(task, "4.2 km, 17 min by bike", fb))
    assert ok == 1.0 and det[0]["judge"] == "fallback" and det[0]["judge_reply"] == "deterministic fallback"
    assert run(ev.evaluate_string_match(task, "4.2 km", fb))[0] == 0.0
    na = _fuzzy_task("N/A", note="the store has no refund policy page")
    ok, det = run(ev.evaluate_string_match(na, "N/A: there is no refund policy page in the store", fb))
    assert ok == 1.0 and det[0]["judge"] == "fallback"
    assert run(ev.evaluate_string_match(na, "N/A: the site was down", fb))[0] == 0.0
    assert fallback_ua_match("", "anything") == 0.0
    assert run(ev.evaluate_task(task, None, "4.2 km, 17 min", judge=fb)).judges == ["fallback"]


def test_judge_errors_are_reported(judge):
    JudgeHandler.fail = True
    with pytest.raises(JudgeError, match="judge-mini"):
        run(ev.evaluate_string_match(_fuzzy_task(["x"]), "y", judge))
    assert len(JudgeHandler.requests) == 1  # retries=0
    JudgeHandler.requests.clear()
    judge.retries = 1  # the SDK retries a 5xx answer
    with pytest.raises(JudgeError, match=r"judge http://127.0.0.1:\d+/v1 \(model judge-mini, eval\.judge\) "
                                            r"failed after up to 2 tries, API key from \$WEBRL_TEST_JUDGE_KEY .*500"):
        run(ev.evaluate_string_match(_fuzzy_task(["x"]), "y", judge))
    assert len(JudgeHandler.requests) == 2


def test_a_missing_key_is_named_when_the_endpoint_refuses(judge, monkeypatch):
    monkeypatch.delenv("WEBRL_TEST_JUDGE_KEY")
    JudgeHandler.fail = True
    with pytest.raises(JudgeError, match=r"no API key: \$WEBRL_TEST_JUDGE_KEY \(eval\.judge_api_key_env\) is not set"):
        run(ev.evaluate_string_match(_fuzzy_task(["x"]), "y", judge))


def test_a_reply_without_a_verdict_is_an_error_not_a_score(judge):
    JudgeHandler.reply = "I cannot tell."
    with pytest.raises(JudgeError, match="no verdict .*I cannot tell"):
        run(ev.evaluate_string_match(_fuzzy_task(["x"]), "y", judge))
    with pytest.raises(JudgeError, match="ua_match reply has no verdict"):
        run(ev.evaluate_string_match(_fuzzy_task("N/A", note="gone"), "it is gone", judge))
    JudgeHandler.reply = "__import__('os').system('false') # correct"  # model output is only searched, never run
    assert run(ev.evaluate_string_match(_fuzzy_task(["x"]), "y", judge))[0] == 1.0


def test_judge_without_a_key_sends_no_authorization(judge, monkeypatch):
    monkeypatch.delenv("WEBRL_TEST_JUDGE_KEY")
    assert run(ev.evaluate_string_match(_fuzzy_task(["4.2 km"]), "4.2 km", judge))[0] == 1.0
    (req,) = JudgeHandler.requests
    assert req["auth"] is None and req["body"]["max_tokens"] == 768 and req["path"] == "/v1/chat/completions"


def test_evaluators_do_not_import_the_task_file_module():
    # webarena.py imports string_match.py and site_queries.py (URL rules, func: parsing); the evaluator modules
    # importing it would be a cycle
    code = ("import sys, webrl_core.env.evaluators, webrl_core.env.judge, webrl_core.env.site_queries, "
            "webrl_core.env.string_match; assert 'webrl_core.env.webarena' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[2])


# ---------------------------------------------------------------------------------------------
# program_html / url_match / combination on real Chromium pages served by a local http server

SITE_STATE: dict = {}


class _SiteHandler(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def _send(self, body: str, ctype="text/html"):
        data = body.encode()
        self.send_response(200)
        self.send_header("Content-Type", f"{ctype}; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if urlparse(self.path).path == "/rest/default/V1/integration/admin/token" and body == {
                "username": "admin", "password": "admin1234"}:
            self._send(json.dumps("tok-123"), "application/json")
        else:
            self.send_response(401)
            self.end_headers()

    def do_GET(self):
        path = urlparse(self.path).path
        s = SITE_STATE
        if path == "/f/gardening/42/":
            self._send(f"<h1 class='post-title'>{s['post_title']}</h1><p>in gardening</p>")
        elif path.startswith("/f/gardening/42/"):
            self._send("<p>A comment thread in the gardening forum</p>")
        elif path == "/wishlist/":
            items = "".join(f"<li>{i}</li>" for i in s["wishlist"])
            self._send(f"<ul id='wishlist'>{items}</ul>")
        elif path == "/catalog/product/tea-01":
            self._send("<input id='qty' value=''><button id='show-stock' "
                       f"onclick=\"document.querySelector('#qty').value='{s['stock']}'\">show</button>")
        elif path == "/xhr":  # content that arrives after the load event
            self._send("<div id='data'>pending</div><script>window.addEventListener('load', () => "
                       "setTimeout(() => fetch('/api').then(r => r.text()).then(t => "
                       "{document.querySelector('#data').textContent = t}), 100))</script>")
        elif path == "/api":
            self._send(s.get("api_text", "loaded-by-xhr"), "text/plain")
        elif path == "/project/members":
            rows = "".join(f"<tr><td data-label='Account'><span class='gl-avatar-labeled-sublabel'>@{u}</span></td>"
                           f"<td class='col-max-role'><span>{r}</span></td></tr>" for u, r in s["members"])
            self._send(f"<table>{rows}</table>")
        elif path == "/rest/V1/orders":
            q = parse_qs(urlparse(self.path).query)
            assert q["searchCriteria[sortOrders][0][direction]"] == ["DESC"]
            if self.headers.get("Authorization") != "Bearer tok-123":
                self.send_response(401)
                self.end_headers()
                return
            self._send(json.dumps({"items": [{"increment_id": "000000190"}]}), "application/json")
        elif path == "/sales/order/view/order_id/190/":
            self._send("<div class='order-details-items ordered'>Teapot B x1</div>")
        elif path == "/notes":
            self._send("<p>Tea &amp; cake &lt;b&gt;</p>")
        else:
            self._send(f"<p>page {path}</p>")


@pytest.fixture(scope="module")
def site():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _SiteHandler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{srv.server_address[1]}"
    urls = {k: base for k in ("shopping", "shopping_admin", "reddit", "gitlab", "map", "wikipedia")}
    tasks = {t["task_id"]: t for t in load_webarena_tasks(FIXTURE, urls)}
    yield base, tasks
    srv.shutdown()


@pytest.fixture(scope="module")
def browser_loop():
    """One event loop and one Chromium for the module; each test gets a fresh page."""
    from playwright.async_api import async_playwright

    loop = asyncio.new_event_loop()

    async def start():
        pw = await async_playwright().start()
        br = await pw.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
        return pw, br

    pw, browser = loop.run_until_complete(start())
    yield loop, browser
    loop.run_until_complete(browser.close())
    loop.run_until_complete(pw.stop())
    loop.close()


@pytest.fixture(autouse=True)
def _reset_site_state():
    SITE_STATE.clear()
    SITE_STATE.update(post_title="Raised beds for beginners", wishlist=["Teapot B"], stock=5,
                      members=[("pat", "Owner"), ("byteblaze", "Developer")])


def evaluate_at(browser_loop, url: str, task: dict, answer=None, helpers=None, judge=None):
    """Open ``url`` as the agent's final page in a fresh context, then score ``task``."""
    loop, browser = browser_loop

    async def go():
        ctx = await browser.new_context()
        try:
            page = await ctx.new_page()
            await page.goto(url)
            return await ev.evaluate_task(task, page, answer, helpers=helpers, judge=judge)
        finally:
            await ctx.close()

    return loop.run_until_complete(go())


def test_func_url_and_last_targets_with_url_match(site, browser_loop):
    base, tasks = site
    res = evaluate_at(browser_loop, f"{base}/f/gardening/42/raised-beds/comment/7", tasks[3])
    assert res.score == 1.0, res.details
    sel = [d for d in res.details if d["check"] == "select"]
    assert sel[0]["url"] == f"{base}/f/gardening/42/" and sel[1]["url"] == "last"
    assert "comment thread" in sel[1]["selected"]  # "last" saw the agent's page, before target 0 navigated away
    SITE_STATE["post_title"] = "Something else"
    res = evaluate_at(browser_loop, f"{base}/f/gardening/42/raised-beds/comment/7", tasks[3])
    assert res.score == 0.0


def test_url_match_failure_zeroes_the_product(site, browser_loop):
    base, tasks = site
    res = evaluate_at(browser_loop, f"{base}/f/cooking/9/x", tasks[3])
    url_rows = [d for d in res.details if d["evaluator"] == "url_match" and d["check"] != "total"]
    assert url_rows[0]["score"] == 0.0 and res.score == 0.0


def test_placeholder_url_and_func_locator(site, browser_loop):
    base, tasks = site
    assert evaluate_at(browser_loop, f"{base}/", tasks[4]).score == 1.0
    SITE_STATE["wishlist"] = ["Teapot A", "Teapot B"]  # must_exclude fails
    res = evaluate_at(browser_loop, f"{base}/", tasks[4])
    assert res.score == 0.0
    assert [d["score"] for d in res.details if d["check"] in ("must_include", "must_exclude")] == [1.0, 0.0]


def test_prep_actions_and_required_values(site, browser_loop):
    base, tasks = site
    assert evaluate_at(browser_loop, f"{base}/", tasks[7]).score == 1.0
    SITE_STATE["stock"] = 25
    assert evaluate_at(browser_loop, f"{base}/", tasks[7]).score == 0.0


def _html_task(url, locator, rc, intent="t"):
    return {"task_id": "h", "intent": intent, "eval": {"eval_types": ["program_html"], "program_html": [
        {"url": url, "locator": locator, "required_contents": rc}]}}


def test_failing_js_locator_selects_empty(site, browser_loop):
    base, _ = site
    task = _html_task("last", "document.querySelector('#missing').outerText", {"exact_match": ""})
    res = evaluate_at(browser_loop, f"{base}/notes", task)
    assert res.score == 1.0 and res.details[0]["selected"] == ""
    task = _html_task("last", "document.querySelector('#missing').outerText", {"must_include": ["tea"]})
    assert evaluate_at(browser_loop, f"{base}/notes", task).score == 0.0


def test_full_page_content_is_unescaped(site, browser_loop):
    base, _ = site
    task = _html_task(f"{base}/notes", "", {"must_include": ["tea & cake <b>"]})
    assert evaluate_at(browser_loop, f"{base}/", task).score == 1.0
    task = _html_task(f"{base}/notes", "", {"must_include": ["tea & biscuits"]})
    assert evaluate_at(browser_loop, f"{base}/", task).score == 0.0


def test_navigation_waits_for_late_content_without_fixed_sleep(site, browser_loop):
    base, _ = site
    task = _html_task(f"{base}/xhr", "document.querySelector('#data').textContent", {"exact_match": "loaded-by-xhr"})
    assert evaluate_at(browser_loop, f"{base}/", task).score == 1.0
    SITE_STATE["api_text"] = "other"
    assert evaluate_at(browser_loop, f"{base}/", task).score == 0.0


def test_custom_async_helper_and_none_selection(site, browser_loop):
    base, _ = site

    async def page_title_words(page, n):
        return " ".join((await page.title() or "no title here").split()[:n])

    async def nothing(page):
        return None

    helpers = {"page_title_words": page_title_words, "nothing": nothing}
    task = _html_task("last", "func:page_title_words(__page__, 2)", {"exact_match": "no title"})
    assert evaluate_at(browser_loop, f"{base}/notes", task, helpers=helpers).score == 1.0
    task = _html_task("last", "func:nothing(__page__)", {"exact_match": ""})
    res = evaluate_at(browser_loop, f"{base}/notes", task, helpers=helpers)
    assert res.score == 0.0 and res.details[0]["note"] == "locator selected None"
    with pytest.raises(ValueError, match="unknown helper"):
        evaluate_at(browser_loop, f"{base}/notes", _html_task("last", "func:absent(__page__)", {"exact_match": ""}))


def test_string_and_url_combine_by_product(site, browser_loop, judge):
    base, tasks = site
    t6 = tasks[6]  # string_match exact "Yes" + url_match EXACT on the map
    assert evaluate_at(browser_loop, f"{base}/search?query=Eastbrook", t6, answer="yes").score == 1.0
    assert evaluate_at(browser_loop, f"{base}/search?query=Eastbrook", t6, answer="no").score == 0.0
    assert evaluate_at(browser_loop, f"{base}/search?query=Westbrook", t6, answer="yes").score == 0.0
    # program_html fuzzy target through the judge, combined with nothing else
    task = _html_task("last", "document.querySelector('p').textContent", {"fuzzy_match": ["tea", "cake"]})
    res = evaluate_at(browser_loop, f"{base}/notes", task, judge=judge)
    assert res.score == 1.0 and any(d.get("judge") == "judge-mini" for d in res.details)
    bad = copy.deepcopy(task)
    bad["eval"]["program_html"][0]["required_contents"]["fuzzy_match"] = ["coffee"]
    assert evaluate_at(browser_loop, f"{base}/notes", bad, judge=judge).score == 0.0
    # no judge: the fuzzy target is unscored, and so is the task; the fallback scores it
    res = evaluate_at(browser_loop, f"{base}/notes", task)
    assert res.score is None and [d["judge"] for d in res.details if "judge" in d] == [None]
    assert evaluate_at(browser_loop, f"{base}/notes", task, judge=FallbackJudge()).score == 1.0
    # ... unless another check already failed: a failing url_match decides the product without a judge
    mixed = copy.deepcopy(task)
    mixed["eval"].update(eval_types=["url_match", "program_html"], reference_url=f"{base}/elsewhere")
    assert evaluate_at(browser_loop, f"{base}/notes", mixed).score == 0.0


def test_webarena_helpers_latest_order_and_gitlab_role(site, browser_loop):
    base, _ = site
    order = _html_task("func:shopping_get_latest_order_url()",
                       "document.querySelector('.order-details-items.ordered').outerText", {"must_include": ["Teapot B"]})
    res = evaluate_at(browser_loop, f"{base}/", order, helpers=webarena_site_helpers({"shopping": base}))
    assert res.score == 1.0 and res.details[0]["url"] == f"{base}/sales/order/view/order_id/190/"
    import httpx
    with pytest.raises(httpx.HTTPStatusError):  # a site/infra failure is raised, not scored as an agent failure
        evaluate_at(browser_loop, f"{base}/", order,
                    helpers=webarena_site_helpers({"shopping": base}, admin_password="wrong"))
    role = _html_task(f"{base}/project/members", "func:gitlab_get_project_memeber_role(__page__, 'byteblaze')",
                      {"exact_match": "Developer"})
    assert evaluate_at(browser_loop, f"{base}/", role).score == 1.0
    SITE_STATE["members"] = [("byteblaze", "Guest")]
    assert evaluate_at(browser_loop, f"{base}/", role).score == 0.0


def test_placeholders_substituted_by_urls_or_rejected(site, browser_loop):
    base, _ = site
    raw = {t["task_id"]: t for t in json.loads(FIXTURE.read_text())}
    with pytest.raises(ValueError, match="placeholder"):
        evaluate_at(browser_loop, f"{base}/search?query=Eastbrook", raw[6], answer="yes")
    loop, browser = browser_loop

    async def go():
        page = await browser.new_page()
        try:
            await page.goto(f"{base}/search?query=Eastbrook")
            return await ev.evaluate_task(raw[6], page, "Yes", urls={"map": base, "wikipedia": base})
        finally:
            await page.close()

    assert loop.run_until_complete(go()).score == 1.0

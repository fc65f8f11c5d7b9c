"""The judge's own parts (env/judge.py): VAB's verdict reading, the judge eval.judge names, and which tasks need
one. The judge scoring through the evaluators, on a real OpenAI-compatible endpoint, is in test_evaluators.py."""

from __future__ import annotations

import pytest

from webrl_core.env import judge as jm


def _fuzzy_task(value, note=""):
    return {"intent": "How far by bike?", "eval": {"eval_types": ["string_match"],
                                                   "reference_answers": {"fuzzy_match": value}, "string_note": note}}


def _html_task(url, locator, rc, intent="t"):
    return {"task_id": "h", "intent": intent, "eval": {"eval_types": ["program_html"], "program_html": [
        {"url": url, "locator": locator, "required_contents": rc}]}}


def test_judge_from_settings_follows_eval_judge(monkeypatch):
    from webrl_core.config_loader import load_config

    assert jm.judge_from_settings(load_config("smoke")) is None
    assert jm.judge_from_settings(load_config("smoke", sets=["eval.judge=''"])) is None
    assert isinstance(jm.judge_from_settings(load_config("smoke", sets=["eval.judge=none"])), jm.FallbackJudge)
    s = load_config("smoke", sets=["eval.judge=http://127.0.0.1:8000/v1/", "eval.judge_model=qwen-judge",
                                   "eval.judge_api_key_env=MY_JUDGE_KEY"])
    j = jm.judge_from_settings(s)
    assert isinstance(j, jm.LLMJudge) and (j.base_url, j.model, j.api_key_env) == (
        "http://127.0.0.1:8000/v1", "qwen-judge", "MY_JUDGE_KEY")
    assert jm.judge_from_settings(s.eval).model == "qwen-judge"  # an EvalConfig works too
    assert jm.describe_judge(s) == "qwen-judge at http://127.0.0.1:8000/v1/"
    assert jm.describe_judge(load_config("smoke", sets=["eval.judge=none"])) == "none (deterministic fallback)"
    assert jm.describe_judge(load_config("smoke")).startswith("not configured")
    with pytest.raises(ValueError, match=r"eval\.judge: 'localhost:8000' is not an http\(s\) URL"):
        jm.judge_from_settings(load_config("smoke", sets=["eval.judge=localhost:8000"]))
    with pytest.warns(DeprecationWarning):  # the old name still reaches the judge
        old = load_config("smoke", sets=["eval.fuzzy_judge_url=http://127.0.0.1:9/v1"])
    assert jm.judge_from_settings(old).base_url == "http://127.0.0.1:9/v1"


def test_needs_judge():
    assert jm.needs_judge(_fuzzy_task(["x"])) and jm.needs_judge(_fuzzy_task("N/A"))
    assert not jm.needs_judge({"eval": {"eval_types": ["string_match"], "reference_answers": {"exact_match": "x"}}})
    html = _html_task("last", "", {"fuzzy_match": ["tea"]})
    assert jm.needs_judge(html) and not jm.needs_judge(_html_task("last", "", {"must_include": ["tea"]}))
    assert not jm.needs_judge(None)


def test_verdict_parsing():
    assert jm.parse_fuzzy_verdict("The answer is correct") == 1.0
    assert jm.parse_fuzzy_verdict("partially correct") == 0.0
    assert jm.parse_fuzzy_verdict("INCORRECT") == 0.0
    assert jm.parse_ua_verdict("Same.") == 1.0 and jm.parse_ua_verdict("different") == 0.0
    with pytest.raises(jm.JudgeError):
        jm.parse_fuzzy_verdict("unsure")
    with pytest.raises(jm.JudgeError):
        jm.parse_ua_verdict("unsure")

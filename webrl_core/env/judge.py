"""The judge of WebArena-Lite's ``fuzzy_match`` checks and of the "N/A" reason check: VAB's LLM judge on an
OpenAI-compatible endpoint (``LLMJudge``: VAB's prompts, sampling and verdict reading), the deterministic stand-in
``eval.judge: none`` asks for (``FallbackJudge``, not VAB's), the judge the settings name (``judge_from_settings``,
``describe_judge``), and whether a task needs one (``needs_judge``).

Official source: VisualAgentBench (github.com/THUDM/VisualAgentBench, commit 9055fc2)
``VAB-WebArena-Lite/new/helper_functions_eval.py``, which replaces WebArena's
``evaluation_harness/helper_functions.py``: ``llm_fuzzy_match`` and ``llm_ua_match``; their callers in
``VAB-WebArena-Lite/new/evaluators.py``: ``StringEvaluator.fuzzy_match``, ``StringEvaluator.ua_match`` and
``HTMLContentExactEvaluator``'s fuzzy_match.
"""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import urlparse

from webrl_core.env.string_match import clean_answer, exact_match, must_include, word_tokenize

_DETAIL_CHARS = 400  # selected page text kept per detail row (the page itself can be megabytes)


def _short(text: Any) -> str:
    s = str(text)
    return s if len(s) <= _DETAIL_CHARS else s[:_DETAIL_CHARS] + f"... [{len(s)} chars]"


# ---------------------------------------------------------------------------------------------
# the judge: an LLM on an OpenAI-compatible endpoint, the deterministic fallback, or none (unscored)

# VAB's judge prompts, verbatim, as data: VisualAgentBench (github.com/THUDM/VisualAgentBench, commit 9055fc2),
# ``VAB-WebArena-Lite/new/helper_functions_eval.py``, functions ``llm_fuzzy_match`` and ``llm_ua_match``. Both send
# [system, user] to gpt-4-1106-preview with temperature 0, max_tokens 768, top_p 1.0. VAB's ``question`` is the
# task's intent, ``reference`` the joined reference (``", ".join``) or the task's ``string_note``, ``pred`` the
# cleaned answer (string_match) or the selected page text (program_html).
VAB_JUDGE_SYSTEM = "You are a helpful assistant"
VAB_FUZZY_PROMPT = (
    "Help a teacher to grade the answer of a student given a question. Keep in mind that the student may use "
    "different phrasing or wording to answer the question. The goal is to evaluate whether the answer is "
    "semantically equivalent to the reference answer.\n"
    "question: {question}\n"
    "reference answer: {reference}\n"
    "all the string 'N/A' that you see is a special sequence that means 'not achievable'\n"
    "student answer: {pred}\n"
    "Conclude the judgement by 'correct', 'incorrect', or 'partially correct'. Only output one of these options, "
    "and nothing else.")
VAB_UA_PROMPT = (
    "task: {question}\n"
    "actual unachievable reason: {reference}\n"
    "reported unachievable reason: {pred}\n"
    "The task described above is inherently unachievable due to the reason specified under 'actual unachievable "
    "reason'. An individual previously attempted this task and was unable to complete it. They provided a reason for "
    "their failure, which is listed under 'reported unachievable reason'. Your role is to review both the actual and "
    "reported reasons. Determine if the reported reason aligns with the actual reason, even if implicitly. If the "
    "stated reason is in line with the actual reason, respond with 'same'. Otherwise, respond with 'different'.")
VAB_JUDGE_SAMPLING = {"temperature": 0, "max_tokens": 768, "top_p": 1.0}

NO_JUDGE = ("needs an LLM judge and none is configured: set eval.judge to an OpenAI-compatible endpoint "
            "(e.g. http://127.0.0.1:8000/v1), or eval.judge: none for the deterministic fallback")


class JudgeError(RuntimeError):
    """The judge endpoint could not be reached or answered with something unusable."""


def parse_fuzzy_verdict(reply: str) -> float:
    """VAB ``llm_fuzzy_match``'s reading of the lowercased reply: "partially correct" or "incorrect" -> 0 (checked
    first: both contain "correct"), else "correct" -> 1. A reply with none of them is a ``JudgeError`` (VAB asserts)."""
    r = reply.lower()
    if "partially correct" in r or "incorrect" in r:
        return 0.0
    if "correct" in r:
        return 1.0
    raise JudgeError(f"the judge's fuzzy_match reply has no verdict ('correct', 'incorrect' or 'partially "
                     f"correct'): {_short(reply)!r}")


def parse_ua_verdict(reply: str) -> float:
    """VAB ``llm_ua_match``'s reading of the lowercased reply: "different" -> 0, else "same" -> 1. A reply with
    neither is a ``JudgeError`` (VAB asserts)."""
    r = reply.lower()
    if "different" in r:
        return 0.0
    if "same" in r:
        return 1.0
    raise JudgeError(f"the judge's ua_match reply has no verdict ('same' or 'different'): {_short(reply)!r}")


class LLMJudge:
    """VAB's LLM judge (``helper_functions_eval.py``: ``llm_fuzzy_match``, ``llm_ua_match``) on an OpenAI-compatible
    ``/chat/completions`` endpoint through the ``openai`` SDK: VAB's prompts (``VAB_FUZZY_PROMPT``,
    ``VAB_UA_PROMPT``), sampling (temperature 0, max_tokens 768, top_p 1) and verdict reading. The SDK retries
    timeouts, connection errors, 429 and 5xx answers ``retries`` times; the API key is read from the environment
    variable ``api_key_env`` (no key: no Authorization header). The reply is only searched for the verdict words."""

    def __init__(self, base_url: str, model: str = "gpt-4-1106-preview", api_key_env: str = "OPENAI_API_KEY",
                 timeout_s: float = 60.0, retries: int = 2, max_tokens: int = 768):
        self.base_url = base_url.rstrip("/")
        self.model, self.api_key_env = model, api_key_env
        self.timeout_s, self.retries, self.max_tokens = timeout_s, retries, max_tokens

    @property
    def name(self) -> str:
        """What detail rows record as the judge: the model's name."""
        return self.model

    def __repr__(self) -> str:
        return f"LLMJudge({self.base_url!r}, model={self.model!r})"

    async def complete(self, prompt: str) -> str:
        import openai  # ~0.5 s to import: only a configured judge needs it, and task-file tools import this module

        key = os.environ.get(self.api_key_env) if self.api_key_env else None
        messages = [{"role": "system", "content": VAB_JUDGE_SYSTEM}, {"role": "user", "content": prompt}]
        # no key: no Authorization header (the SDK insists on a key, so it gets one it never sends)
        no_auth = {} if key else {"extra_headers": {"Authorization": openai.Omit()}}
        sampling = dict(VAB_JUDGE_SAMPLING, max_tokens=self.max_tokens)
        try:
            async with openai.AsyncOpenAI(base_url=self.base_url, api_key=key or "unused", timeout=self.timeout_s,
                                          max_retries=self.retries) as client:
                reply = await client.chat.completions.create(model=self.model, messages=messages, **sampling,
                                                             **no_auth)
            content = reply.choices[0].message.content
        except (openai.APIError, AttributeError, IndexError, TypeError, ValueError) as e:
            key_note = (f"API key from ${self.api_key_env} (eval.judge_api_key_env)" if key else
                        f"no API key: ${self.api_key_env} (eval.judge_api_key_env) is not set")
            raise JudgeError(f"judge {self.base_url} (model {self.model}, eval.judge) failed after up to "
                             f"{self.retries + 1} tries, {key_note}: {e!r}") from None
        if not isinstance(content, str) or not content.strip():
            raise JudgeError(f"judge {self.base_url} (model {self.model}, eval.judge) answered with no text")
        return content

    async def fuzzy_match(self, intent: str, reference: list[str], prediction: str) -> tuple[float, str]:
        """VAB ``llm_fuzzy_match(pred, ", ".join(reference), intent)``: 1 iff the judge says "correct"."""
        reply = await self.complete(VAB_FUZZY_PROMPT.format(question=intent, reference=", ".join(reference),
                                                            pred=prediction))
        return parse_fuzzy_verdict(reply), reply

    async def ua_match(self, intent: str, reference: str, prediction: str) -> tuple[float, str]:
        """VAB ``llm_ua_match(pred, string_note, intent)``: 1 iff the judge says "same"."""
        reply = await self.complete(VAB_UA_PROMPT.format(question=intent, reference=reference, pred=prediction))
        return parse_ua_verdict(reply), reply


class FallbackJudge:
    """The deterministic stand-in ``eval.judge: none`` asks for (not VAB): :func:`fallback_fuzzy_match` and
    :func:`fallback_ua_match`. Detail rows record the judge as "fallback"."""

    name = "fallback"

    def __repr__(self) -> str:
        return "FallbackJudge()"

    async def fuzzy_match(self, intent: str, reference: list[str], prediction: str) -> tuple[float, str]:
        return fallback_fuzzy_match(reference, prediction), "deterministic fallback"

    async def ua_match(self, intent: str, reference: str, prediction: str) -> tuple[float, str]:
        return fallback_ua_match(reference, prediction), "deterministic fallback"


def fallback_fuzzy_match(reference: list[str] | str, pred: str) -> float:
    """Deterministic stand-in for the LLM judge: 1 iff the cleaned prediction equals the joined reference or
    every reference item passes :func:`must_include` (so "Luma, 2" matches ["luma", "2"]); else 0."""
    items = [reference] if isinstance(reference, str) else list(reference)
    if exact_match(", ".join(items), pred):
        return 1.0
    return float(bool(items) and all(must_include(it, pred) for it in items))


_STOPWORDS = frozenset(
    "a an the is are was were be been being of to in on at for by with from as and or but not no nor it its this that "
    "these those there their they them he she his her you your we our i me my task can cannot can't could n't does do "
    "did has have had any all so such which who whom what when where why how than then into onto about n/a".split())


def _content_words(text: str) -> set[str]:
    return {t for t in word_tokenize(clean_answer(text)) if t not in _STOPWORDS and any(c.isalnum() for c in t)}


def fallback_ua_match(reference: str, pred: str) -> float:
    """Deterministic stand-in for VAB's ``llm_ua_match``: 1 iff the reported reason holds at least half of the
    actual reason's content words (lowercased word tokens minus common function words), else 0. It cannot read
    negation or paraphrase; an empty actual reason scores 0."""
    ref = _content_words(reference or "")
    if not ref:
        return 0.0
    return float(2 * len(ref & _content_words(pred)) >= len(ref))


def judge_from_settings(settings) -> "LLMJudge | FallbackJudge | None":
    """The judge ``eval.judge`` asks for (``settings`` is a WebRLSettings, a stage's view of one, or an EvalConfig):
    empty -> None (tasks that need a judge are unscored), "none" -> :class:`FallbackJudge`, an http(s) URL ->
    :class:`LLMJudge` with ``eval.judge_model`` and the key in ``$<eval.judge_api_key_env>``."""
    ev = settings.eval if hasattr(settings, "eval") else settings
    url = (ev.judge or "").strip()
    if not url:
        return None
    if url.lower() == "none":
        return FallbackJudge()
    scheme = urlparse(url).scheme
    if scheme not in ("http", "https") or not urlparse(url).netloc:
        raise ValueError(f"eval.judge: {url!r} is not an http(s) URL; expected an OpenAI-compatible endpoint such as "
                         f"http://127.0.0.1:8000/v1, 'none' (deterministic fallback) or empty (no judge: tasks that "
                         f"need one are reported unscored)")
    return LLMJudge(url, model=ev.judge_model, api_key_env=ev.judge_api_key_env)


def describe_judge(settings) -> str:
    """One line for reports: what ``eval.judge`` says scores fuzzy_match and the N/A reason check."""
    ev = settings.eval if hasattr(settings, "eval") else settings
    url = (ev.judge or "").strip()
    if not url:
        return "not configured (eval.judge is empty: tasks that need a judge are unscored)"
    if url.lower() == "none":
        return "none (deterministic fallback)"
    return f"{ev.judge_model} at {url}"


def needs_judge(task: dict | None) -> bool:
    """Whether the task has a check that VAB scores with its LLM judge: string_match's ``fuzzy_match`` (the "N/A"
    reference included: its reason check is ``llm_ua_match``) or a program_html ``required_contents.fuzzy_match``."""
    ev = (task or {}).get("eval") or {}
    types = ev.get("eval_types") or []
    if "string_match" in types and "fuzzy_match" in (ev.get("reference_answers") or {}):
        return True
    return "program_html" in types and any("fuzzy_match" in (t.get("required_contents") or {})
                                           for t in ev.get("program_html") or [])

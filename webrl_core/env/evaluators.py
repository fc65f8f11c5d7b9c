"""WebArena-Lite evaluators: string_match, url_match and program_html, with VAB-WebArena-Lite semantics
(``evaluation_harness/evaluators.py``: ``StringEvaluator``, ``URLEvaluator``, ``HTMLContentEvaluator``; the LLM judge
of ``helper_functions.py``: ``llm_fuzzy_match``, ``llm_ua_match``). Like ``EvaluatorComb``, a task scores

    score(task) = prod_{t in eval.eval_types} score_t          (each score_t is 0 or 1)

* string_match -- the prediction is the final answer of the STOP action, cleaned (surrounding whitespace and one pair
  of surrounding quotes stripped, lowercased). ``exact_match``: equality. ``must_include``: every item must hit; an item
  may hold alternatives separated by " |OR| " and any one may hit; a reference that is a single word token is checked
  by token membership in the prediction tokenized by NLTK's ``word_tokenize`` (tokens holding "/" are also split),
  otherwise by substring.
  ``fuzzy_match``: a list is joined with ", " and graded by one LLM judge call (correct -> 1; incorrect or partially
  correct -> 0); the literal "N/A" is first tested by exact match, then the reported reason is compared with
  ``string_note`` by the judge ("same" -> 1). ``must_exclude``, ``required_values`` and ``one_of`` follow VAB too.
  The judge is VAB's (``LLMJudge``: its prompts and verdict reading, on an OpenAI-compatible endpoint); which one
  scores is ``eval.judge`` (:func:`judge_from_settings`): a URL -> ``LLMJudge``; "none" -> the deterministic
  ``FallbackJudge`` (details say ``judge: "fallback"``); empty -> no judge: those checks score None ("unscored",
  details say why) and so does the task, unless another check scored 0 (the product is 0 whatever the judge says).
* url_match -- the final page URL against ``reference_url`` (" |OR| " alternatives); both sides map "localhost" to
  "127.0.0.1" and lose one trailing "/". Rule ``url_note``: "EXACT" (default) = equal to one reference,
  "GOLD in PRED" = one reference is a substring of the prediction.
* program_html -- per target: resolve the URL ("last" = the agent's final page; a URL = navigate there and wait for the
  load event; ``func:helper(...)`` = a registered helper, ``__last_url__`` = the agent's final URL), select text with the
  locator ("" = page.content(); ``document.``/``[...document.`` = page.evaluate, a failing script selects "";
  ``func:helper(__page__, ...)`` = a registered helper), HTML-unescape it, then apply ``required_contents`` with the
  string checks above. A selection of None scores the task 0.

Deliberate differences from VAB, all keeping its intent: "last" targets are checked before any target navigates away
and ``__last_url__``/url_match always mean the agent's final URL (VAB re-reads ``page.url`` after earlier targets
moved the page); no fixed ``sleep(3)`` after navigation; ``func:`` calls are parsed with ``ast`` against a registry,
never ``eval``-ed; a failing N/A reason check multiplies into the task's score (VAB's ``score = 1.0 * ua_match``
overwrites the checks before it); a judge reply without a verdict word is a ``JudgeError`` (VAB asserts).

This module holds the evaluators themselves (VAB's ``StringEvaluator.__call__``, ``URLExactEvaluator``,
``HTMLContentExactEvaluator`` and ``EvaluatorComb``, from ``VAB-WebArena-Lite/new/evaluators.py`` of
VisualAgentBench, which replaces WebArena's ``evaluation_harness/evaluators.py``); the string and URL checks are in
:mod:`webrl_core.env.string_match`, the ``func:`` helpers and their parsing in :mod:`webrl_core.env.site_queries`,
the judge in :mod:`webrl_core.env.judge`.
"""

from __future__ import annotations

import html as html_lib
from dataclasses import dataclass, field
from typing import Any

from webrl_core.env.judge import NO_JUDGE, _short
from webrl_core.env.placeholders import PLACEHOLDER_RE, substitute_placeholders
from webrl_core.env.site_queries import call_helper, default_helpers
from webrl_core.env.string_match import (clean_answer, clean_url, exact_match, must_exclude, must_include_any,
                                         required_values_match, url_match)


# ---------------------------------------------------------------------------------------------
# the three evaluators

Score = float | None  # None: unscored (a check needs a judge and none is configured)


def mul(a: Score, b: Score) -> Score:
    """Product of check scores where None (unscored) is unknown: a 0 decides the product, else any None leaves it
    unknown."""
    if a == 0.0 or b == 0.0:
        return 0.0
    if a is None or b is None:
        return None
    return a * b


@dataclass
class EvalResult:
    """``score`` is None when the task is unscored: a check needs a judge, none was given, and no other check
    scored 0. ``details`` hold one row per check (``judge``: the judge's name, "fallback", or None = none given)."""

    score: float | None
    details: list[dict] = field(default_factory=list)

    @property
    def success(self) -> bool:
        return self.score is not None and self.score >= 1.0

    @property
    def unscored(self) -> bool:
        return self.score is None

    @property
    def judges(self) -> list[str | None]:
        """Who scored the judge checks, in order (None: nobody, the check is unscored)."""
        return [d["judge"] for d in self.details if "judge" in d]


def _judge_name(judge) -> str:
    return str(getattr(judge, "name", None) or getattr(judge, "model", None) or type(judge).__name__)


async def _fuzzy(reference: list[str] | str, pred: str, intent: str, judge) -> tuple[Score, dict]:
    """VAB ``StringEvaluator.fuzzy_match`` / ``HTMLContentEvaluator``'s fuzzy_match: the reference items against the
    prediction, by the judge; without one the check is unscored (None)."""
    items = [reference] if isinstance(reference, str) else [str(r) for r in reference]
    if judge is None:
        return None, {"judge": None, "unscored": NO_JUDGE}
    score, reply = await judge.fuzzy_match(intent, items, pred)
    return float(score), {"judge": _judge_name(judge), "judge_reply": _short(reply)}


async def check_reference_answers(reference_answers: dict, pred: str, intent: str = "", string_note: str | None = None,
                                  judge=None, source: str = "string_match") -> tuple[Score, list[dict]]:
    """Apply string_match's reference_answers to a prediction (VAB ``StringEvaluator.__call__``); one detail row
    per check. The score is None (unscored) when a judge check has no judge and no other check scored 0."""
    pred_c = clean_answer(pred)
    score: Score = 1.0
    details: list[dict] = []

    def row(check, reference, s, **extra):
        details.append({"evaluator": source, "check": check, "reference": reference, "prediction": _short(pred_c),
                        "score": None if s is None else float(s), **extra})

    for approach, value in reference_answers.items():
        if approach == "exact_match":
            s = exact_match(value, pred_c)
            row("exact_match", value, s)
        elif approach == "must_include":
            s = 1.0
            for item in [value] if isinstance(value, str) else value:  # Lite task 81 stores a bare string
                hit = must_include_any(item, pred_c)
                row("must_include", item, hit)
                s *= hit
        elif approach == "must_exclude":
            s = 1.0
            for item in value:
                ok = must_exclude(item, pred_c)
                row("must_exclude", item, ok)
                s *= ok
        elif approach == "required_values":
            s = required_values_match(value, pred_c)
            row("required_values", value, s)
        elif approach == "one_of":
            s = float(any(clean_answer(v) in pred_c for v in value))
            row("one_of", value, s)
        elif approach == "fuzzy_match":
            if value == "N/A":  # VAB: exact "N/A" first, else the reported reason against string_note (ua_match)
                s = exact_match("N/A", pred_c)
                if s == 1.0:
                    row("fuzzy_match:N/A exact", "N/A", s)
                elif judge is None:
                    s = None
                    row("fuzzy_match:N/A ua_match", string_note, s, judge=None, unscored=NO_JUDGE)
                else:
                    s, reply = await judge.ua_match(intent, string_note or "", pred_c)
                    row("fuzzy_match:N/A ua_match", string_note, s, judge=_judge_name(judge), judge_reply=_short(reply))
            else:
                s, extra = await _fuzzy(value, pred_c, intent, judge)
                row("fuzzy_match", value, s, **extra)
        else:
            raise ValueError(f"eval.reference_answers: unknown key {approach!r}; allowed: exact_match, must_include, "
                             f"must_exclude, fuzzy_match, required_values, one_of")
        score = mul(score, s)
    return score, details


async def evaluate_string_match(task: dict, answer: str | None, judge=None) -> tuple[Score, list[dict]]:
    ev = task["eval"]
    return await check_reference_answers(ev.get("reference_answers") or {}, answer or "", task.get("intent", ""),
                                         ev.get("string_note"), judge)


def evaluate_url_match(task: dict, final_url: str) -> tuple[float, list[dict]]:
    ev = task["eval"]
    rule = ev.get("url_note") or "EXACT"
    s = url_match(final_url, ev["reference_url"], rule)
    return s, [{"evaluator": "url_match", "check": rule, "reference": ev["reference_url"],
                "prediction": clean_url(final_url), "score": s}]


async def _select(page, locator: str, target: dict, helpers: dict, last_url: str) -> Any:
    if not locator.strip():
        return await page.content()
    if locator.startswith("document.") or locator.startswith("[...document."):
        for prep in target.get("prep_actions") or []:
            try:
                await page.evaluate(f"() => {prep}")
            except Exception:  # VAB ignores failing preparation scripts
                pass
        try:
            value = await page.evaluate(f"() => {locator}")
        except Exception:  # the page is not what the task expects: select nothing
            return ""
        return str(value) if value else ""
    if locator.startswith("func:"):
        return await call_helper(locator, helpers, page=page, last_url=last_url)
    raise ValueError(f"unknown program_html locator {locator!r}; expected '', 'document.'/'[...document.' or 'func:'")


async def _apply_required_contents(rc: dict, selected: Any, intent: str, judge, idx: int) -> tuple[Score, list[dict]]:
    score: Score = 1.0
    details: list[dict] = []
    sel_str = selected if isinstance(selected, str) else str(selected)

    def row(check, reference, s, **extra):
        details.append({"evaluator": "program_html", "target": idx, "check": check, "reference": reference,
                        "selected": _short(sel_str), "score": None if s is None else float(s), **extra})

    if "exact_match" in rc:
        s = exact_match(rc["exact_match"], sel_str)
        row("exact_match", rc["exact_match"], s)
        score = mul(score, s)
    if "must_include" in rc:
        for item in rc["must_include"]:
            hit = must_include_any(item, sel_str)
            row("must_include", item, hit)
            score = mul(score, hit)
    if "must_exclude" in rc:
        for item in rc["must_exclude"]:
            ok = must_exclude(item, sel_str)
            row("must_exclude", item, ok)
            score = mul(score, ok)
    if "required_values" in rc:
        s = required_values_match(rc["required_values"], selected)
        row("required_values", rc["required_values"], s)
        score = mul(score, s)
    if "fuzzy_match" in rc:
        s, extra = await _fuzzy(rc["fuzzy_match"], sel_str, intent, judge)
        row("fuzzy_match", rc["fuzzy_match"], s, **extra)
        score = mul(score, s)
    return score, details


async def evaluate_program_html(task: dict, page, helpers: dict | None = None, judge=None, final_url: str | None = None,
                                nav_timeout_ms: int = 30000, settle_timeout_ms: int = 3000) -> tuple[Score, list[dict]]:
    helpers = default_helpers() | (helpers or {})
    final_url = page.url if final_url is None else final_url
    targets = list(enumerate(task["eval"]["program_html"]))
    # Targets on the agent's own page ("last") first, before any other target navigates the page away.
    targets.sort(key=lambda it: it[1]["url"] != "last")
    score: Score = 1.0
    rows: dict[int, list[dict]] = {}
    for idx, target in targets:
        url = target["url"]
        if url.startswith("func:"):
            url = str(await call_helper(url, helpers, page=page, last_url=final_url))
        if PLACEHOLDER_RE.search(url):
            raise ValueError(f"task {task.get('task_id')!r}: eval.program_html[{idx}].url {url!r} still holds a site "
                             f"placeholder; substitute site URLs first (no URL configured for that site?)")
        nav_error = None
        if url != "last":
            try:
                await page.goto(url, wait_until="load", timeout=nav_timeout_ms)
                try:  # let XHR-rendered content arrive, bounded (VAB slept a fixed 3 s)
                    await page.wait_for_load_state("networkidle", timeout=settle_timeout_ms)
                except Exception:
                    pass
            except Exception as e:
                nav_error = f"navigation to {url} failed: {e!s:.200}"
        selected = "" if nav_error else await _select(page, target["locator"], target, helpers, final_url)
        head = {"evaluator": "program_html", "target": idx, "check": "select", "url": url,
                "locator": target["locator"], "selected": _short(selected)}
        if nav_error:
            head["error"] = nav_error
        if selected is None:  # VAB: the page is wrong, the whole task scores 0
            rows[idx] = [{**head, "score": 0.0, "note": "locator selected None"}]
            score = 0.0
            continue
        if isinstance(selected, str):
            selected = html_lib.unescape(selected)
        s, det = await _apply_required_contents(target["required_contents"], selected, task.get("intent", ""), judge, idx)
        rows[idx] = [{**head, "score": s}] + det
        score = mul(score, s)
    return score, [r for idx in sorted(rows) for r in rows[idx]]


async def evaluate_task(task: dict, page, answer: str | None, helpers: dict | None = None, judge=None,
                        urls: dict[str, str] | None = None) -> EvalResult:
    """Score a finished episode: the product over ``task['eval']['eval_types']``. ``page`` is the final active
    Playwright (async) page, needed by url_match and program_html; ``answer`` is the STOP action's answer (None if the
    agent never stopped, scored as ""). ``helpers`` maps ``func:`` names to callables (sync or async) and extends
    :func:`default_helpers` (pass ``webarena_site_helpers(urls)`` for shopping_get_latest_order_url). ``judge``
    scores fuzzy_match and the N/A reason check: an :class:`LLMJudge`, a :class:`FallbackJudge` (``eval.judge:
    none``) or anything with async ``fuzzy_match(intent, reference_items, pred)`` and ``ua_match(intent, reason,
    pred)`` returning (score, reply); see :func:`judge_from_settings`. Without one (None) those checks are unscored
    and so is the task (score None), unless another check scored 0. ``urls`` ({site: base URL}) substitutes
    __SHOPPING__-style placeholders first; a placeholder left in a reference URL is an error, never a silent 0."""
    if urls:
        task = substitute_placeholders(task, urls)
    ev = task["eval"]
    if PLACEHOLDER_RE.search(str(ev.get("reference_url") or "")):
        raise ValueError(f"task {task.get('task_id')!r}: eval.reference_url {ev['reference_url']!r} holds a site "
                         f"placeholder; pass urls= or substitute the task first")
    final_url = page.url if page is not None else None
    score: Score = 1.0
    details: list[dict] = []
    for etype in ev["eval_types"]:
        if etype == "string_match":
            s, d = await evaluate_string_match(task, answer, judge)
        elif etype == "url_match":
            if final_url is None:
                raise ValueError(f"task {task.get('task_id')!r}: url_match needs the final page")
            s, d = evaluate_url_match(task, final_url)
        elif etype == "program_html":
            if page is None:
                raise ValueError(f"task {task.get('task_id')!r}: program_html needs the final page")
            s, d = await evaluate_program_html(task, page, helpers, judge, final_url)
        else:
            raise ValueError(f"task {task.get('task_id')!r}: field 'eval.eval_types': unknown eval type {etype!r}; "
                             f"allowed: ['string_match', 'url_match', 'program_html']")
        details += d
        details.append({"evaluator": etype, "check": "total", "score": None if s is None else float(s)})
        score = mul(score, s)
    return EvalResult(score=None if score is None else float(score), details=details)

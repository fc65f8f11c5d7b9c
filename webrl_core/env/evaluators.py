"""WebArena-Lite evaluators: string_match, url_match and program_html, with VAB-WebArena-Lite semantics
(``evaluation_harness/evaluators.py``: ``StringEvaluator``, ``URLEvaluator``, ``HTMLContentEvaluator``; the LLM judge
of ``helper_functions.py``: ``llm_fuzzy_match``, ``llm_ua_match``). Like ``EvaluatorComb``, a task scores

    score(task) = prod_{t in eval.eval_types} score_t          (each score_t is 0 or 1)

* string_match -- the prediction is the final answer of the STOP action, cleaned (surrounding whitespace and one pair
  of surrounding quotes stripped, lowercased). ``exact_match``: equality. ``must_include``: every item must hit; an item
  may hold alternatives separated by " |OR| " and any one may hit; a reference that is a single word token is checked
  by token membership in the word-tokenized prediction (tokens holding "/" are also split), otherwise by substring.
  ``fuzzy_match``: a list is joined with ", " and graded by one LLM judge call (correct -> 1; incorrect or partially
  correct -> 0); the literal "N/A" is first tested by exact match, then the reported reason is compared with
  ``string_note`` by the judge ("same" -> 1). ``must_exclude``, ``required_values`` and ``one_of`` follow VAB too.
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
never ``eval``-ed. Without a configured judge, fuzzy_match uses a documented deterministic fallback
(:func:`fallback_fuzzy_match`) and marks ``judge: "fallback"`` in the details.
"""

from __future__ import annotations

import ast
import html as html_lib
import inspect
import os
import re
from dataclasses import dataclass, field
from typing import Any, Callable
from urllib.parse import urlparse

import httpx

from webrl_core.env.placeholders import PLACEHOLDER_RE, substitute_placeholders

OR_SEP = " |OR| "
URL_RULES = ("EXACT", "GOLD in PRED")
_DETAIL_CHARS = 400  # selected page text kept per detail row (the page itself can be megabytes)


# ---------------------------------------------------------------------------------------------
# pure string checks

def clean_answer(text: str) -> str:
    """Strip whitespace and one pair of surrounding quotes, then lowercase."""
    text = str(text).strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        text = text[1:-1]
    return text.lower()


# An approximation of NLTK's (Treebank) word_tokenize, which we do not depend on: words keep inner "." "," ":" "/"
# "-" "'" "&" "@" joins (3.5, 1,000, 12:30, a/b, e-mail), "n't" and "'s"-style clitics are separate tokens, and every
# other punctuation mark is its own token.
_CLITIC_NT = re.compile(r"(?i)(\w)(n't)\b")
_CLITIC_S = re.compile(r"(?i)(\w)('(?:s|m|d|ll|re|ve))\b")
_TOKEN = re.compile(r"n't|'(?:s|m|d|ll|re|ve)\b|\w+(?:[.,:/'\-&@]\w+)*|\.\.\.|[^\w\s]", re.IGNORECASE)


def word_tokenize(text: str) -> list[str]:
    text = _CLITIC_NT.sub(r"\1 \2", text)
    text = _CLITIC_S.sub(r"\1 \2", text)
    return _TOKEN.findall(text)


def _pred_tokens(pred: str) -> set[str]:
    tokens = word_tokenize(pred)
    out = set(tokens)
    for tok in tokens:  # "a/b" also counts as "a" and "b"
        if "/" in tok:
            out.update(p for p in tok.split("/") if p)
    return out


def exact_match(ref: str, pred: str) -> float:
    return float(clean_answer(ref) == clean_answer(pred))


def must_include(ref: str, pred: str) -> float:
    """One reference (no |OR|): token membership if it is a single word token, else substring."""
    ref_c, pred_c = clean_answer(ref), clean_answer(pred)
    if len(word_tokenize(ref_c)) == 1:
        return float(ref_c in _pred_tokens(pred_c))
    return float(ref_c in pred_c)


def must_include_any(item: str, pred: str) -> float:
    """A must_include item with " |OR| " alternatives: any alternative may hit."""
    return float(any(must_include(alt, pred) for alt in item.split(OR_SEP)))


def must_exclude(ref: str, pred: str) -> float:
    return 1.0 - must_include(ref, pred)


def str_to_int(text: str) -> int | None:
    try:
        return int(str(text).strip().replace(",", ""))
    except ValueError:
        return None


def compare_inequality(value: float, inequality: str, tol: float = 1e-8) -> bool:
    """``value`` against "< 700", ">= 300", "== 5" (operators tried longest first, as VAB does)."""
    ops = {"<=": lambda x, y: x <= y + tol, ">=": lambda x, y: x >= y - tol, "==": lambda x, y: abs(x - y) <= tol,
           "<": lambda x, y: x < y + tol, ">": lambda x, y: x > y - tol}
    for op, fn in ops.items():
        if op in inequality:
            return fn(value, float(inequality.split(op, 1)[1].strip()))
    raise ValueError(f"invalid inequality {inequality!r}; expected an operator among {list(ops)}")


def required_values_match(values: list[str], selected: Any) -> float:
    num = str_to_int(selected) if isinstance(selected, str) else selected
    if num is None:
        return 0.0
    return float(all(any(compare_inequality(num, alt) for alt in v.split(OR_SEP)) for v in values))


def fallback_fuzzy_match(reference: list[str] | str, pred: str) -> float:
    """Deterministic stand-in for the LLM judge: 1 iff the cleaned prediction equals the joined reference or
    every reference item passes :func:`must_include` (so "Luma, 2" matches ["luma", "2"]); else 0."""
    items = [reference] if isinstance(reference, str) else list(reference)
    if exact_match(", ".join(items), pred):
        return 1.0
    return float(bool(items) and all(must_include(it, pred) for it in items))


# ---------------------------------------------------------------------------------------------
# URLs

def clean_url(url: str) -> str:
    url = str(url).replace("localhost", "127.0.0.1")
    return url[:-1] if url.endswith("/") else url


def url_match(pred_url: str, reference_url: str, url_note: str | None = None) -> float:
    rule = url_note or "EXACT"
    if rule not in URL_RULES:
        raise ValueError(f"unknown url_note {rule!r}; allowed: {list(URL_RULES)}")
    pred = clean_url(pred_url)
    refs = [clean_url(r) for r in reference_url.split(OR_SEP)]
    if rule == "EXACT":
        return float(pred in refs)
    return float(any(r in pred for r in refs))


def reddit_get_post_url(url: str) -> str:
    """A Postmill comment URL (/f/<forum>/<post_id>/...) -> its post URL; other URLs unchanged (VAB helper)."""
    parsed = urlparse(url)
    parts = parsed.path.split("/")
    if len(parts) < 4 or parts[1] != "f":
        return url
    return f"{parsed.scheme}://{parsed.netloc}/f/{parts[2]}/{parts[3]}/"


async def get_query_text(page, selector: str) -> str:
    """textContent of the first element matching a CSS selector, "" if none (VAB helper, no lowercasing)."""
    try:
        text = await page.evaluate("(sel) => { const e = document.querySelector(sel); return e ? e.textContent : ''; }",
                                   selector)
    except Exception:  # a closed or crashed page selects nothing, as in VAB
        return ""
    return text or ""


async def get_query_text_lowercase(page, selector: str) -> str:
    return (await get_query_text(page, selector)).lower()


async def gitlab_get_project_memeber_role(page, account_name: str) -> str:
    """Role shown for ``@account_name`` on a GitLab project members page, "" if absent (VAB name, typo included)."""
    script = """(name) => {
        const accounts = [...document.querySelectorAll("td[data-label='Account'] span.gl-avatar-labeled-sublabel")];
        const i = accounts.findIndex(e => e.outerText === '@' + name);
        const roles = document.querySelectorAll("td.col-max-role span");
        return i >= 0 && roles[i] ? roles[i].outerText : "";
    }"""
    try:
        return await page.evaluate(script, account_name) or ""
    except Exception:
        return ""


def webarena_site_helpers(urls: dict[str, str], admin_username: str = "admin", admin_password: str = "admin1234",
                          timeout_s: float = 30.0) -> dict[str, Callable]:
    """Helpers that talk to the sites themselves. ``shopping_get_latest_order_url`` asks Magento's REST API (with
    WebArena's built-in admin account) for the newest order; the evaluator needs network access to the site."""
    shopping = urls.get("shopping", "").rstrip("/")

    async def shopping_get_latest_order_url() -> str:
        if not shopping:
            raise ValueError("shopping_get_latest_order_url needs a 'shopping' site URL")
        async with httpx.AsyncClient(timeout=timeout_s) as client:
            r = await client.post(f"{shopping}/rest/default/V1/integration/admin/token",
                                  json={"username": admin_username, "password": admin_password})
            r.raise_for_status()
            params = {"searchCriteria[sortOrders][0][field]": "created_at",
                      "searchCriteria[sortOrders][0][direction]": "DESC", "searchCriteria[pageSize]": "1"}
            r = await client.get(f"{shopping}/rest/V1/orders", params=params,
                                 headers={"Authorization": f"Bearer {r.json()}"})
            r.raise_for_status()
            order_id = int(r.json()["items"][0]["increment_id"])
        return f"{shopping}/sales/order/view/order_id/{order_id}/"

    return {"shopping_get_latest_order_url": shopping_get_latest_order_url}


def default_helpers(urls: dict[str, str] | None = None) -> dict[str, Callable]:
    """The helpers WebArena-Lite's ``func:`` targets use (reddit_get_post_url, gitlab_get_project_memeber_role,
    shopping_get_latest_order_url) plus get_query_text[_lowercase]; the shopping one only when ``urls`` are given."""
    helpers = {"reddit_get_post_url": reddit_get_post_url, "get_query_text": get_query_text,
               "get_query_text_lowercase": get_query_text_lowercase,
               "gitlab_get_project_memeber_role": gitlab_get_project_memeber_role}
    return helpers | (webarena_site_helpers(urls) if urls else {})


# ---------------------------------------------------------------------------------------------
# func: calls, parsed with ast (never eval)

PAGE_ARG = "__page__"
LAST_URL_ARG = "__last_url__"


@dataclass
class HelperCall:
    name: str
    args: list[Any]
    kwargs: dict[str, Any]


def parse_helper_call(expr: str) -> HelperCall:
    """Parse ``name(arg, ...)`` where each argument is a Python literal or the bare name __page__ / __last_url__.
    A leading "func:" is dropped. Raises ValueError naming the expression on anything else."""
    src = expr[len("func:"):] if expr.startswith("func:") else expr
    try:
        node = ast.parse(src.strip(), mode="eval").body
    except SyntaxError as e:
        raise ValueError(f"func expression {expr!r} is not a call: {e.msg}") from None
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        raise ValueError(f"func expression {expr!r} must be a call of a plain helper name, e.g. helper('x')")

    def arg_value(a: ast.expr) -> Any:
        if isinstance(a, ast.Name) and a.id in (PAGE_ARG, LAST_URL_ARG):
            return _Special(a.id)
        try:
            return ast.literal_eval(a)
        except ValueError:
            raise ValueError(f"func expression {expr!r}: argument {ast.unparse(a)!r} is neither a literal nor "
                             f"{PAGE_ARG}/{LAST_URL_ARG}") from None

    if any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords):
        raise ValueError(f"func expression {expr!r}: *args/**kwargs are not allowed")
    return HelperCall(node.func.id, [arg_value(a) for a in node.args],
                      {k.arg: arg_value(k.value) for k in node.keywords})


@dataclass(frozen=True)
class _Special:
    name: str


async def call_helper(expr: str, helpers: dict[str, Callable], page=None, last_url: str = "") -> Any:
    """Run a parsed ``func:`` call: __page__ -> page, __last_url__ (bare, or inside a string) -> last_url.
    A helper may be sync or async."""
    call = parse_helper_call(expr)
    if call.name not in helpers:
        raise ValueError(f"func expression {expr!r}: unknown helper {call.name!r}; registered: {sorted(helpers)}")

    def bind(v: Any) -> Any:
        if isinstance(v, _Special):
            return page if v.name == PAGE_ARG else last_url
        if isinstance(v, str):
            return v.replace(LAST_URL_ARG, last_url)
        return v

    out = helpers[call.name](*[bind(a) for a in call.args], **{k: bind(v) for k, v in call.kwargs.items()})
    if inspect.isawaitable(out):
        out = await out
    return out


# ---------------------------------------------------------------------------------------------
# LLM judge (OpenAI-compatible chat completions)

_FUZZY_PROMPT = """You grade the answer of a web agent against a reference answer.
Task: {intent}
Reference answer: {reference}
Predicted answer: {prediction}
The predicted answer may be phrased differently, but it must state the same facts as the reference answer.
"N/A" in either answer means the task is not achievable.
Is the predicted answer correct, incorrect or partially correct? Reply with one of: correct, incorrect, partially correct."""

_UA_PROMPT = """A web agent reported that a task cannot be completed.
Task: {intent}
Actual reason the task cannot be completed: {reference}
Reason reported by the agent: {prediction}
Do the two reasons describe the same problem? Reply with one word: same or different."""


class JudgeError(RuntimeError):
    """The judge endpoint could not be reached or answered with something unusable."""


class LLMJudge:
    """fuzzy_match / ua_match grader on an OpenAI-compatible ``/chat/completions`` endpoint (temperature 0,
    max_tokens 768, as VAB's gpt-4-1106-preview judge) through the ``openai`` SDK, which retries timeouts, connection
    errors, 429 and 5xx answers ``retries`` times. The API key is read from ``api_key_env`` if set."""

    def __init__(self, base_url: str, model: str = "gpt-4-1106-preview", api_key_env: str = "OPENAI_API_KEY",
                 timeout_s: float = 60.0, retries: int = 2, max_tokens: int = 768):
        self.base_url = base_url.rstrip("/")
        self.model, self.api_key_env = model, api_key_env
        self.timeout_s, self.retries, self.max_tokens = timeout_s, retries, max_tokens

    @classmethod
    def from_config(cls, cfg) -> "LLMJudge | None":
        """From a WebRLSettings (eval.judge/judge_model); None when no judge URL is configured."""
        url = cfg.eval.judge
        return cls(url, model=cfg.eval.judge_model) if url and url != "none" else None

    async def complete(self, prompt: str) -> str:
        import openai  # ~0.5 s to import: only a configured judge needs it, and task-file tools import this module

        key = os.environ.get(self.api_key_env) if self.api_key_env else None
        messages = [{"role": "system", "content": "You are a strict, careful grader."},
                    {"role": "user", "content": prompt}]
        # no key: no Authorization header (the SDK insists on a key, so it gets one it never sends)
        no_auth = {} if key else {"extra_headers": {"Authorization": openai.Omit()}}
        try:
            async with openai.AsyncOpenAI(base_url=self.base_url, api_key=key or "unused", timeout=self.timeout_s,
                                          max_retries=self.retries) as client:
                reply = await client.chat.completions.create(model=self.model, temperature=0, messages=messages,
                                                             max_tokens=self.max_tokens, **no_auth)
            return reply.choices[0].message.content or ""
        except (openai.APIError, AttributeError, IndexError, TypeError, ValueError) as e:
            raise JudgeError(f"judge {self.base_url} (model {self.model}) failed after up to {self.retries + 1} tries: "
                             f"{e!r}") from None

    async def fuzzy_match(self, intent: str, reference: str, prediction: str) -> tuple[float, str]:
        reply = await self.complete(_FUZZY_PROMPT.format(intent=intent, reference=reference, prediction=prediction))
        return parse_fuzzy_verdict(reply), reply

    async def ua_match(self, intent: str, reference: str, prediction: str) -> tuple[float, str]:
        reply = await self.complete(_UA_PROMPT.format(intent=intent, reference=reference, prediction=prediction))
        return parse_ua_verdict(reply), reply


def parse_fuzzy_verdict(reply: str) -> float:
    """'partially correct' and 'incorrect' score 0 (checked first: both contain 'correct'); 'correct' scores 1."""
    r = reply.lower()
    if "partially correct" in r or "incorrect" in r:
        return 0.0
    return float("correct" in r)


def parse_ua_verdict(reply: str) -> float:
    r = reply.lower()
    if "different" in r:
        return 0.0
    return float("same" in r)


# ---------------------------------------------------------------------------------------------
# the three evaluators

@dataclass
class EvalResult:
    score: float
    details: list[dict] = field(default_factory=list)

    @property
    def success(self) -> bool:
        return self.score >= 1.0


def _short(text: Any) -> str:
    s = str(text)
    return s if len(s) <= _DETAIL_CHARS else s[:_DETAIL_CHARS] + f"... [{len(s)} chars]"


async def _fuzzy(reference: list[str] | str, pred: str, intent: str, judge) -> tuple[float, dict]:
    ref = ", ".join(reference) if isinstance(reference, list) else reference
    if judge is None:
        return fallback_fuzzy_match(reference, pred), {"judge": "fallback"}
    score, reply = await judge.fuzzy_match(intent, ref, pred)
    return score, {"judge": getattr(judge, "model", type(judge).__name__), "judge_reply": _short(reply)}


async def check_reference_answers(reference_answers: dict, pred: str, intent: str = "", string_note: str | None = None,
                                  judge=None, source: str = "string_match") -> tuple[float, list[dict]]:
    """Apply string_match's reference_answers to a prediction; one detail row per check."""
    pred_c = clean_answer(pred)
    score, details = 1.0, []

    def row(check, reference, s, **extra):
        details.append({"evaluator": source, "check": check, "reference": reference, "prediction": _short(pred_c),
                        "score": float(s), **extra})

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
            if value == "N/A":
                s = exact_match("N/A", pred_c)
                if s == 1.0:
                    row("fuzzy_match:N/A exact", "N/A", s)
                elif judge is None:  # comparing free-text reasons needs a judge; the fallback cannot pass it
                    row("fuzzy_match:N/A ua_match", string_note, 0.0, judge="fallback")
                    s = 0.0
                else:
                    s, reply = await judge.ua_match(intent, string_note or "", pred_c)
                    row("fuzzy_match:N/A ua_match", string_note, s,
                        judge=getattr(judge, "model", type(judge).__name__), judge_reply=_short(reply))
            else:
                s, extra = await _fuzzy(value, pred_c, intent, judge)
                row("fuzzy_match", value, s, **extra)
        else:
            raise ValueError(f"eval.reference_answers: unknown key {approach!r}; allowed: exact_match, must_include, "
                             f"must_exclude, fuzzy_match, required_values, one_of")
        score *= s
    return score, details


async def evaluate_string_match(task: dict, answer: str | None, judge=None) -> tuple[float, list[dict]]:
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


async def _apply_required_contents(rc: dict, selected: Any, intent: str, judge, idx: int) -> tuple[float, list[dict]]:
    score, details = 1.0, []
    sel_str = selected if isinstance(selected, str) else str(selected)

    def row(check, reference, s, **extra):
        details.append({"evaluator": "program_html", "target": idx, "check": check, "reference": reference,
                        "selected": _short(sel_str), "score": float(s), **extra})

    if "exact_match" in rc:
        s = exact_match(rc["exact_match"], sel_str)
        row("exact_match", rc["exact_match"], s)
        score *= s
    if "must_include" in rc:
        for item in rc["must_include"]:
            hit = must_include_any(item, sel_str)
            row("must_include", item, hit)
            score *= hit
    if "must_exclude" in rc:
        for item in rc["must_exclude"]:
            ok = must_exclude(item, sel_str)
            row("must_exclude", item, ok)
            score *= ok
    if "required_values" in rc:
        s = required_values_match(rc["required_values"], selected)
        row("required_values", rc["required_values"], s)
        score *= s
    if "fuzzy_match" in rc:
        s, extra = await _fuzzy(rc["fuzzy_match"], sel_str, intent, judge)
        row("fuzzy_match", rc["fuzzy_match"], s, **extra)
        score *= s
    return score, details


async def evaluate_program_html(task: dict, page, helpers: dict | None = None, judge=None, final_url: str | None = None,
                                nav_timeout_ms: int = 30000, settle_timeout_ms: int = 3000) -> tuple[float, list[dict]]:
    helpers = default_helpers() | (helpers or {})
    final_url = page.url if final_url is None else final_url
    targets = list(enumerate(task["eval"]["program_html"]))
    # Targets on the agent's own page ("last") first, before any other target navigates the page away.
    targets.sort(key=lambda it: it[1]["url"] != "last")
    score, rows = 1.0, {}
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
        score *= s
    return score, [r for idx in sorted(rows) for r in rows[idx]]


async def evaluate_task(task: dict, page, answer: str | None, helpers: dict | None = None, judge=None,
                        urls: dict[str, str] | None = None) -> EvalResult:
    """Score a finished episode: the product over ``task['eval']['eval_types']``. ``page`` is the final active
    Playwright (async) page, needed by url_match and program_html; ``answer`` is the STOP action's answer (None if the
    agent never stopped, scored as ""). ``helpers`` maps ``func:`` names to callables (sync or async) and extends
    :func:`default_helpers` (pass ``webarena_site_helpers(urls)`` for shopping_get_latest_order_url); ``judge`` is an :class:`LLMJudge` (or anything with async ``fuzzy_match`` and
    ``ua_match``), None for the deterministic fallback. ``urls`` ({site: base URL}) substitutes __SHOPPING__-style
    placeholders first; a placeholder left in a reference URL is an error, never a silent 0."""
    if urls:
        task = substitute_placeholders(task, urls)
    ev = task["eval"]
    if PLACEHOLDER_RE.search(str(ev.get("reference_url") or "")):
        raise ValueError(f"task {task.get('task_id')!r}: eval.reference_url {ev['reference_url']!r} holds a site "
                         f"placeholder; pass urls= or substitute the task first")
    final_url = page.url if page is not None else None
    score, details = 1.0, []
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
        details.append({"evaluator": etype, "check": "total", "score": float(s)})
        score *= s
    return EvalResult(score=float(score), details=details)

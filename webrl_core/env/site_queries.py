"""The ``func:`` side of WebArena-Lite's program_html checks: the site helpers its task configs call
(``reddit_get_post_url``, ``get_query_text``/``get_query_text_lowercase``, ``gitlab_get_project_memeber_role``, and
``shopping_get_latest_order_url``, which asks Magento's REST API with WebArena's admin account), and the
``func:name(args)`` expressions of target URLs and locators, parsed with ``ast`` and called from a registry of
helpers (never ``eval``-ed), ``__page__`` and ``__last_url__`` bound to the page and the agent's final URL.

Official source: VisualAgentBench (github.com/THUDM/VisualAgentBench, commit 9055fc2)
``VAB-WebArena-Lite/new/helper_functions_eval.py``, which replaces WebArena's
``evaluation_harness/helper_functions.py``: ``reddit_get_post_url``, ``get_query_text``,
``get_query_text_lowercase``, ``gitlab_get_project_memeber_role``, ``shopping_get_auth_token`` and
``shopping_get_latest_order_url``; the ``func:`` handling of ``HTMLContentExactEvaluator.__call__`` in
``VAB-WebArena-Lite/new/evaluators.py`` (there ``eval`` of the text with ``__last_url__`` and ``__page__`` replaced).
Here the page helpers are async, on Playwright's async page.
"""

from __future__ import annotations

import ast
import inspect
from dataclasses import dataclass
from typing import Any, Callable
from urllib.parse import urlparse

import httpx


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

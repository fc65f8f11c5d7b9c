"""Log in to the WebArena sites and save Playwright storage states (``<auth_dir>/<site>_state.json``).

The recipes are WebArena's (``browser_env/auto_login.py`` and ``browser_env/env_config.py`` of
github.com/web-arena-x/webarena, commit f62e0b9): the login page of each site, its fields and button, the standard
account, and the page that only a logged-in visitor sees. Each field lists WebArena's selector first and then ones
that also match the embedded sites (``webrl_core.sites``, which answer the same login paths), so one recipe serves
both. Map, Wikipedia and the homepage have no login.

A login counts only when (1) after submitting, the page shows no password field (a rejected login shows the form
again) and (2) a fresh context with the saved state opens the site's authenticated-only page (WebArena's expiry
check page) without being sent to a login page (a path with "login" or "sign_in"; Magento's admin shows its form
in place instead). Failures raise ``LoginError`` naming the site, the URL and the account. A page's own password
fields do not count against (2): Postmill's account page, reddit's check page, has them.

Accounts: WebArena's, overridable per site by ``WEBARENA_<SITE>_USERNAME`` / ``WEBARENA_<SITE>_PASSWORD``
(``<SITE>``: SHOPPING, SHOPPING_ADMIN, GITLAB, REDDIT).

Multi-site tasks name a combined state (``./.auth/gitlab.reddit_state.json`` in WebArena and WebArena-Lite):
``merge_states`` builds it from the per-site files; ``write_combined_states`` writes every pair, as WebArena's
``auto_login.py`` does, except pairs whose cookies collide (sites on one host sharing a cookie name: WebArena
skips reddit with shopping/shopping_admin for that reason).
"""

from __future__ import annotations

import asyncio
import itertools
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping, NamedTuple
from urllib.parse import urlsplit

from webrl_core.env.browser import (StateCollision, combined_state, launch_chromium, merge_states,  # noqa: F401
                                    state_file_name, write_json_atomic)
from webrl_core.env.browser import sites_of_state_file as _sites_of_state_file
from webrl_core.websites import ALL_SITES


class LoginError(RuntimeError):
    """A login failed; the message names the site, the URL and the account."""


class Field(NamedTuple):
    """One way to find an element: ``kind`` is label | placeholder | testid | button | css."""

    kind: str
    value: str
    exact: bool = False

    def locate(self, page):
        if self.kind == "label":
            return page.get_by_label(self.value, exact=self.exact)
        if self.kind == "placeholder":
            return page.get_by_placeholder(self.value, exact=self.exact)
        if self.kind == "testid":
            return page.get_by_test_id(self.value)
        if self.kind == "button":
            return page.get_by_role("button", name=self.value, exact=self.exact)
        if self.kind == "css":
            return page.locator(self.value)
        raise ValueError(f"unknown field kind {self.kind!r}")

    def __str__(self) -> str:
        return f"{self.kind}={self.value!r}"


@dataclass(frozen=True)
class LoginRecipe:
    """How to log in to one WebArena site (paths are relative to the site's base URL)."""

    site: str
    login_path: str               # the login page ("" for shopping_admin: its base URL shows the form)
    username: tuple[Field, ...]   # candidates, WebArena's first; the first one on the page is used
    password: tuple[Field, ...]
    submit: tuple[Field, ...]
    check_path: str               # a page only a logged-in visitor sees ("{username}" is replaced)
    default_username: str
    default_password: str
    form_in_place: bool = False   # an anonymous visit shows the login form at the page's own URL (Magento admin)

    @property
    def env_prefix(self) -> str:
        return f"WEBARENA_{self.site.upper()}"


# WebArena's browser_env/auto_login.py (renew_comb: login pages, selectors; URLS: the expiry check pages) and
# browser_env/env_config.py (ACCOUNTS). Order: auto_login.py's SITES.
WEBARENA_LOGINS: dict[str, LoginRecipe] = {r.site: r for r in (
    LoginRecipe("gitlab", "/users/sign_in",
                username=(Field("testid", "username-field"), Field("label", "Username")),
                password=(Field("testid", "password-field"), Field("css", "input[type=password]")),
                submit=(Field("testid", "sign-in-button"), Field("button", "Sign in")),
                check_path="/-/profile", default_username="byteblaze", default_password="hello1234"),
    LoginRecipe("shopping", "/customer/account/login/",
                username=(Field("label", "Email", exact=True),),
                password=(Field("label", "Password", exact=True),),
                submit=(Field("button", "Sign In"),),
                check_path="/wishlist/", default_username="emma.lopez@gmail.com", default_password="Password.123"),
    LoginRecipe("shopping_admin", "",
                username=(Field("placeholder", "user name"), Field("label", "Username")),
                password=(Field("placeholder", "password"), Field("css", "input[type=password]")),
                submit=(Field("button", "Sign in"),),
                check_path="/dashboard", default_username="admin", default_password="admin1234",
                form_in_place=True),
    LoginRecipe("reddit", "/login",
                username=(Field("label", "Username"),),
                password=(Field("label", "Password"),),
                submit=(Field("button", "Log in"),),
                check_path="/user/{username}/account", default_username="MarvelsGrantMan136",
                default_password="test1234"),
)}
LOGIN_SITES = tuple(WEBARENA_LOGINS)
NO_LOGIN_SITES = tuple(s for s in ALL_SITES if s not in WEBARENA_LOGINS)

# what marks a login page: a visible password field (WebArena's forms, the embedded sites' forms)
PASSWORD_FIELD = "input[type=password]:visible"
# where a rejected login's message appears (Magento, GitLab, Postmill, the embedded sites)
ERROR_TEXT = ".message-error, .messages .error, [role=alert], .gl-alert-body, .flash-alert, .alert-danger, .error"


def account_for(site: str, environ: Mapping[str, str] | None = None) -> tuple[str, str]:
    """(username, password) of a site: ``WEBARENA_<SITE>_USERNAME`` / ``_PASSWORD`` over WebArena's account."""
    env = os.environ if environ is None else environ
    r = recipe_for(site)
    return (env.get(f"{r.env_prefix}_USERNAME") or r.default_username,
            env.get(f"{r.env_prefix}_PASSWORD") or r.default_password)


def recipe_for(site: str) -> LoginRecipe:
    if site not in WEBARENA_LOGINS:
        extra = " (it has no login)" if site in NO_LOGIN_SITES else ""
        raise ValueError(f"no login for site {site!r}{extra}; sites with a login: {list(LOGIN_SITES)}")
    return WEBARENA_LOGINS[site]


# ---------------------------------------------------------------------------------------------- state files

def sites_of_state_file(name: str) -> list[str] | None:
    """The sites with a login a state file name stands for (``gitlab.reddit_state.json`` -> [gitlab, reddit])."""
    return _sites_of_state_file(name, LOGIN_SITES)


def write_combined_states(auth_dir: str | Path) -> list[dict]:
    """Every pair of sites whose ``<site>_state.json`` is in ``auth_dir``, merged into ``<a>.<b>_state.json``.
    Rows: {"sites", "file"} or {"sites", "skipped": reason}."""
    have = [s for s in LOGIN_SITES if (Path(auth_dir) / state_file_name([s])).is_file()]
    rows = []
    for pair in itertools.combinations(sorted(have), 2):
        try:
            rows.append({"sites": list(pair), "file": str(combined_state(auth_dir, list(pair)))})
        except StateCollision as e:
            rows.append({"sites": list(pair), "skipped": str(e)})
    return rows


# ---------------------------------------------------------------------------------------------- logging in

def looks_like_login_page(url: str) -> bool:
    """A URL of a login page: Magento's /customer/account/login/..., GitLab's /users/sign_in, Postmill's and the
    embedded sites' /login."""
    path = urlsplit(url).path.lower()
    return any(w in path for w in ("login", "sign_in", "signin"))


async def _first(page, fields: tuple[Field, ...], timeout_ms: int):
    """The first visible element any of ``fields`` finds (waiting up to ``timeout_ms``), or None."""
    loc = fields[0].locate(page)
    for f in fields[1:]:
        loc = loc.or_(f.locate(page))
    loc = loc.filter(visible=True).first
    try:
        await loc.wait_for(state="visible", timeout=timeout_ms)
    except Exception:
        return None
    return loc


async def _page_message(page) -> str:
    """The rejected login's message, else the page title."""
    try:
        errs = page.locator(ERROR_TEXT).filter(visible=True)
        if await errs.count():
            return (await errs.first.inner_text()).strip()[:300]
        return f"page title {await page.title()!r}"
    except Exception:
        return ""


async def logged_in_problem(context, recipe: LoginRecipe, base_url: str, username: str,
                            timeout_ms: int = 30000) -> str | None:
    """None when ``context`` opens the site's authenticated-only page as a logged-in visitor; else why not."""
    url = base_url.rstrip("/") + recipe.check_path.replace("{username}", username)
    page = await context.new_page()
    try:
        try:
            resp = await page.goto(url, wait_until="domcontentloaded", timeout=timeout_ms)
        except Exception as e:
            return f"{url} did not load: {str(e).splitlines()[0]}"
        if resp is not None and resp.status >= 400:
            return f"{url} answered HTTP {resp.status}"
        if looks_like_login_page(page.url):
            return f"{url} led to a login page ({page.url})"
        if recipe.form_in_place and await page.locator(PASSWORD_FIELD).count():
            return f"{url} showed the login form"
        return None
    finally:
        await page.close()


async def login_site(browser, site: str, base_url: str, username: str, password: str, out_path: str | Path,
                     timeout_ms: int = 30000, viewport: dict | None = None) -> dict:
    """Log in to one site in a fresh context of ``browser``, check it, and write its storage state (atomically)
    to ``out_path``. Returns {"site", "account", "url", "file", "seconds"}; raises ``LoginError``."""
    recipe = recipe_for(site)
    base_url = base_url.rstrip("/")
    url = base_url + recipe.login_path
    who = f"{site}: login as {username!r} at {url}"
    t0 = time.perf_counter()
    ctx = await browser.new_context(viewport=viewport or {"width": 1280, "height": 720})
    ctx.set_default_timeout(timeout_ms)
    ctx.set_default_navigation_timeout(timeout_ms)
    try:
        page = await ctx.new_page()
        try:
            resp = await page.goto(url, wait_until="domcontentloaded")
        except Exception as e:
            raise LoginError(f"{who} failed: the login page did not load: {str(e).splitlines()[0]}") from None
        if resp is not None and resp.status >= 400:
            raise LoginError(f"{who} failed: the login page answered HTTP {resp.status}")
        found = []
        for what, fields in (("username field", recipe.username), ("password field", recipe.password),
                             ("submit button", recipe.submit)):
            loc = await _first(page, fields, timeout_ms if not found else 2000)
            if loc is None:
                raise LoginError(f"{who} failed: no {what} on {page.url} (looked for "
                                 f"{', '.join(map(str, fields))}); is this the site's login page?")
            found.append(loc)
        user_box, pass_box, submit = found
        await user_box.fill(username)
        await pass_box.fill(password)
        try:
            async with page.expect_navigation(wait_until="domcontentloaded", timeout=timeout_ms):
                await submit.click()
        except Exception:  # no navigation (a client-side check refused the form): the check below says why
            pass
        if await page.locator(PASSWORD_FIELD).count():
            raise LoginError(f"{who} failed: the login form came back ({page.url}): {await _page_message(page)} "
                             f"(account: {recipe.env_prefix}_USERNAME / {recipe.env_prefix}_PASSWORD, or "
                             f"WebArena's default)")
        state = await ctx.storage_state()
    finally:
        await ctx.close()
    check = await browser.new_context(storage_state=state, viewport=viewport or {"width": 1280, "height": 720})
    try:
        problem = await logged_in_problem(check, recipe, base_url, username, timeout_ms)
    finally:
        await check.close()
    if problem:
        raise LoginError(f"{who} failed: the saved state is not logged in: {problem}")
    path = write_json_atomic(out_path, state)
    return {"site": site, "account": username, "url": url, "file": str(path),
            "seconds": round(time.perf_counter() - t0, 2)}


async def login_sites(urls: Mapping[str, str], sites: Iterable[str], auth_dir: str | Path, env_cfg,
                      environ: Mapping[str, str] | None = None, timeout_ms: int = 30000) -> dict:
    """Log in to each of ``sites`` (at ``urls[site]``) in one Chromium (``env_cfg``: the env config section, for
    the executable and headless), write ``<auth_dir>/<site>_state.json`` and the pairs' combined states.

    Returns {"logins": [row per site: login_site's, or {"site", "account", "url", "error"}],
    "combined": write_combined_states' rows}. Never raises for one site's failure: the others are still written."""
    from playwright.async_api import async_playwright

    sites = list(dict.fromkeys(sites))
    for s in sites:
        recipe_for(s)
        if s not in urls:
            raise ValueError(f"no URL for site {s!r}: set the {s.upper()} (or WA_{s.upper()}) environment variable "
                             f"or sites.urls.{s}")
    auth_dir = Path(auth_dir)
    auth_dir.mkdir(parents=True, exist_ok=True)
    async with async_playwright() as pw:
        browser = await launch_chromium(pw, env_cfg)
        try:
            async def one(site: str) -> dict:
                user, pw_ = account_for(site, environ)
                try:
                    return await login_site(browser, site, urls[site], user, pw_,
                                            auth_dir / state_file_name([site]), timeout_ms)
                except LoginError as e:
                    return {"site": site, "account": user, "url": urls[site].rstrip("/") + recipe_for(site).login_path,
                            "error": str(e)}

            rows = await asyncio.gather(*(one(s) for s in sites))
        finally:
            await browser.close()
    return {"logins": list(rows), "combined": write_combined_states(auth_dir)}

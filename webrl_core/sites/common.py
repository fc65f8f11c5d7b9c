"""Shared machinery of the embedded sites: per-episode SQLite copies, cookie logins, templates.

Per-episode isolation rule: every request carries (or lacks) the cookie ``webrl_episode=<id>``.
The site serves it from ``<workdir>/<site>/<id>.sqlite``, copied from the seeded template the first
time that id is seen; without the cookie the id is ``default``. Two episodes therefore never see
each other's writes, and every episode starts from the seeded state. Copies are deleted by
``EpisodeDBs.drop(id)`` (the env calls it after scoring) or, as a safety net, when more than
``max_copies`` exist (least recently used first).

Login rule: a site with accounts keeps the signed user name in its own cookie
(``<site>_session=<user>.<hmac>``); cookies are per host, not per port, so each site has its own name.
Handlers marked ``@login_required`` send anonymous visitors to ``/login?next=<path>``.

Handlers are module-level Starlette endpoints; the app factory (``server.build_app``) puts the site's ``SiteKit``
on ``app.state.kit``, where ``site_kit(request)`` finds it.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import re
import shutil
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any, Awaitable, Callable, NamedTuple
from urllib.parse import parse_qs

from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route

EPISODE_COOKIE = "webrl_episode"
DEFAULT_EPISODE = "default"
HERE = Path(__file__).parent
_SAFE_ID = re.compile(r"[^A-Za-z0-9_.-]")


class EpisodeDBs:
    """Copy-on-first-request SQLite databases, one per (site, episode)."""

    def __init__(self, template: Path, folder: Path, max_copies: int = 128):
        self.template = Path(template)
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.max_copies = max_copies
        self._lock = threading.Lock()
        self._last_used: dict[str, float] = {}

    def path(self, episode_id: str) -> Path:
        safe = _SAFE_ID.sub("_", episode_id)[:120] or DEFAULT_EPISODE
        return self.folder / f"{safe}.sqlite"

    def connect(self, episode_id: str) -> sqlite3.Connection:
        p = self.path(episode_id)
        with self._lock:
            if not p.exists():
                tmp = p.with_suffix(".tmp")
                shutil.copyfile(self.template, tmp)
                tmp.replace(p)  # atomic: a reader never sees a half-copied file
                self._evict_locked(keep=p.name)
            self._last_used[p.name] = time.monotonic()
        con = sqlite3.connect(p, timeout=10)
        con.row_factory = sqlite3.Row
        return con

    def drop(self, episode_id: str) -> None:
        p = self.path(episode_id)
        with self._lock:
            self._last_used.pop(p.name, None)
            p.unlink(missing_ok=True)

    def _evict_locked(self, keep: str) -> None:
        if len(self._last_used) < self.max_copies:
            return
        for name, _ in sorted(self._last_used.items(), key=lambda kv: kv[1]):
            if name == keep or len(self._last_used) < self.max_copies:
                continue
            (self.folder / name).unlink(missing_ok=True)
            self._last_used.pop(name, None)


def sign(secret: str, user: str) -> str:
    mac = hmac.new(secret.encode(), user.encode(), hashlib.sha256).hexdigest()[:24]
    return f"{user}.{mac}"


def verify(secret: str, token: str | None) -> str | None:
    if not token or "." not in token:
        return None
    user, _ = token.rsplit(".", 1)
    return user if hmac.compare_digest(sign(secret, user), token) else None


async def form_data(request: Request) -> dict[str, str]:
    """An urlencoded form body as {name: last value} (the sites post only urlencoded forms)."""
    body = (await request.body()).decode("utf-8", "replace")
    return {k: v[-1] for k, v in parse_qs(body, keep_blank_values=True).items()}


def int_arg(value: Any, default: int = 1, lo: int = 1, hi: int = 10_000) -> int:
    try:
        return max(lo, min(hi, int(value)))
    except (TypeError, ValueError):
        return default


class SiteKit:
    """What one site's routes need: its DBs, templates, login cookie and page helpers."""

    def __init__(self, site: str, dbs: EpisodeDBs, secret: str, session_cookie: str | None,
                 accounts: dict[str, str] | None = None, page_size: int = 10):
        self.site = site
        self.dbs = dbs
        self.secret = secret
        self.session_cookie = session_cookie
        self.accounts = accounts or {}
        self.page_size = page_size
        self.jinja = Environment(loader=FileSystemLoader(str(HERE / "templates")),
                                 autoescape=select_autoescape(["html"]))
        self.jinja.globals["site"] = site

    # -- state
    def db(self, request: Request) -> sqlite3.Connection:
        return self.dbs.connect(request.cookies.get(EPISODE_COOKIE, DEFAULT_EPISODE))

    def user(self, request: Request) -> str | None:
        return verify(self.secret, request.cookies.get(self.session_cookie)) if self.session_cookie else None

    # -- responses
    def render(self, request: Request, _template: str, status: int = 200, **ctx) -> HTMLResponse:
        ctx.setdefault("user", self.user(request))
        ctx.setdefault("path", request.url.path)
        html = self.jinja.get_template(f"{self.site}/{_template}").render(**ctx)
        return HTMLResponse(html, status_code=status)

    def redirect(self, url: str) -> RedirectResponse:
        return RedirectResponse(url, status_code=303)

    def paginate(self, con: sqlite3.Connection, sql: str, params: tuple, page: int) -> tuple[list, int]:
        """(rows of the page, number of pages) for a SELECT."""
        total = con.execute(f"SELECT COUNT(*) FROM ({sql})", params).fetchone()[0]
        pages = max(1, -(-total // self.page_size))
        page = min(page, pages)
        rows = con.execute(f"{sql} LIMIT ? OFFSET ?", params + (self.page_size, (page - 1) * self.page_size)).fetchall()
        return rows, pages


class SiteApp(NamedTuple):
    """How one embedded site is served: its routes, its login cookie (None: no login), its accounts
    ({username: password}) and the URL placeholder its tasks use."""

    routes: list[Route]
    session_cookie: str | None
    accounts: dict[str, str]
    placeholder: str


Handler = Callable[[Request], Awaitable[Response]]
HOME = "/"


def site_kit(request: Request) -> SiteKit:
    """The kit of the site that serves ``request`` (``build_app`` puts it on the app's state)."""
    return request.app.state.kit


def login_required(handler: Handler) -> Handler:
    """``handler`` behind the site's login: anonymous visitors are redirected to ``/login?next=<path>``."""

    @functools.wraps(handler)
    async def guarded(request: Request) -> Response:
        kit = site_kit(request)
        if kit.session_cookie and not kit.user(request):
            return kit.redirect(f"/login?next={request.url.path}")
        return await handler(request)

    return guarded


async def login(request: Request) -> Response:
    """The login form (GET) and its check (POST): a right password sets the signed session cookie."""
    kit = site_kit(request)
    if request.method == "GET":
        return kit.render(request, "login.html", error=None, next=request.query_params.get("next", HOME))
    form = await form_data(request)
    name, pw = form.get("username", "").strip(), form.get("password", "")
    if kit.accounts.get(name) != pw:
        return kit.render(request, "login.html", status=401, error="Invalid username or password.",
                          next=form.get("next", HOME))
    resp = kit.redirect(form.get("next") or HOME)
    resp.set_cookie(kit.session_cookie, sign(kit.secret, name), httponly=True, samesite="lax")
    return resp


async def logout(request: Request) -> Response:
    kit = site_kit(request)
    resp = kit.redirect(HOME)
    resp.delete_cookie(kit.session_cookie)
    return resp


async def stylesheet(request: Request) -> Response:
    """The site's CSS (``build_app`` reads it once into the app's state)."""
    return Response(request.app.state.css, media_type="text/css", headers={"Cache-Control": "max-age=3600"})


async def favicon(request: Request) -> Response:
    return Response(b"", media_type="image/x-icon")


def redirect_to(target: str) -> Handler:
    """A handler that redirects (303) to ``target``, whose ``{name}``s are filled from the path parameters."""

    async def go(request: Request) -> Response:
        return site_kit(request).redirect(target.format(**request.path_params))

    return go


STATIC_ROUTES = [Route("/static/style.css", stylesheet), Route("/favicon.ico", favicon)]
LOGIN_ROUTES = [Route("/login", login, methods=["GET", "POST"]), Route("/logout", logout, methods=["GET", "POST"])]

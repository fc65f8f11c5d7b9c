"""Shared machinery of the embedded sites: per-episode SQLite copies, cookie logins, templates.

Per-episode isolation rule: every request carries (or lacks) the cookie ``webrl_episode=<id>``.
The site serves it from ``<workdir>/<site>/<id>.sqlite``, copied from the seeded template the first
time that id is seen; without the cookie the id is ``default``. Two episodes therefore never see
each other's writes, and every episode starts from the seeded state. Copies are deleted by
``EpisodeDBs.drop(id)`` (the env calls it after scoring) or, as a safety net, when more than
``max_copies`` exist (least recently used first).

Login rule: a site with accounts keeps the signed user name in its own cookie
(``<site>_session=<user>.<hmac>``); cookies are per host, not per port, so each site has its own name.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import shutil
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any, Callable
from urllib.parse import parse_qs

from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse

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

    # -- login
    def login_routes(self, home: str = "/") -> list[tuple[str, Callable, list[str]]]:
        async def login(request: Request):
            if request.method == "GET":
                return self.render(request, "login.html", error=None, next=request.query_params.get("next", home))
            form = await form_data(request)
            name, pw = form.get("username", "").strip(), form.get("password", "")
            if self.accounts.get(name) != pw:
                return self.render(request, "login.html", status=401, error="Invalid username or password.",
                                   next=form.get("next", home))
            resp = self.redirect(form.get("next") or home)
            resp.set_cookie(self.session_cookie, sign(self.secret, name), httponly=True, samesite="lax")
            return resp

        async def logout(request: Request):
            resp = self.redirect(home)
            resp.delete_cookie(self.session_cookie)
            return resp

        return [("/login", login, ["GET", "POST"]), ("/logout", logout, ["GET", "POST"])]

    def require_login(self, request: Request):
        """A redirect to the login page when nobody is logged in, else None."""
        if self.session_cookie and not self.user(request):
            return self.redirect(f"/login?next={request.url.path}")
        return None

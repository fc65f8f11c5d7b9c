"""``EmbeddedSites``: the five embedded WebArena-style sites, served by uvicorn on 127.0.0.1, one port each.

Contract (the env's ``SiteHooks``):
  - ``url_map()``: {"__SHOPPING__": "http://127.0.0.1:<port>", ...} for the five placeholders;
  - ``allowed_hosts()``: the ``host:port`` netlocs the agent may visit;
  - ``prepare_context(context, task, episode_id)``: sets the isolation cookie ``webrl_episode=<episode_id>``
    (every site then serves that episode its own copy of the seeded database) and the signed login cookie of
    every site in ``task['sites']`` that has accounts (WebArena's ``require_login``);
  - ``end_episode(episode_id)``: deletes the episode's database copies (call after scoring);
  - ``eval_helpers()``: {} -- our program_html checks use JS locators, no Python helpers.
``workers="process"`` (the default) serves all five from one child process: the request handlers then do not
compete for the rollout process's GIL with Playwright's client, and a crash of either side spares the other;
``workers="thread"`` serves them from a background thread of this process. The parent binds the sockets
(so ports are known at once) and hands them to the child; ``stop()`` ends the child and closes the sockets.

Each site is the module ``webrl_core.sites.<site>``, whose ``APP`` (a ``common.SiteApp``) says how it is served;
``SITE_APPS`` collects them for exactly the sites of ``webrl_core.websites.SITES``, in that order.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.routing import Route

from webrl_core import websites
from webrl_core.env.webarena_login import WEBARENA_LOGINS
from webrl_core.sites.common import (EPISODE_COOKIE, HERE, LOGIN_ROUTES, STATIC_ROUTES, EpisodeDBs, SiteApp, SiteKit,
                                     login, login_required, redirect_to, sign)
from webrl_core.sites.data import write_template

SITE_APPS: dict[str, SiteApp] = {site: importlib.import_module(f"webrl_core.sites.{site}").APP
                                 for site in websites.SITES}
"""site -> how it is served; derived from ``websites.SITES`` (same sites, same order)."""


# where WebArena's logged-in check page (webrl_core.env.webarena_login) leads on the embedded site
WEBARENA_CHECK_TARGETS = {"gitlab": "/", "shopping": "/", "shopping_admin": "/", "reddit": "/user/{username}"}


def webarena_routes(site: str) -> list[Route]:
    """The site's WebArena login page (same form and check as ``/login``) and WebArena's logged-in check page
    (behind the login; it redirects to a page of the site), so that ``webrl webarena login`` works on the
    embedded sites as on the real ones. No links lead there: the agent's pages are unchanged."""
    recipe = WEBARENA_LOGINS.get(site)
    if recipe is None:
        return []
    routes = []
    if recipe.login_path not in ("", "/", "/login"):
        routes.append(Route(recipe.login_path, login, methods=["GET", "POST"]))
    routes.append(Route(recipe.check_path, login_required(redirect_to(WEBARENA_CHECK_TARGETS[site]))))
    return routes


def build_app(site: str, kit: SiteKit) -> Starlette:
    """The site's app: its stylesheet, its login pages when it has accounts (``/login`` and WebArena's), its own
    routes; handlers find the kit (and the CSS) on ``app.state``."""
    logins = [*LOGIN_ROUTES, *webarena_routes(site)] if kit.session_cookie else []
    app = Starlette(routes=[*STATIC_ROUTES, *logins, *SITE_APPS[site].routes])
    app.state.kit = kit
    app.state.css = (HERE / "static" / f"{site}.css").read_text()
    return app


class EmbeddedSites:
    """Start/stop the five sites; implements the env's SiteHooks protocol (see module docstring)."""

    # an environment keeps its tab between episodes: new cookies (episode database + logins), empty history
    reuse_context = True
    fresh_session_on_reuse = True

    def __init__(self, data_seed: int = 0, host: str = "127.0.0.1", workdir: str | Path | None = None,
                 sites: tuple[str, ...] = websites.SITES, workers: str = "process"):
        if workers not in ("process", "thread"):
            raise ValueError(f"EmbeddedSites workers={workers!r}; allowed: process, thread")
        if host not in ("127.0.0.1", "localhost", "::1"):
            raise ValueError(f"EmbeddedSites host {host!r} is not loopback; allowed: 127.0.0.1, localhost, ::1")
        unknown = sorted(set(sites) - set(SITE_APPS))
        if unknown:
            raise ValueError(f"unknown embedded site(s) {unknown}; allowed: {list(SITE_APPS)}")
        self.data_seed = data_seed
        self.workers = workers
        self._proc: subprocess.Popen | None = None
        self._socks: list[socket.socket] = []
        self.host = host
        self.site_names = tuple(sites)
        self._own_workdir = workdir is None
        self.workdir = Path(workdir) if workdir else None
        self.secret = secrets.token_hex(16)
        self.urls: dict[str, str] = {}
        self.kits: dict[str, SiteKit] = {}
        self._servers: list[uvicorn.Server] = []
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    # ------------------------------------------------------------------ lifecycle
    def start(self, timeout: float = 180.0) -> "EmbeddedSites":
        # 180 s: a child that imports Starlette and writes five templates while training holds both cores has taken
        # over 60 s; a child that exits is reported at once (``wait_ready``'s ``alive``), not after the timeout
        if self._thread is not None or self._proc is not None:
            return self
        if self.workdir is None:
            self.workdir = Path(tempfile.mkdtemp(prefix="webrl-sites-"))
        socks = []
        for site in self.site_names:
            write_template(site, self.data_seed, self.workdir / f"{site}.template.sqlite")
            self.kits[site] = _kit(site, self.workdir, self.secret)
            sock = socket.socket(socket.AF_INET6 if ":" in self.host else socket.AF_INET, socket.SOCK_STREAM)
            sock.bind((self.host, 0))
            sock.listen(128)
            sock.set_inheritable(True)
            socks.append(sock)
            port = sock.getsockname()[1]
            self.urls[site] = f"http://{'[::1]' if ':' in self.host else self.host}:{port}"
            if self.workers == "thread":
                self._servers.append(_server(build_app(site, self.kits[site])))
        if self.workers == "process":
            self._socks = socks
            return self._start_child(socks, timeout)
        ready = threading.Event()

        def run():
            self._loop = asyncio.new_event_loop()
            asyncio.set_event_loop(self._loop)

            async def main():
                tasks = [asyncio.create_task(s.serve(sockets=[k])) for s, k in zip(self._servers, socks)]
                while not all(s.started for s in self._servers):
                    if any(t.done() for t in tasks):
                        break
                    await asyncio.sleep(0.02)
                ready.set()
                await asyncio.gather(*tasks, return_exceptions=True)

            self._loop.run_until_complete(main())
            for k in socks:
                k.close()

        self._thread = threading.Thread(target=run, name="webrl-embedded-sites", daemon=True)
        self._thread.start()
        if not ready.wait(timeout) or not all(s.started for s in self._servers):
            self.stop()
            raise RuntimeError(f"embedded sites did not start within {timeout}s")
        return self

    def _start_child(self, socks: list[socket.socket], timeout: float) -> "EmbeddedSites":
        spec = {"sites": list(self.site_names), "workdir": str(self.workdir), "fds": [k.fileno() for k in socks]}
        env = dict(os.environ, WEBRL_SITES_SECRET=self.secret)
        # -c rather than -m: the package __init__ already imports this module (runpy would warn)
        child = "import json, sys; from webrl_core.sites.server import _serve_child; _serve_child(json.loads(sys.argv[1]))"
        log = self.workdir / "sites-child.log"
        with open(log, "ab") as out:
            self._proc = subprocess.Popen([sys.executable, "-c", child, json.dumps(spec)], pass_fds=spec["fds"],
                                          env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
        try:
            self.wait_ready(timeout, alive=lambda: self._proc is not None and self._proc.poll() is None)
        except Exception as e:
            code = self._proc.poll()
            tail = log.read_text(errors="replace")[-2000:]
            self.stop()
            raise RuntimeError(f"embedded sites child did not serve within {timeout}s (exit code {code}): {e}\n"
                               f"{log}:\n{tail}") from e
        return self

    def stop(self) -> None:
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._proc = None
        for k in self._socks:
            k.close()
        self._socks = []
        for s in self._servers:
            s.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=15)
        self._thread = None
        self._servers = []
        if self._own_workdir and self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None

    def __enter__(self) -> "EmbeddedSites":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # ------------------------------------------------------------------ SiteHooks
    def url_map(self) -> dict[str, str]:
        return {SITE_APPS[s].placeholder: u for s, u in self.urls.items()}

    def allowed_hosts(self) -> list[str]:
        return [u.split("://", 1)[1] for u in self.urls.values()]

    def login_cookies(self, sites: list[str], episode_id: str) -> list[dict[str, Any]]:
        """The cookies ``prepare_context`` adds: the isolation cookie plus one signed session per logged-in site."""
        any_url = next(iter(self.urls.values()))
        cookies = [{"name": EPISODE_COOKIE, "value": episode_id, "url": any_url}]
        for site in sites:
            if site in self.kits and self.kits[site].session_cookie:
                user = next(iter(SITE_APPS[site].accounts))
                cookies.append({"name": self.kits[site].session_cookie, "value": sign(self.secret, user),
                                "url": self.urls[site]})
        return cookies

    async def prepare_context(self, context: Any, task: dict, episode_id: str) -> None:
        sites = list(task.get("sites") or [])
        if not task.get("require_login", True):
            sites = []
        await context.add_cookies(self.login_cookies(sites, episode_id))

    def end_episode(self, episode_id: str) -> None:
        for kit in self.kits.values():
            kit.dbs.drop(episode_id)

    def eval_helpers(self) -> dict[str, Any]:
        return {}

    def wait_ready(self, timeout: float = 10.0, alive: Callable[[], bool] = lambda: True) -> None:
        """Block until every site answers HTTP (used by tests and the CLI); stop early once ``alive()`` is false."""
        deadline = time.monotonic() + timeout
        for url in self.urls.values():
            while True:
                try:
                    httpx.get(url + "/static/style.css", timeout=2)
                    break
                except httpx.HTTPError:
                    if time.monotonic() > deadline or not alive():
                        raise
                    time.sleep(0.05)


def _kit(site: str, workdir: Path, secret: str) -> SiteKit:
    """The site's kit over the template the parent wrote into ``workdir`` (shared by parent and child)."""
    app = SITE_APPS[site]
    return SiteKit(site, EpisodeDBs(workdir / f"{site}.template.sqlite", workdir / site), secret, app.session_cookie,
                   app.accounts)


def _server(app: Starlette) -> uvicorn.Server:
    return uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off",
                                         timeout_keep_alive=30))


def _serve_child(spec: dict) -> None:
    """Child process of ``workers="process"``: serve the sites on the inherited sockets until told to stop
    (SIGTERM) or until the parent dies."""
    secret = os.environ["WEBRL_SITES_SECRET"]
    workdir = Path(spec["workdir"])
    servers, socks = [], []
    for site, fd in zip(spec["sites"], spec["fds"]):
        servers.append(_server(build_app(site, _kit(site, workdir, secret))))
        socks.append(socket.socket(fileno=fd))
    parent = os.getppid()

    async def main():
        loop = asyncio.get_running_loop()
        stop = lambda: [setattr(s, "should_exit", True) for s in servers]  # noqa: E731
        # _serve: serve() minus its per-server signal capture, which five servers in one loop would fight over
        tasks = [asyncio.create_task(s._serve(sockets=[k])) for s, k in zip(servers, socks)]
        loop.add_signal_handler(signal.SIGTERM, stop)
        loop.add_signal_handler(signal.SIGINT, stop)
        while not all(t.done() for t in tasks):
            if os.getppid() != parent:  # the rollout process died (kill -9): do not linger
                stop()
            await asyncio.sleep(0.5)
        for t in tasks:  # a server that failed to start must not end the child silently with exit code 0
            t.result()

    asyncio.run(main())


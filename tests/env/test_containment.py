"""Containment on real Chromium: nothing a page does reaches a host outside the task's allowed hosts, and a
page that fails to load is an observation, never an exception out of ``step``.

The evidence is a counting server on a 127.0.0.1 port outside the allow-list that counts every TCP connection
it accepts and every UDP datagram it receives (``out``). ``fixtures/containment/hostile.html``, served from an
allowed host, fires every escape channel we know of at it, and the same channels at a second counting server
whose port IS allowed (``ok``): that positive control shows each attempt really goes out when the host is
allowed, so a zero on ``out`` means blocked, not broken. How the env blocks, and what got out before it did:
``webrl_core/env/browser.py``'s docstring.

The hostile page runs on both of Debian's Chromium builds. Channels it fires that Chromium 156 did not send even
to the allowed host, so the control cannot vouch for them (they are still counted on ``out``): ``<link
rel=preconnect|dns-prefetch|prerender|manifest>``, ``attributionsrc`` and ``PaymentRequest`` (no payment
service); in the headless shell also ``<link rel=icon>``, in full Chromium speculation rules, and WebRTC,
which a contained context of full Chromium does not have at all.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import re
import socket
import threading
import time
from pathlib import Path
from urllib.parse import urlencode

import pytest

from conftest import small_cfg
from webrl_core.env.browser import FULL_CHROMIUM, BrowserPool, NoHooks, proxy_bypass_list
from webrl_core.env.observation import find_element
from webrl_core.env.web_env import EnvCrash, WebEnv

WS_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"  # RFC 6455's handshake constant

# Request paths hostile.html's channels produced on the allowed counting server (Chromium 156 headless shell).
REACHES_ALLOWED = {
    # fetch-like APIs; /r/redirect is the allowed host's 302 towards the outside host
    "/c/fetch", "/c/fetch-keepalive", "/c/xhr", "/c/beacon", "/c/eventsource", "/c/fetchlater", "/r/redirect",
    # subresources from markup and CSS
    "/c/img.png", "/c/img-srcset.png", "/c/svg-image.svg", "/c/input-image.png", "/c/script.js", "/c/import.mjs",
    "/c/stylesheet.css", "/c/css-import.css", "/c/css-url.png", "/c/font.woff", "/c/object.html", "/c/embed.html",
    "/c/video.mp4", "/c/poster.png", "/c/audio.mp3", "/c/track.vtt", "/c/link-prefetch", "/c/link-preload",
    "/c/link-modulepreload.mjs", "/c/speculationrules-prefetch", "/c/speculationrules-prerender",
    "/c/paint-worklet.js", "/c/audio-worklet.js",
    # WebSockets from every realm
    "/c/ws", "/c/ws-stream", "/c/ws-blank-iframe-blank", "/c/ws-srcdoc-iframe", "/c/ws-data-iframe",
    "/c/ws-blob-worker", "/c/ws-blob-worker-fetch", "/c/ws-popup-blank",
    # dedicated, shared and service workers
    "/c/worker-fetch", "/c/worker-xhr", "/c/worker-eventsource", "/c/worker-ws", "/c/worker-ws-stream",
    "/c/worker-import.js", "/c/shared-worker-fetch", "/c/shared-worker-xhr", "/c/shared-worker-eventsource",
    "/c/shared-worker-ws", "/c/shared-worker-ws-stream", "/c/shared-worker-import.js",
    "/c/sw-install-fetch", "/c/sw-install-ws", "/c/sw-activate-fetch", "/c/sw-activate-ws",
    # navigations in frames and new windows
    "/c/iframe.html", "/c/frame-location", "/c/frame-meta-refresh", "/c/form-post", "/c/window-open-popup",
    "/c/target-blank-tab", "/c/download.zip", "/c/ping",
}


class CountingServer:
    """Counts every TCP connection accepted and every UDP datagram received on one 127.0.0.1 port.

    ``paths`` gets each connection's request target, ``<not http>`` for a connection that spoke something else
    (WebRTC's TURN) and ``<no request>`` for one that sent nothing (a preconnect). HTTP gets a 200 with CORS
    open (``/r/<x>`` a 302 to ``redirect_to`` + ``/c/<x>``) and a WebSocket handshake a real 101, so that on an
    allowed port every channel succeeds."""

    def __init__(self, redirect_to: str | None = None) -> None:
        self.redirect_to = redirect_to
        self.accepts = 0
        self.datagrams = 0
        self.paths: list[str] = []
        self._lock = threading.Lock()
        self._conns: list[socket.socket] = []
        for _ in range(50):  # the UDP socket needs the TCP socket's port number, which may be taken for UDP
            self.tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            self.tcp.bind(("127.0.0.1", 0))
            self.port = self.tcp.getsockname()[1]
            self.udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            try:
                self.udp.bind(("127.0.0.1", self.port))
                break
            except OSError:
                self.tcp.close()
                self.udp.close()
        else:
            raise RuntimeError("no port free for both TCP and UDP")
        self.tcp.listen(256)
        threading.Thread(target=self._accept_loop, daemon=True).start()
        threading.Thread(target=self._udp_loop, daemon=True).start()

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _note(self, path: str) -> None:
        with self._lock:
            self.paths.append(path)

    def _accept_loop(self) -> None:
        while True:
            try:
                conn, _ = self.tcp.accept()
            except OSError:  # closed
                return
            with self._lock:
                self.accepts += 1
                self._conns.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _udp_loop(self) -> None:
        while True:
            try:
                self.udp.recvfrom(65536)
            except OSError:
                return
            with self._lock:
                self.datagrams += 1

    def _serve(self, conn: socket.socket) -> None:
        conn.settimeout(3)
        data = b""
        try:
            while b"\r\n\r\n" not in data and len(data) < 65536:
                chunk = conn.recv(4096)
                if not chunk:
                    break
                data += chunk
                if not re.match(rb"[A-Z]+ ", data[:8]):
                    break
            if not data:
                self._note("<no request>")
                return
            lines = data.split(b"\r\n\r\n")[0].decode("latin-1").split("\r\n")
            parts = lines[0].split(" ")
            if len(parts) != 3 or not parts[2].startswith("HTTP/"):
                self._note("<not http>")
                return
            path = parts[1]
            self._note(path)
            headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
            if headers.get("upgrade", "").lower() == "websocket":
                accept = base64.b64encode(hashlib.sha1((headers.get("sec-websocket-key", "") + WS_GUID)
                                                       .encode()).digest()).decode()
                conn.sendall(("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                              f"Sec-WebSocket-Accept: {accept}\r\n\r\n").encode())
                time.sleep(1)
                return
            if path.startswith("/r/") and self.redirect_to:
                conn.sendall((f"HTTP/1.1 302 Found\r\nLocation: {self.redirect_to}/c/{path[3:]}\r\n"
                              "Access-Control-Allow-Origin: *\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                             .encode())
                return
            ext = path.rsplit(".", 1)[-1]
            ctype = {"js": "text/javascript", "mjs": "text/javascript", "css": "text/css", "html": "text/html",
                     "json": "application/json"}.get(ext, "text/plain")
            body = b"<p>counted</p>" if ctype == "text/html" else b""
            if "eventsource" in path:
                ctype, body = "text/event-stream", b"data: hi\n\n"
            conn.sendall((f"HTTP/1.1 200 OK\r\nContent-Type: {ctype}\r\nAccess-Control-Allow-Origin: *\r\n"
                          f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode() + body)
        except OSError:  # a timeout included: a connection that never completed a request
            if not data:
                self._note("<no request>")
        finally:
            conn.close()

    def report(self) -> str:
        return f"{self.accepts} TCP accepts, {self.datagrams} UDP datagrams, requests {sorted(self.paths)}"

    def close(self) -> None:
        for s in [self.tcp, self.udp, *self._conns]:
            try:
                s.close()
            except OSError:
                pass


@pytest.fixture
def servers():
    """(out, ok): counting servers; only ``ok`` is allowed, and its ``/r/<x>`` redirects to ``out``."""
    out = CountingServer()
    ok = CountingServer(redirect_to=f"http://{out.host}")
    yield out, ok
    ok.close()
    out.close()


@pytest.fixture
def closed_port():
    """A 127.0.0.1 port that refuses connections: bound (so no one else gets it) but not listening."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    yield s.getsockname()[1]
    s.close()


@pytest.fixture
def run_env(pages_url, aloop, shared_pool):
    """run_env(fn, allowed, pool) runs ``await fn(env)`` with a fresh WebEnv (on the shared browser unless ``pool``
    is given) allowing the fixture host + ``allowed``."""
    def runner(fn, allowed=(), pool=None, **cfg_kw):
        async def go():
            env = WebEnv(pool or shared_pool, small_cfg(**cfg_kw),
                         NoHooks(allowed=[pages_url.split("//")[1], *allowed]))
            try:
                return await fn(env)
            finally:
                await env.close()
        return aloop.run(go())
    return runner


def task(url: str) -> dict:
    return {"task_id": "containment", "intent": "fixture", "start_url": url, "sites": ["fixture"]}


def links_url(pages_url: str, **links: str) -> str:
    return f"{pages_url}/containment/links.html?" + urlencode({k.replace("_", " "): v for k, v in links.items()})


@pytest.fixture(params=["headless-shell", "full-chromium"])
def chromium(request, aloop, shared_pool):
    """The pool to run on: the shared one (env.chromium_path auto: Debian's headless shell) or full Chromium,
    which handles WebRTC's policy switch differently (browser.py's NO_WEBRTC_JS)."""
    if request.param == "headless-shell":
        yield request.param, None
        return
    if not Path(FULL_CHROMIUM).exists():
        pytest.skip(f"{FULL_CHROMIUM} is not installed")
    pool = BrowserPool(small_cfg(chromium_path=FULL_CHROMIUM))
    aloop.run(pool.start())
    yield request.param, pool
    aloop.run(pool.close())


def test_hostile_page_reaches_no_outside_host(pages_url, servers, run_env, chromium):
    out, ok = servers
    kind, pool = chromium
    expected = set(REACHES_ALLOWED)
    if kind == "full-chromium":  # it ran no speculation rules, even towards the allowed host (measured)
        expected -= {"/c/speculationrules-prefetch", "/c/speculationrules-prerender"}

    async def fn(env):
        await env.reset(task(f"{pages_url}/containment/hostile.html?out={out.host}&ok={ok.host}"), "c0")
        page = env.page
        await page.wait_for_function("window.__done", timeout=30000)
        log = await page.evaluate("window.__log")
        # Chromium sends at most 6 requests per host at a time, so on a loaded machine the last of ~70 can come
        # seconds later: wait for the control to see them all (or 20 s), then a little for any to the outside
        deadline = time.monotonic() + 20
        while expected - set(ok.paths) and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        await asyncio.sleep(1.0)
        # the env takes in the tabs the page opened (some on error pages) and what was blocked: no exception
        await env.step('do(action="Wait")')
        return log, env.blocked_urls

    log, blocked = run_env(fn, allowed=[ok.host], pool=pool)
    assert out.accepts == 0 and out.datagrams == 0, f"reached the outside host: {out.report()}"
    # the positive control: the same attempts at the allowed port arrived
    missing = sorted(expected - set(ok.paths))
    assert not missing, f"channels that did not fire (the test would prove nothing): {missing}; log {log}"
    if kind == "headless-shell":
        assert ok.paths.count("<not http>") >= 2  # WebRTC's TURN/TCP to the allowed port, from page and iframe
    else:  # no WebRTC in a contained context of full Chromium, in any document
        assert {"webrtc threw", "webrtc-blank-iframe threw"} <= {x.split(":")[0] for x in log}, log
    assert ok.datagrams > 0  # WebTransport's QUIC to the allowed port: the UDP counter works
    # the env recorded what Playwright's route did not see and the BlackholeProxy stopped: the WebSockets'
    # tunnels (host:port) and a shared worker's fetch
    assert out.host in blocked
    assert f"http://{out.host}/c/shared-worker-fetch" in blocked


def test_top_level_navigations_to_outside_hosts(pages_url, servers, run_env):
    """Navigations of the agent's tab out of the allow-list: stopped, named in the observation, and the agent is
    back where it was; none reaches the outside host."""
    out, ok = servers
    start = links_url(pages_url, redirect=f"http://{ok.host}/r/nav", outside=f"http://{out.host}/c/link",
                      new_tab_outside=f"http://{out.host}/c/tab")

    async def fn(env):
        results = {}
        # each navigation from a fresh start page: one case's slow return (a loaded CI box) cannot hide the links
        # of the next
        for i, name in enumerate(["redirect", "outside", "new tab outside"]):
            obs = await env.reset(task(start), f"c1-{i}")
            link = find_element(obs.html, name)
            assert link is not None, f"no link {name!r} on the start page: url {obs.url}, error {obs.error}, " \
                                     f"html {obs.html[:300]!r}"
            obs, done, info = await env.step(f'do(action="Click", element="{link.id}")')
            errors, blocked = [obs.error], info["blocked"]
            for _ in range(3):  # a new tab can come after the step that opened it: the next step handles it
                if blocked:
                    break
                obs, done, info = await env.step('do(action="Wait")')
                errors, blocked = errors + [obs.error], info["blocked"]
            results[name] = (obs.url, "; ".join(filter(None, errors)), blocked, len(env.context.pages))
        # a page that sends itself away by script (location.replace: no history entry to go back to)
        jump = f"{pages_url}/containment/redirect_later.html?replace=1&ms=200&to=http://{out.host}/c/js"
        await env.reset(task(jump), "c2")
        for _ in range(5):
            obs, done, info = await env.step('do(action="Wait")')
            if info["blocked"]:
                break
        results["js"] = (obs.url, obs.error, info["blocked"], len(env.context.pages))
        return results

    r = run_env(fn, allowed=[ok.host])
    assert out.accepts == 0, out.report()
    # an allowed host's 302 to an outside host: Playwright's route never sees the second URL, the proxy stops it
    url, error, blocked, _ = r["redirect"]
    assert blocked == [f"http://{out.host}/c/nav"] and url == start
    assert error == f"navigation to http://{out.host}/c/nav was blocked (outside the task's websites)"
    assert "/r/nav" in ok.paths
    assert r["outside"][2] == [f"http://{out.host}/c/link"] and r["outside"][0] == start
    # the tab a target=_blank link opened only to be blocked is closed; the agent is back on its page
    url, error, blocked, n_pages = r["new tab outside"]
    assert blocked == [f"http://{out.host}/c/tab"] and url == start and n_pages == 1, (error, n_pages)
    url, error, blocked, _ = r["js"]
    assert blocked == [f"http://{out.host}/c/js"] and "was blocked" in error


def test_error_page_is_an_observation(pages_url, closed_port, run_env):
    """A tab on Chromium's error page (an allowed host that refuses connections) is observed with the error; no
    step raises, Go backward leaves it."""
    dead = f"http://127.0.0.1:{closed_port}/x"
    start = links_url(pages_url, dead_link=dead)

    async def fn(env):
        obs = await env.reset(task(start), "c3")
        steps = [await env.step(f'do(action="Click", element="{find_element(obs.html, "dead link").id}")')]
        steps.append(await env.step('do(action="Scroll Down")'))  # acting on the error page
        steps.append(await env.step('do(action="Go backward")'))
        # the start page itself leaves for the dead port right after loading
        await env.reset(task(f"{pages_url}/containment/redirect_later.html?ms=0&to={dead}"), "c4")
        steps.append(await env.step('do(action="Wait")'))
        # a start URL that does not load at all fails reset: the episode never started
        with pytest.raises(Exception, match="ERR_CONNECTION_REFUSED"):
            await env.reset(task(dead), "c5")
        return steps

    steps = run_env(fn, allowed=[f"127.0.0.1:{closed_port}"])
    expected = f"error page: net::ERR_CONNECTION_REFUSED for {dead}"
    for obs, done, info in [steps[0], steps[1], steps[3]]:
        assert obs.url.startswith("chrome-error://") and not done
        assert obs.html.startswith(f"[error] {expected}") and info["error"] == obs.error
        assert expected in obs.error and info["blocked"] == []  # an allowed host that is down is not "blocked"
    obs, done, info = steps[2]
    assert obs.url == start and info["error"] is None and not obs.html.startswith("[error]")


def test_crash_still_raises(pages_url, run_env):
    """The error-page handling must not swallow a crash: the rollout engine restarts the browser on EnvCrash."""
    async def fn(env):
        await env.reset(task(f"{pages_url}/page2.html"), "c6")
        cdp = await env.context.new_cdp_session(env.page)
        async with env.page.expect_event("crash", timeout=15000):
            # no reply ever comes: the renderer that would send it is gone
            crash = asyncio.ensure_future(cdp.send("Page.crash"))
        crash.cancel()
        with pytest.raises(EnvCrash):
            await env.step('do(action="Wait")')
    run_env(fn)


def test_proxy_bypass_list():
    assert proxy_bypass_list(["LOCALHOST:7770", "127.0.0.1:80", "::1:8080"]) == \
        "<-loopback>,127.0.0.1:80,[::1]:8080,localhost:7770"

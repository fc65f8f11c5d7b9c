"""Shared helpers for the environment tests: a 127.0.0.1 server for the HTML fixtures and small configs."""

from __future__ import annotations

import functools
import http.server
import threading
from pathlib import Path

import pytest

from webrl_core.config import EnvConfig

PAGES = Path(__file__).parent / "fixtures"


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="session")
def pages_url():
    """Base URL of tests/env/fixtures served over http on 127.0.0.1."""
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(PAGES)))
    srv.daemon_threads = True
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


@pytest.fixture(scope="session")
def miniwob_server():
    from webrl_core.env.miniwob import MiniWoBServer
    srv = MiniWoBServer().start()
    yield srv
    srv.stop()


def small_cfg(**kw) -> EnvConfig:
    """A config with short timeouts so failing actions do not stall the tests."""
    base = dict(n_envs=2, contexts_per_browser=4, action_timeout_ms=1500, settle_timeout_ms=1500,
                viewport_width=1000, viewport_height=700)
    base.update(kw)
    return EnvConfig(**base)


class LoopThread:
    """One event loop for the whole session (in a thread), so tests share a Playwright driver and browser."""

    def __init__(self) -> None:
        import asyncio
        self._asyncio = asyncio
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True, name="test-loop")
        self.thread.start()

    def run(self, coro, timeout: float = 180):
        return self._asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)


@pytest.fixture(scope="session")
def aloop():
    lt = LoopThread()
    yield lt
    lt.stop()


@pytest.fixture(scope="session")
def shared_pool(aloop):
    """A BrowserPool (one Chromium) shared by the tests; each test opens its own contexts."""
    from webrl_core.env.browser import BrowserPool
    pool = BrowserPool(small_cfg())
    aloop.run(pool.start())
    yield pool
    aloop.run(pool.close())

"""Site start-up/shutdown, pages, logins and per-episode isolation with real Chromium."""

from __future__ import annotations

import asyncio
import socket
import sys
import time

import httpx
import pytest

from webrl_core.config_loader import load_config
from webrl_core.env.browser import CHROMIUM_ARGS, BrowserPool, chromium_executable
from webrl_core.env.web_env import WebEnv
from webrl_core.sites.server import EmbeddedSites

PAGES = {
    "shopping": ["/", "/search?q=kettle", "/category/toys", "/product/5", "/cart", "/orders"],
    "shopping_admin": ["/", "/products?q=luma", "/product/3/edit", "/orders", "/customers", "/reports?month=2023-03"],
    "reddit": ["/", "/forums", "/f/books", "/submit", "/search?q=tips"],
    "gitlab": ["/", "/explore?q=api", "/byteblaze/api-gateway", "/byteblaze/api-gateway/-/issues",
               "/byteblaze/api-gateway/-/project_members", "/byteblaze/api-gateway/-/blob/main/README.md"],
    "map": ["/", "/search?q=cafe", "/place/3", "/directions?from=Maple&to=Cedar&mode=foot"],
}


def test_start_pages_and_shutdown_frees_ports():
    s = EmbeddedSites(data_seed=0).start()
    ports = [int(u.rsplit(":", 1)[1]) for u in s.urls.values()]
    assert len(set(ports)) == 5 and all(u.startswith("http://127.0.0.1:") for u in s.urls.values())
    assert set(s.url_map()) == {"__SHOPPING__", "__SHOPPING_ADMIN__", "__REDDIT__", "__GITLAB__", "__MAP__"}
    for site, paths in PAGES.items():
        cookies = {c["name"]: c["value"] for c in s.login_cookies([site], "t-pages")}
        with httpx.Client(base_url=s.urls[site], cookies=cookies) as c:
            for p in paths:
                r = c.get(p)
                assert r.status_code == 200, (site, p, r.status_code)
        if site != "map":  # anonymous: login page (forum pages are public, its writes are not)
            r = httpx.get(s.urls[site] + ("/submit" if site == "reddit" else "/"))
            assert r.status_code == 303 and "/login" in r.headers["location"]
    workdir = s.workdir
    s.stop()
    assert not workdir.exists()
    for port in ports:  # the port is free again: we can bind it
        with socket.socket() as k:
            k.bind(("127.0.0.1", port))


@pytest.mark.parametrize("workers", ["process", "thread"])
def test_both_worker_modes_serve_and_stop(workers):
    s = EmbeddedSites(data_seed=0, workers=workers, sites=("shopping", "map")).start()
    child = s._proc
    assert (child is not None) == (workers == "process")
    assert httpx.get(s.urls["map"] + "/search?q=cafe").status_code == 200
    s.end_episode("nobody")  # dropping an episode that never existed is fine
    s.stop()
    if child is not None:
        assert child.poll() is not None  # the child process is gone
    with pytest.raises(ValueError, match="workers"):
        EmbeddedSites(workers="fork")


def test_a_child_that_dies_is_reported_at_once_with_its_exit_code(monkeypatch):
    """The child's start limit is long (training may hold both cores), so a child that exits must not wait it out."""
    monkeypatch.setattr(sys, "executable", "/bin/false")
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match=r"exit code 1"):
        EmbeddedSites(data_seed=0, workers="process", sites=("map",)).start()
    assert time.monotonic() - t0 < 30


def test_login_form_and_bad_password(sites):
    with httpx.Client(base_url=sites.urls["gitlab"]) as c:
        bad = c.post("/login", data={"username": "byteblaze", "password": "nope"})
        assert bad.status_code == 401 and "Invalid" in bad.text
        ok = c.post("/login", data={"username": "byteblaze", "password": "hello1234", "next": "/"})
        assert ok.status_code == 303
        assert "Your projects" in c.get("/").text


def test_non_loopback_host_is_refused():
    with pytest.raises(ValueError, match="loopback"):
        EmbeddedSites(host="0.0.0.0")


async def _edit_price(sites, browser, episode: str, price: str) -> str:
    ctx = await browser.new_context()
    await sites.prepare_context(ctx, {"sites": ["shopping_admin"], "require_login": True}, episode)
    page = await ctx.new_page()
    await page.goto(sites.urls["shopping_admin"] + "/product/7/edit")
    await page.fill("#price", price)
    await page.click("button[type=submit]")
    await page.wait_for_url("**saved=1")
    await asyncio.sleep(0.2)  # let the other episode write too before we read back
    await page.goto(sites.urls["shopping_admin"] + "/product/7/edit")
    value = await page.input_value("#price")
    await ctx.close()
    return value


def test_concurrent_episodes_are_isolated(sites):
    from playwright.async_api import async_playwright

    cfg = load_config().env

    async def main():
        async with async_playwright() as pw:
            browser = await pw.chromium.launch(executable_path=chromium_executable(cfg), args=CHROMIUM_ARGS)
            a, b = await asyncio.gather(_edit_price(sites, browser, "iso-a", "10.49"),
                                        _edit_price(sites, browser, "iso-b", "99.49"))
            fresh = await browser.new_context()
            await sites.prepare_context(fresh, {"sites": ["shopping_admin"]}, "iso-c")
            page = await fresh.new_page()
            await page.goto(sites.urls["shopping_admin"] + "/product/7/edit")
            seeded = await page.input_value("#price")
            await browser.close()
            return a, b, seeded

    a, b, seeded = asyncio.run(main())
    assert (a, b) == ("10.49", "99.49")
    assert seeded not in (a, b)
    sites.end_episode("iso-a")
    assert not sites.kits["shopping_admin"].dbs.path("iso-a").exists()
    assert sites.kits["shopping_admin"].dbs.path("iso-b").exists()


def test_a_reused_tab_starts_each_episode_fresh(sites):
    """WebEnv keeps its tab between embedded episodes: new cookies, fresh database copy, empty history."""
    cfg = load_config().env
    task = {"task_id": "reuse", "sites": ["shopping_admin"], "require_login": True, "intent": "edit a price",
            "start_url": "__SHOPPING_ADMIN__/product/7/edit"}

    async def main():
        async with BrowserPool(cfg) as pool:
            env = WebEnv(pool, cfg, sites)
            await env.reset(task, "reuse-a")
            first_page = env.page
            seeded = await env.page.input_value("#price")
            await env.page.fill("#price", "12.34")
            await env.page.click("button[type=submit]")
            await env.page.wait_for_url("**saved=1")
            await env.reset(task, "reuse-b")
            same_tab = env.page is first_page
            fresh = await env.page.input_value("#price")
            _, _, info = await env.step('do(action="Go backward")')
            cookies = {c["name"]: c["value"] for c in await env.context.cookies()}
            await env.close()
            return seeded, fresh, same_tab, info, cookies

    seeded, fresh, same_tab, info, cookies = asyncio.run(main())
    assert same_tab and fresh == seeded != "12.34"  # episode b sees the seeded database, not a's edit
    assert "no previous page" in (info.get("error") or "")  # a's pages are not in b's history
    assert cookies.get("webrl_episode") == "reuse-b"

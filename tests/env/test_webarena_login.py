"""`webrl webarena login` against the embedded sites served as WebArena (their WebArena login paths, WebArena's
accounts), the saved states in WebEnv episodes (per-site and combined), failing logins, and the reset hook of
tasks with ``require_reset``. Real Chromium, real sites, no mocks."""

from __future__ import annotations

import json
import logging
import os
import stat
import time

import pytest
from typer.testing import CliRunner

from webrl_core.config import EnvConfig
from webrl_core.env import webarena_login as wl
from webrl_core.env.browser import WebArenaHooks
from webrl_core.env.web_env import WebEnv
from webrl_core.sites.server import EmbeddedSites

LOGIN_SITES = ["gitlab", "reddit", "shopping", "shopping_admin"]


def small_cfg(**kw) -> EnvConfig:
    """tests/env/conftest.py's short timeouts (not imported: `conftest` is ambiguous next to tests/sites)."""
    return EnvConfig(**{**dict(n_envs=2, contexts_per_browser=4, action_timeout_ms=1500, settle_timeout_ms=1500,
                                viewport_width=1000, viewport_height=700), **kw})


@pytest.fixture(scope="module")
def sites():
    s = EmbeddedSites(data_seed=0).start()  # as `webrl sites serve` runs them
    yield s
    s.stop()


def wa_env(sites) -> dict[str, str]:
    """The environment a user sets to serve the embedded sites as WebArena."""
    return {**{site.upper(): url for site, url in sites.urls.items()}, "COLUMNS": "200"}


@pytest.fixture(scope="module")
def auth(sites, tmp_path_factory):
    """`webrl webarena login` once for the module: (auth dir, CLI output)."""
    from webrl_cli.main import app

    folder = tmp_path_factory.mktemp("auth")
    res = CliRunner().invoke(app, ["webarena", "login", "--auth-dir", str(folder), "--set", "sites.mode=webarena"],
                             env=wa_env(sites))
    assert res.exit_code == 0, res.output + repr(res.exception)
    return folder, res.output


def test_recipes_hold_webarenas_accounts_and_env_vars_override_them():
    # browser_env/env_config.py ACCOUNTS of web-arena-x/webarena
    assert {s: (r.default_username, r.default_password) for s, r in wl.WEBARENA_LOGINS.items()} == {
        "reddit": ("MarvelsGrantMan136", "test1234"), "gitlab": ("byteblaze", "hello1234"),
        "shopping": ("emma.lopez@gmail.com", "Password.123"), "shopping_admin": ("admin", "admin1234")}
    env = {"WEBARENA_GITLAB_USERNAME": "root", "WEBARENA_GITLAB_PASSWORD": "s3cret"}
    assert wl.account_for("gitlab", env) == ("root", "s3cret")
    assert wl.account_for("reddit", env) == ("MarvelsGrantMan136", "test1234")
    with pytest.raises(ValueError, match="no login for site 'map' \\(it has no login\\)"):
        wl.recipe_for("map")
    assert wl.sites_of_state_file("./.auth/gitlab.reddit_state.json") == ["gitlab", "reddit"]
    assert wl.sites_of_state_file("shopping_admin_state.json") == ["shopping_admin"]
    assert wl.sites_of_state_file("map_state.json") is None
    assert wl.state_file_name(["reddit", "gitlab"]) == "gitlab.reddit_state.json"


def test_login_writes_a_state_per_site_and_every_pair(auth, sites):
    folder, output = auth
    names = sorted(p.name for p in folder.iterdir())
    assert names == sorted([f"{s}_state.json" for s in LOGIN_SITES] +
                           [wl.state_file_name(p) for p in [("gitlab", "reddit"), ("gitlab", "shopping"),
                                                            ("gitlab", "shopping_admin"), ("reddit", "shopping"),
                                                            ("reddit", "shopping_admin"),
                                                            ("shopping", "shopping_admin")]])  # no temp files left
    for s in LOGIN_SITES:
        assert s in output
        state = json.loads((folder / f"{s}_state.json").read_text())
        assert [c["name"] for c in state["cookies"]] == [sites.kits[s].session_cookie]
        assert stat.S_IMODE((folder / f"{s}_state.json").stat().st_mode) == 0o600
    shop = json.loads((folder / "shopping_state.json").read_text())["cookies"][0]["value"]
    assert shop.strip('"').startswith("emma.lopez@gmail.com.")  # WebArena's account, accepted by the embedded shop
    both = json.loads((folder / "gitlab.reddit_state.json").read_text())
    assert sorted(c["name"] for c in both["cookies"]) == ["forum_session", "gitlab_session"]
    assert "emma.lopez@gmail.com" in output and "gitlab.reddit_state.json" in output


def test_saved_states_are_logged_in_and_anonymous_contexts_are_not(auth, sites, aloop, shared_pool):
    folder, _ = auth

    async def go():
        browser = await shared_pool.browser_for(0)
        out = {}
        for s in LOGIN_SITES:
            r = wl.recipe_for(s)
            for label, state in (("saved", str(folder / f"{s}_state.json")), ("anonymous", None)):
                ctx = await browser.new_context(storage_state=state)
                try:
                    out[s, label] = await wl.logged_in_problem(ctx, r, sites.urls[s], r.default_username)
                finally:
                    await ctx.close()
        return out

    out = aloop.run(go())
    for s in LOGIN_SITES:
        assert out[s, "saved"] is None, out[s, "saved"]
        assert "led to a login page" in out[s, "anonymous"]


def test_webenv_episodes_start_logged_in_from_the_states(auth, sites, aloop, shared_pool):
    """A WebArena-Lite task config (storage_state ./.auth/...) through WebArenaHooks over the embedded sites:
    login-required pages open as the logged-in user, in one site and in a multi-site task (combined state)."""
    folder, _ = auth
    hooks = WebArenaHooks(sites.urls, auth_dir=folder)
    tasks = [
        {"task_id": 1, "sites": ["shopping"], "require_login": True, "storage_state": "./.auth/shopping_state.json",
         "start_url": "__SHOPPING__/orders"},
        {"task_id": 2, "sites": ["shopping_admin"], "require_login": True,
         "storage_state": "./.auth/shopping_admin_state.json", "start_url": "__SHOPPING_ADMIN__"},
        {"task_id": 3, "sites": ["gitlab", "reddit"], "require_login": True,
         "storage_state": "./.auth/gitlab.reddit_state.json", "start_url": "__GITLAB__ |AND| __REDDIT__/submit"},
        {"task_id": 4, "sites": ["shopping"], "require_login": False, "storage_state": None,
         "start_url": "__SHOPPING__/orders"},
    ]

    async def go():
        env = WebEnv(shared_pool, small_cfg(), hooks)
        urls = {}
        try:
            for t in tasks:
                obs = await env.reset(t, f"login-{t['task_id']}")
                urls[t["task_id"]] = ([p.url for p in env.context.pages], obs.html)
        finally:
            await env.close()
        return urls

    urls = aloop.run(go())
    assert urls[1][0] == [sites.urls["shopping"] + "/orders"] and "My Orders" in urls[1][1]
    assert urls[2][0] == [sites.urls["shopping_admin"] + "/"] and "Dashboard" in urls[2][1]
    assert urls[3][0] == [sites.urls["gitlab"] + "/", sites.urls["reddit"] + "/submit"]
    assert urls[4][0] == [sites.urls["shopping"] + "/login?next=/orders"]  # control: no state, no login


def test_a_combined_state_is_merged_from_the_per_site_files_when_missing_or_stale(auth, sites, tmp_path):
    folder, _ = auth
    for s in ("gitlab", "reddit"):
        (tmp_path / f"{s}_state.json").write_bytes((folder / f"{s}_state.json").read_bytes())
    hooks = WebArenaHooks(sites.urls, auth_dir=tmp_path)
    task = {"task_id": 9, "require_login": True, "storage_state": "./.auth/gitlab.reddit_state.json"}
    path = hooks.storage_state_for(task)
    assert path == str(tmp_path / "gitlab.reddit_state.json")
    assert len(json.loads((tmp_path / "gitlab.reddit_state.json").read_text())["cookies"]) == 2
    # a newer per-site file (a new login) is merged again
    gl = json.loads((tmp_path / "gitlab_state.json").read_text())
    gl["cookies"][0]["value"] = "byteblaze.newer"
    wl.write_json_atomic(tmp_path / "gitlab_state.json", gl)
    later = (tmp_path / "gitlab.reddit_state.json").stat().st_mtime + 5
    os.utime(tmp_path / "gitlab_state.json", (later, later))
    hooks.storage_state_for(task)
    merged = json.loads((tmp_path / "gitlab.reddit_state.json").read_text())
    assert "byteblaze.newer" in [c["value"] for c in merged["cookies"]]
    # missing parts: the error names the file
    with pytest.raises(FileNotFoundError, match="shopping.shopping_admin_state.json"):
        hooks.storage_state_for({**task, "storage_state": "./.auth/shopping.shopping_admin_state.json"})


def test_merging_states_that_share_a_cookie_is_refused():
    a = {"cookies": [{"name": "PHPSESSID", "value": "1", "domain": "localhost", "path": "/"}], "origins": []}
    b = {"cookies": [{"name": "PHPSESSID", "value": "2", "domain": "localhost", "path": "/"}], "origins": []}
    with pytest.raises(wl.StateCollision, match="'PHPSESSID' of localhost/ is set by both reddit_state.json and "
                                                "shopping_state.json"):
        wl.merge_states([a, b], ["reddit_state.json", "shopping_state.json"])
    assert len(wl.merge_states([a, a])["cookies"]) == 1


def test_a_wrong_password_fails_with_the_site_url_and_account(sites, tmp_path):
    from webrl_cli.main import app

    env = {**wa_env(sites), "WEBARENA_SHOPPING_PASSWORD": "wrong", "WEBARENA_GITLAB_USERNAME": "nobody"}
    res = CliRunner().invoke(app, ["webarena", "login", "--sites", "shopping,gitlab,reddit", "--auth-dir",
                                   str(tmp_path), "--timeout", "10"], env=env)
    assert res.exit_code != 0 and isinstance(res.exception, RuntimeError)
    msg = str(res.exception)
    assert (f"shopping: login as 'emma.lopez@gmail.com' at {sites.urls['shopping']}/customer/account/login/ failed: "
            f"the login form came back") in msg
    assert "Invalid username or password." in msg and "WEBARENA_SHOPPING_PASSWORD" in msg
    assert f"gitlab: login as 'nobody' at {sites.urls['gitlab']}/users/sign_in failed" in msg
    assert "reddit" not in msg  # the good login still went through, and was written
    assert sorted(p.name for p in tmp_path.iterdir()) == ["reddit_state.json"]
    assert "FAILED" in res.output


def test_a_site_that_is_not_a_login_page_is_named(tmp_path, pages_url):
    import asyncio

    out = asyncio.run(wl.login_sites({"reddit": pages_url + "/nothing-here"}, ["reddit"], tmp_path, EnvConfig(),
                                     timeout_ms=3000))
    [row] = out["logins"]
    assert row["error"].startswith(f"reddit: login as 'MarvelsGrantMan136' at {pages_url}/nothing-here/login failed: "
                                   f"the login page answered HTTP 404")
    with pytest.raises(ValueError, match="no URL for site 'gitlab': set the GITLAB"):
        asyncio.run(wl.login_sites({}, ["gitlab"], tmp_path, EnvConfig()))


# ------------------------------------------------------------------------------------------------ resets

def reset_task(task_id, require_reset: bool) -> dict:
    return {"task_id": task_id, "sites": ["gitlab", "reddit"], "require_login": False, "storage_state": None,
            "require_reset": require_reset, "start_url": "__REDDIT__/forums", "intent": "Say done.",
            "eval": {"eval_types": ["string_match"], "reference_answers": {"exact_match": "done"},
                     "reference_url": "", "program_html": [], "string_note": "",
                     "reference_answer_raw_annotation": ""}}


def rollout_with(hooks, tasks, aloop, shared_pool):
    from webrl_core.env.rollout import rollout
    from webrl_core.env.scripted import ScriptedPolicy, exit_

    class Done(ScriptedPolicy):
        def respond(self, ctx):
            return exit_("done")

    return aloop.run(rollout(tasks, Done(), 1, cfg=small_cfg(episode_retries=0), hooks=hooks, purpose="eval",
                             pool=shared_pool, progress=False))


def test_the_reset_command_runs_before_each_task_that_requires_it(sites, aloop, shared_pool, tmp_path):
    log = tmp_path / "resets.log"
    cmd = f"echo {{task_id}} {{sites}} $WEBRL_TASK_ID >> {log}"
    hooks = WebArenaHooks(sites.urls, reset_command=cmd)
    eps = rollout_with(hooks, [reset_task("wa-7", True), reset_task("wa-8", False), reset_task("wa 9;x", True)],
                       aloop, shared_pool)
    assert [e["status"] for e in eps] == ["done"] * 3 and all(e["success"] for e in eps)
    assert log.read_text().splitlines() == ["wa-7 gitlab,reddit wa-7", "wa 9;x gitlab,reddit wa 9;x"]
    assert hooks.resets == 2


def test_a_failing_reset_command_errors_the_episode_with_its_output(sites, aloop, shared_pool):
    cmd = "echo restoring {sites}; echo 'docker: container gitlab not found' >&2; exit 3"
    hooks = WebArenaHooks(sites.urls, reset_command=cmd)
    [ep] = rollout_with(hooks, [reset_task("wa-10", True)], aloop, shared_pool)
    assert ep["status"] == "error" and ep["success"] is None
    assert "sites.reset_command exited with code 3: echo restoring gitlab,reddit;" in ep["error"]
    assert "docker: container gitlab not found" in ep["error"]


def test_a_reset_command_over_its_timeout_is_killed(sites, aloop, tmp_path):
    hooks = WebArenaHooks(sites.urls, reset_command=f"sleep 30; touch {tmp_path / 'late'}", reset_timeout=0.5)
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="timed out after 0.5s: sleep 30"):
        aloop.run(hooks.reset_sites(reset_task("wa-11", True)))
    assert time.monotonic() - t0 < 10 and not (tmp_path / "late").exists()


def test_without_a_reset_command_tasks_run_as_they_are_with_one_warning(sites, aloop, shared_pool, caplog):
    hooks = WebArenaHooks(sites.urls, reset_command="  ")
    with caplog.at_level(logging.WARNING, logger="webrl.env"):
        eps = rollout_with(hooks, [reset_task("wa-12", True), reset_task("wa-13", True)], aloop, shared_pool)
    assert [e["status"] for e in eps] == ["done", "done"]
    warnings = [r.getMessage() for r in caplog.records if "reset_command" in r.getMessage()]
    assert len(warnings) == 1 and "task wa-12 requires a reset of gitlab,reddit" in warnings[0]


def test_the_site_session_passes_the_configured_reset_command(tmp_path):
    from webrl_core.config_loader import load_config
    from webrl_core.sites.session import site_session

    settings = load_config(None, sets=["sites.mode=webarena", "sites.reset_command=./reset.sh {sites}",
                                       f"sites.auth_dir={tmp_path}"], environ={})
    settings = settings.model_copy(update={"sites": settings.sites.model_copy(
        update={"urls": {"gitlab": "http://127.0.0.1:8023"}})})
    with site_session(settings) as hooks:
        assert isinstance(hooks, WebArenaHooks)
        assert hooks.reset_command_for({"sites": ["gitlab"], "task_id": 1}) == "./reset.sh gitlab"
        assert hooks.auth_dir == tmp_path
    assert os.environ.get("WEBRL_TASK_ID") is None

"""MiniWoB++ (the PyPI ``miniwob`` package's HTML tasks) as an offline benchmark with ground-truth rewards,
driven by the same WebRL agent loop (observation, grammar, rollout engine) as the web sites.

Protocol per episode (as BrowserGym's ``browsergym/miniwob/base.py``: ``AbstractMiniwobTask.setup`` and
``validate``): open ``miniwob/<task>.html`` served over http on 127.0.0.1 -> ``Math.seedrandom(seed)`` ->
``core.EPISODE_MAX_TIME = 1e6`` ms (the 10 s default would time episodes out) -> ``core.startEpisodeReal()`` ->
wait for ``WOB_TASK_READY``; the intent is ``core.getUtterance()``. After each action ``WOB_DONE_GLOBAL`` ends
the episode; the score is ``1.0 if WOB_RAW_REWARD_GLOBAL > 0`` (BrowserGym's rule; the raw value is kept in
``site_state``).
"""

from __future__ import annotations

import functools
import http.server
import importlib.util
import re
import threading
from pathlib import Path

from webrl_core.agent_api import StepContext
from webrl_core.env.observation import find_element, parse_observation_elements
from webrl_core.env.scripted import ScriptedPolicy, do, exit_

ORACLE_TASKS = ("click-button", "click-link", "enter-text", "click-checkboxes", "focus-text")
_STATE_JS = ("() => ({done: WOB_DONE_GLOBAL, reward: WOB_REWARD_GLOBAL, raw: WOB_RAW_REWARD_GLOBAL, "
             "reason: WOB_REWARD_REASON == null ? null : String(WOB_REWARD_REASON), episode: WOB_EPISODE_ID})")


def miniwob_html_dir() -> Path:
    """The ``html`` folder inside the installed package (found without importing it: import registers gym envs)."""
    spec = importlib.util.find_spec("miniwob")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("the 'miniwob' package is not installed (pip install miniwob==1.1.0)")
    path = Path(list(spec.submodule_search_locations)[0]) / "html"
    if not (path / "miniwob").is_dir():
        raise FileNotFoundError(f"no MiniWoB++ task pages under {path}")
    return path


def available_tasks() -> list[str]:
    return sorted(p.stem for p in (miniwob_html_dir() / "miniwob").glob("*.html"))


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


class MiniWoBServer:
    """A static file server for the package's ``html/`` folder on 127.0.0.1 (a daemon thread)."""

    def __init__(self, port: int = 0) -> None:
        handler = functools.partial(_QuietHandler, directory=str(miniwob_html_dir()))
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.base_url = f"http://127.0.0.1:{self.port}"
        self._thread: threading.Thread | None = None

    def start(self) -> "MiniWoBServer":
        if self._thread is None:
            self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True, name="miniwob-http")
            self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is not None:
            self.httpd.shutdown()
            self._thread.join(timeout=5)
            self._thread = None
        self.httpd.server_close()

    def __enter__(self) -> "MiniWoBServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class MiniWoBHooks:
    """SiteHooks (+ the optional episode hooks) for MiniWoB++ tasks served by ``MiniWoBServer``.

    ``reuse_context``: MiniWoB++ pages restart in place (re-seed + startEpisodeReal), so an environment keeps its
    tab between episodes instead of paying for a new context, renderer and page load (~0.5-1 s on 2 cores).
    """

    reuse_context = True

    def __init__(self, server: MiniWoBServer, episode_max_time_ms: int = 1_000_000) -> None:
        self.server = server
        self.episode_max_time_ms = episode_max_time_ms

    def url_map(self) -> dict[str, str]:
        return {"__MINIWOB__": self.server.base_url}

    def allowed_hosts(self) -> list[str]:
        return [f"127.0.0.1:{self.server.port}"]

    async def prepare_context(self, context, task: dict, episode_id: str) -> None:
        return None

    def eval_helpers(self) -> dict:
        return {}

    async def after_reset(self, page, task: dict, episode_id: str) -> dict:
        seed = int(task.get("miniwob", {}).get("seed", 0))
        # one round trip: wait for core.js, seed, start, wait for WOB_TASK_READY, read the utterance
        intent = await page.evaluate(
            """async ([seed, maxTime, timeoutMs]) => {
                const until = async (cond) => {
                    const t0 = Date.now();
                    while (!cond()) {
                        if (Date.now() - t0 > timeoutMs) throw new Error('MiniWoB++ task page did not become ready');
                        await new Promise((r) => setTimeout(r, 10));
                    }
                };
                await until(() => typeof core !== 'undefined' && typeof genProblem === 'function' && core.cover_div);
                Math.seedrandom(seed); core.EPISODE_MAX_TIME = maxTime; core.startEpisodeReal();
                await until(() => WOB_TASK_READY);
                return core.getUtterance();
            }""", [seed, self.episode_max_time_ms, 10_000])
        return {"intent": intent}

    async def episode_status(self, page, task: dict) -> dict:
        return await page.evaluate(_STATE_JS)

    async def evaluate_episode(self, page, task: dict, answer: str | None) -> float:
        st = await page.evaluate(_STATE_JS)
        return 1.0 if st["done"] and st["raw"] > 0 else 0.0


def miniwob_tasks(names: list[str], episodes: int, seed: int = 0) -> list[dict]:
    """Task configs (WebArena-Lite-shaped) for ``episodes`` seeds of each MiniWoB++ task."""
    known = set(available_tasks())
    bad = [n for n in names if n not in known]
    if bad:
        raise ValueError(f"unknown MiniWoB++ task(s) {bad}; e.g. {sorted(known)[:10]} ({len(known)} in all)")
    out = []
    for name in names:
        for i in range(episodes):
            s = seed * 100_003 + i
            out.append({"task_id": f"miniwob.{name}.{s}", "sites": ["miniwob"], "require_login": False,
                        "storage_state": None, "start_url": f"__MINIWOB__/miniwob/{name}.html", "geolocation": None,
                        "intent_template": "", "instantiation_dict": {}, "intent": "", "require_reset": False,
                        "eval": {"eval_types": ["miniwob"]}, "intent_template_id": name,
                        "miniwob": {"name": name, "seed": s}})
    return out


# ---------------------------------------------------------------------------------------------
# oracle agents, written against our observation format and grammar

def _quoted(intent: str) -> str | None:
    m = re.search(r'"([^"]*)"', intent)
    return m.group(1) if m else None


class MiniWoBOracle(ScriptedPolicy):
    """Solves click-button, click-link, enter-text, click-checkboxes and focus-text from the observation."""

    policy_id = "miniwob-oracle"

    def respond(self, ctx: StepContext) -> str:
        name = ctx.task.get("miniwob", {}).get("name", "")
        fn = getattr(self, "_" + name.replace("-", "_"), None)
        if fn is None:
            return exit_(f"no oracle for {name}")
        return fn(ctx.task.get("intent", ""), ctx.html) or exit_("oracle found no element")

    def _click_button(self, intent: str, html: str) -> str | None:
        el = find_element(html, _quoted(intent), tag="button", exact=True)
        return el and f"# Element: the '{el.text}' button\n{do('Click', el.id)}"

    def _click_link(self, intent: str, html: str) -> str | None:
        el = find_element(html, _quoted(intent), exact=True, case_sensitive=True)
        return el and do("Click", el.id)

    def _enter_text(self, intent: str, html: str) -> str | None:
        want = _quoted(intent)
        box = find_element(html, tag="input")
        if box is None:
            return None
        if box.attrs.get("value", "") != want:
            return do("Type", box.id, want)
        sub = find_element(html, "Submit", tag="button")
        return sub and do("Click", sub.id)

    def _focus_text(self, intent: str, html: str) -> str | None:
        box = find_element(html, tag="input")
        return box and do("Click", box.id)

    def _click_checkboxes(self, intent: str, html: str) -> str | None:
        m = re.search(r"Select (.*) and click Submit", intent)
        if not m:
            return None
        wanted = set() if m.group(1).strip() == "nothing" else {w.strip() for w in m.group(1).split(",")}
        els = parse_observation_elements(html)
        for i, el in enumerate(els):
            if el.tag != "input" or el.attrs.get("type") != "checkbox" or el.parent is None:
                continue
            label = els[el.parent].text.strip()
            checked = el.attrs.get("data-status") == "checked"
            if (label in wanted) != checked:
                return do("Click", el.id)
        sub = find_element(html, "Submit", tag="button")
        return sub and do("Click", sub.id)

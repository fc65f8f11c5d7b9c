"""One browser environment running WebRL episodes: reset -> step* -> evaluate.

Episode control (as in the official harness, VAB-WebArena-Lite ``new/run.py``: ``early_stop`` and the episode
loop of ``test``, which stops with ``create_stop_action(f"Early stop: {stop_info}")``):

* an episode ends when the agent calls ``exit(message=...)`` (status ``done``, answer = message), when the site
  says it is over (a hook's ``episode_status``: MiniWoB++), after ``max_steps`` actions (``max_steps``), after
  ``parse_failure_limit`` consecutive unparseable responses or ``repeat_action_limit`` identical actions in a
  row (``early_stop``; a Type counts every identical Type in the whole episode, as in VAB). Early stop and
  max_steps set the answer to ``"Early stop: <reason>"`` and the episode is still evaluated. Every one of these
  goes through ``WebEnv._finish``, the one place that sets ``status`` and ``answer``;
* an action that cannot run (unknown id, no such option, timeout) does not end the episode: its message is the
  first line of the next observation, ``[error] ...``;
* nothing the page does reaches a host outside ``hooks.allowed_hosts()`` (with ``block_other_hosts``; how, and
  what was measured: ``browser.py``'s docstring). A blocked navigation is recorded in ``info["blocked"]``, named
  in the next observation's ``[error]`` line, and the tab returns to where it was (a new tab that only tried to
  leave is closed). Traffic that got past Playwright's route and was stopped by the ``BlackholeProxy``
  (WebSockets, shared workers' requests, ...: an absolute URL, or ``host:port`` for a tunnel: ws/wss/https) is
  recorded in ``info["blocked_other"]``; both go to ``blocked_urls``. Ordinary subresources (images, fetch, ...)
  that the route aborts are not recorded: trackers would flood the record;
* a step never raises because a page failed to load: a tab on Chromium's error page (``chrome-error://``,
  e.g. a link to a closed port) is observed as ``[error] error page: net::ERR_... for <url>``, with
  ``info["error"]`` set; ``Go backward`` leaves it. A start URL that does not load still fails ``reset`` (an
  episode that cannot start is an infrastructure error: the rollout engine retries it, then records it);
* a dead page/browser raises ``EnvCrash`` (the rollout engine restarts the browser and retries the episode);
* every step reports ``action_s`` (executing the action) and ``obs_s`` (settling + extracting the observation);
* ``evaluate()`` scores the final state with the site hook or the WebArena evaluators and the env's ``judge``
  (``eval.judge``); it returns None -- unscored, neither solved nor failed -- for a task that needs an LLM judge
  when the env has none.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from webrl_core.env.actions import (Action, ActionError, ActionParseError, execute, is_crash, parse_action)
from webrl_core.env.browser import (BlackholeProxy, BrowserPool, NoHooks, SiteHooks, outside_hosts_pattern,
                                    substitute_urls, url_host)
from webrl_core.env.observation import Observation, RequestTracker, extract


class EnvCrash(RuntimeError):
    """The page or browser died; the episode must be restarted on a fresh browser."""


def split_start_urls(start_url: str) -> list[str]:
    return [u.strip() for u in (start_url or "").split("|AND|") if u.strip()]


class WebEnv:
    def __init__(self, pool: BrowserPool, cfg, hooks: SiteHooks | None = None, slot: int = 0, judge=None) -> None:
        """``judge`` scores the checks VAB gives its LLM judge (fuzzy_match, the N/A reason check):
        ``judge.judge_from_settings(settings)`` makes it from ``eval.judge`` (an ``LLMJudge``, the
        ``FallbackJudge`` for "none", or None). With None, a task that needs a judge is unscored:
        ``evaluate()`` returns None."""
        self.pool, self.cfg, self.slot, self.judge = pool, cfg, slot, judge
        self.hooks = hooks or NoHooks()
        self.context = None
        self.page = None
        self.task: dict = {}
        self.episode_id = ""
        self._trackers: dict[Any, RequestTracker] = {}
        self._new_pages: list = []
        self._blocked: list[str] = []        # blocked navigations since the last step
        self._blocked_top: list[str] = []    # those of them that were the agent's tab's own top-level loads
        self._blocked_other: list[str] = []  # what reached the BlackholeProxy since the last step
        self._allowed: set[str] = set()
        self._hole: BlackholeProxy | None = None
        # main frame -> [url, "net::ERR_...", seen] of its tab's last failed load (seen by _settle_tabs)
        self._nav_failures: dict[Any, list] = {}
        self._orphan_failures: list[list] = []  # failed first loads of new tabs: Playwright gives them no frame
        self._reset_state()

    def _reset_state(self) -> None:
        self.answer: str | None = None
        self.status: str | None = None
        self.n_steps = 0
        self.parse_failures = 0
        self.history: list[Action] = []
        self.blocked_urls: list[str] = []
        self.last_obs: Observation | None = None
        self.last_good_url: str | None = None  # the last observed URL that was not an error page
        self.site_state: dict = {}
        self.last_eval = None  # the EvalResult of the last evaluate() (score and one detail row per check)

    # ------------------------------------------------------------------ lifecycle
    async def close(self) -> None:
        await self._close_context()
        hole, self._hole = self._hole, None
        if hole is not None:
            await hole.close()

    async def _close_context(self) -> None:
        ctx, self.context, self.page = self.context, None, None
        self._trackers.clear()
        self._nav_failures.clear()
        self._orphan_failures.clear()
        if ctx is not None:
            try:
                await ctx.close()
            except Exception:  # the browser may be gone already
                pass

    def _storage_state(self, task: dict) -> str | None:
        fn = getattr(self.hooks, "storage_state_for", None)
        if fn is not None:
            return fn(task)
        ref = task.get("storage_state")
        return ref if ref and Path(ref).is_file() else None

    async def _route(self, route) -> None:
        req = route.request
        if req.is_navigation_request():
            self._blocked.append(req.url)
            try:
                if req.frame.parent_frame is None and req.frame.page is self.page:
                    self._blocked_top.append(req.url)
            except Exception:  # a new tab's first load has no frame yet; that tab is handled as a new page
                pass
        await route.abort("blockedbyclient")

    def _on_hole(self, target: str) -> None:
        self._blocked_other.append(target)

    def _on_request_failed(self, req) -> None:
        """Remember each tab's last failed top-level load: the error page itself does not say what failed."""
        try:
            if not req.is_navigation_request():
                return
            failure = [req.url, req.failure or "net::ERR_FAILED", False]
        except Exception:  # the page is gone
            return
        try:
            frame = req.frame
        except Exception:  # "issued before the frame is created": a new tab's first load (2 of 12 measured
            # target=_blank tabs); _failure_of hands it to the next error page without a failure of its own
            self._orphan_failures = self._orphan_failures[-7:] + [failure]
            return
        if frame.parent_frame is None:
            self._nav_failures[frame] = failure

    def _failure_of(self, page) -> list | None:
        """[url, "net::ERR_...", seen] of the load that left ``page`` on its error page, if known."""
        failure = self._nav_failures.get(page.main_frame)
        if failure is None and self._orphan_failures:
            failure = self._nav_failures[page.main_frame] = self._orphan_failures.pop()
        return failure

    def _on_page(self, page) -> None:
        self._new_pages.append(page)

    def _track(self, page) -> RequestTracker:
        if page not in self._trackers:
            self._trackers[page] = RequestTracker(page)
        return self._trackers[page]

    async def _soft_reset(self, urls: list[str]) -> bool:
        """Reuse the open context (hooks with ``reuse_context = True``): one tab, at the start URL.

        MiniWoB++ pages restart in place. Hooks that also set ``fresh_session_on_reuse = True`` (the embedded
        sites, whose per-episode state lives behind a cookie) get their cookies replaced through
        ``prepare_context``, the tab's back/forward history emptied and the start page loaded again, so the
        episode sees nothing of the previous one; a new context would cost a renderer start (~150 ms CPU)."""
        if not getattr(self.hooks, "reuse_context", False) or self.context is None or self.page is None \
                or self.page.is_closed() or len(urls) != 1:
            return False
        for p in self.context.pages:
            if p is not self.page:
                await p.close()
        self._new_pages = []
        if getattr(self.hooks, "fresh_session_on_reuse", False):
            await self.context.clear_cookies()
            await self.hooks.prepare_context(self.context, self.task, self.episode_id)
            await self.page.goto(urls[0], wait_until="domcontentloaded")
            await self._reset_history()
        elif self.page.url.split("#")[0] != urls[0]:
            await self.page.goto(urls[0], wait_until="domcontentloaded")
        return True

    async def _reset_history(self) -> None:
        """Empty the tab's back/forward list (Chromium's CDP; other browsers open a fresh tab instead)."""
        try:
            cdp = await self.context.new_cdp_session(self.page)
            await cdp.send("Page.resetNavigationHistory")
            await cdp.detach()
        except Exception:
            old = self.page
            self.page = await self.context.new_page()
            self._track(self.page)
            await self.page.goto(old.url, wait_until="domcontentloaded")
            await old.close()
            self._new_pages = []

    async def reset(self, task: dict, episode_id: str) -> Observation:
        """Open a fresh context for ``task`` (or reuse it, see ``_soft_reset``) and return the first observation."""
        self._reset_state()
        self.episode_id = episode_id
        self.task = substitute_urls(dict(task), self.hooks.url_map())
        self._blocked = []
        self._blocked_top = []
        self._blocked_other = []
        self._nav_failures.clear()
        self._orphan_failures.clear()
        self._allowed = {h.lower() for h in self.hooks.allowed_hosts()}
        try:
            urls = split_start_urls(self.task.get("start_url", "")) or ["about:blank"]
            if await self._soft_reset(urls):
                return await self._after_reset()
            await self._close_context()
            self._new_pages = []
            storage = self._storage_state(self.task)
            contain = self.cfg.block_other_hosts and bool(self._allowed)
            proxy = None
            if contain:
                if self._hole is None:
                    self._hole = await BlackholeProxy(self._on_hole).start()
                proxy = self._hole.settings(self._allowed)
            self.context = await self.pool.new_context(self.slot, storage_state=storage,
                                                       geolocation=self.task.get("geolocation"), proxy=proxy)
            self.context.on("requestfailed", self._on_request_failed)
            if contain:
                # the route aborts what Playwright sees, before it is sent; the proxy stops the rest. Playwright's
                # route_web_socket is left out: an in-page wrapper of the WebSocket constructor that workers and
                # WebSocketStream get past (the proxy stops all of them), and it delays each new tab's page event
                # enough that a target=_blank tab was missed by _follow_tabs in 3 of 4 runs of
                # test_every_action_type (0 of 4 without it)
                await self.context.route(outside_hosts_pattern(self._allowed), self._route)
            await self.hooks.prepare_context(self.context, self.task, episode_id)
            pages = []
            for url in urls:
                page = await self.context.new_page()
                self._track(page)
                if url != "about:blank":
                    await page.goto(url, wait_until="domcontentloaded")
                pages.append(page)
            self.page = pages[0]
            if len(pages) > 1:
                await self.page.bring_to_front()
            self.context.on("page", self._on_page)
            return await self._after_reset()
        except Exception as e:
            if is_crash(e):
                raise EnvCrash(f"reset: {e}") from e
            raise

    async def _after_reset(self) -> Observation:
        after = getattr(self.hooks, "after_reset", None)
        if after is not None:
            updates = await after(self.page, self.task, self.episode_id)
            if updates:
                self.task.update(updates)
        return await self._observe(None)

    # ------------------------------------------------------------------ stepping
    def _repeats(self, action: Action) -> int:
        """How many identical actions the history ends with (Type: anywhere in the history), this one included."""
        if action.name == "Type":
            return sum(a.key() == action.key() for a in self.history)
        n = 0
        for a in reversed(self.history):
            if a.key() != action.key():
                break
            n += 1
        return n

    async def _switch_tab(self, argument: str | None) -> None:
        pages = self.context.pages
        if argument is None or str(argument).strip() == "":
            idx = (pages.index(self.page) + 1) % len(pages) if self.page in pages else 0
        else:
            try:
                idx = int(str(argument).strip())
            except ValueError:
                raise ActionError(f"Switch Tab needs a tab index 0..{len(pages) - 1}, got {argument!r}") from None
            if not 0 <= idx < len(pages):
                raise ActionError(f"there is no tab {idx}; open tabs: 0..{len(pages) - 1}")
        self.page = pages[idx]
        await self.page.bring_to_front()

    def _follow_tabs(self) -> None:
        """Focus the newest tab a click opened; fall back to an open tab if the active one closed."""
        new = [p for p in self._new_pages if not p.is_closed()]
        self._new_pages = []
        if new:
            self.page = new[-1]
            self._track(self.page)
        elif self.page is None or self.page.is_closed():
            open_pages = [p for p in self.context.pages if not p.is_closed()]
            if not open_pages:
                raise EnvCrash("every tab of the episode was closed")
            self.page = open_pages[-1]

    async def step(self, response: str) -> tuple[Observation, bool, dict]:
        """Parse and run one raw policy response. Returns (observation, done, info)."""
        if self.status is not None:
            raise RuntimeError(f"episode {self.episode_id} is over ({self.status}); call reset()")
        self.n_steps += 1
        info: dict[str, Any] = {"action": None, "error": None, "blocked": [], "blocked_other": [], "action_s": 0.0}
        prev_page = self.page
        error: str | None = None
        t0 = time.perf_counter()
        try:
            action = parse_action(response)
        except ActionParseError as e:
            action = None
            self.parse_failures += 1
            error = f"invalid action: {e}"
            if self.parse_failures >= self.cfg.parse_failure_limit:
                self._finish("early_stop", f"Early stop: {self.parse_failures} consecutive unparseable actions")
        if action is not None:
            self.parse_failures = 0
            info["action"] = action.to_json()
            repeats = self._repeats(action) + 1
            self.history.append(action)
            if action.name == "exit":
                self._finish("done", action.message or "")
            else:
                try:
                    if action.name == "Switch Tab":
                        await self._switch_tab(action.argument)
                    else:
                        await execute(self.page, action, viewport_height=self.cfg.viewport_height,
                                      timeout_ms=self.cfg.action_timeout_ms, type_replaces=self.cfg.type_replaces,
                                      settle_timeout_ms=self.cfg.settle_timeout_ms)
                except ActionError as e:
                    error = f"{action.name} failed: {e}"
                except Exception as e:  # Playwright errors: timeouts, detached elements, crashes
                    if is_crash(e):
                        raise EnvCrash(f"step {self.n_steps}: {e}") from e
                    error = f"{action.name} failed: {str(e).strip().splitlines()[0][:300]}"
                if repeats >= self.cfg.repeat_action_limit:
                    self._finish("early_stop", f"Early stop: the same action {repeats} times")
        info["action_s"] = time.perf_counter() - t0
        try:
            error = await self._settle_tabs(prev_page, error, info)
            obs = await self._observe(error)
            if self._new_pages:  # a tab opened while the page settled (popups arrive asynchronously)
                error = await self._settle_tabs(prev_page, error, info)
                obs = await self._observe(error)
            status_fn = getattr(self.hooks, "episode_status", None)
            if self.status is None and status_fn is not None:
                st = await status_fn(self.page, self.task)
                if st:
                    self.site_state = st
                    if st.get("done"):
                        self._finish("done", "")
        except EnvCrash:
            raise
        except Exception as e:
            if is_crash(e):
                raise EnvCrash(f"observation after step {self.n_steps}: {e}") from e
            raise
        if self.n_steps >= self.cfg.max_steps:
            self._finish("max_steps", f"Early stop: reached max_steps={self.cfg.max_steps}")
        self._flush_blocked(info, navigations=False)  # blocked while the page settled
        done = self.status is not None
        info.update(obs_s=obs.obs_s, error=obs.error, status=self.status, answer=self.answer if done else None)
        return obs, done, info

    def _finish(self, status: str, answer: str) -> None:
        """End the episode: the one place ``status`` and ``answer`` are set. The first reason of a step wins
        (a later one in the same step is ignored); ``step`` then returns ``done=True``."""
        if self.status is None:
            self.status, self.answer = status, answer

    def _flush_blocked(self, info: dict, navigations: bool = True) -> None:
        """Move the blocked navigations (unless ``navigations`` is False: those the next step handles) and the
        other blocked traffic seen so far into ``info`` and ``blocked_urls``."""
        navs = self._blocked if navigations else []
        if navigations:
            self._blocked = []
            self._blocked_top = []
        # a navigation the proxy stopped is recorded once, as a navigation
        other = [u for u in self._blocked_other if u not in navs]
        self._blocked_other = []
        info["blocked"] = info["blocked"] + [u for u in navs if u not in info["blocked"]]
        info["blocked_other"] = info["blocked_other"] + other
        self.blocked_urls += navs + other

    async def _settle_tabs(self, prev_page, error: str | None, info: dict) -> str | None:
        """Focus the tab the action left the agent on and deal with blocked navigations; returns ``error`` with
        the first newly blocked navigation named.

        A tab on an error page whose failed load was for an outside host was blocked, even where the route did
        not see it (an allowed host's redirect, stopped by the ``BlackholeProxy``): it goes back to where the
        agent was (``_leave_error_page``)."""
        self._follow_tabs()
        page_blocked = False
        if self.page.url.startswith("chrome-error://") and self.cfg.block_other_hosts and self._allowed:
            failure = self._failure_of(self.page)
            if failure is not None:
                host = url_host(failure[0])
                page_blocked = bool(host) and host not in self._allowed
                if page_blocked and not failure[2] and failure[0] not in self._blocked + info["blocked"]:
                    self._blocked.append(failure[0])
                failure[2] = True  # recorded once, however many steps the tab stays there
        new = [u for u in self._blocked if u not in info["blocked"]]
        if new:
            error = (error + "; " if error else "") + \
                f"navigation to {new[0]} was blocked (outside the task's websites)"
        if new or page_blocked:
            await self._leave_error_page(prev_page, error_page_coming=any(u in self._blocked_top for u in new))
        self._flush_blocked(info)
        return error

    async def _leave_error_page(self, prev_page=None, error_page_coming: bool = False) -> None:
        """A blocked navigation leaves Chromium's error page: return to where the agent was.

        Back in the tab's history first; a tab opened by the blocked navigation (a popup, target=_blank) is closed
        and the tab the agent was on comes back; otherwise the last page the agent saw is loaded again. Failures
        to get back leave the tab on the error page, which ``_observe`` reports; only a crash raises.
        ``error_page_coming``: the route stopped this tab's own top-level load, whose error page commits
        asynchronously (on a loaded box after this step's settling): wait for it (at most the settle timeout)
        rather than leave the agent to find it on its next observation."""
        page = self.page
        if not page.url.startswith("chrome-error://") and error_page_coming:
            try:
                await page.wait_for_url(lambda u: u.startswith("chrome-error://"), wait_until="commit",
                                        timeout=max(self.cfg.settle_timeout_ms, 1000))
            except Exception as e:
                if is_crash(e):
                    raise
        if not page.url.startswith("chrome-error://"):
            return
        try:
            await page.go_back(wait_until="domcontentloaded")
        except Exception as e:
            if is_crash(e):
                raise
        if not page.url.startswith("chrome-error://") and \
                not (page.url == "about:blank" and self.last_good_url not in (None, "about:blank")):
            return
        if prev_page is not None and prev_page is not page and not prev_page.is_closed():
            await page.close()
            self.page = prev_page
            await prev_page.bring_to_front()
            return
        if self.last_good_url:
            try:
                await page.goto(self.last_good_url, wait_until="domcontentloaded")
            except Exception as e:
                if is_crash(e):
                    raise

    async def _observe(self, error: str | None) -> Observation:
        """The observation of the active tab, ``error`` first. Never raises for the page's own state (an error
        page, a page that keeps navigating): that is reported in the observation; a crash raises."""
        page = self.page
        try:
            obs = await extract(page, keep_bbox=self.cfg.keep_bbox, viewport_only=self.cfg.viewport_only,
                                settle_timeout_ms=self.cfg.settle_timeout_ms, tracker=self._track(page))
        except Exception as e:
            if is_crash(e):
                raise
            obs = Observation(html="", url=page.url)
            error = (error + "; " if error else "") + \
                f"the page could not be read: {str(e).strip().splitlines()[0][:300]}"
        if obs.url.startswith("chrome-error://"):
            url, failure, _ = self._failure_of(page) or ("", "", False)
            what = f"{failure} for {url}" if url else "the page failed to load"
            error = (error + "; " if error else "") + f"error page: {what}"
        else:
            self.last_good_url = obs.url
        if error:
            obs.error = error
            obs.html = f"[error] {error}\n{obs.html}"
        self.last_obs = obs
        return obs

    # ------------------------------------------------------------------ scoring
    async def evaluate(self) -> float | None:
        """The task's ground-truth score on the final page state (site hook, else the WebArena evaluators), or
        None when it is unscored: the task needs an LLM judge (fuzzy_match, the N/A reason check), this env has
        none (``judge=None``: ``eval.judge`` is empty) and no other check scored 0. ``last_eval`` keeps the
        ``EvalResult`` with one detail row per check (who judged, the judge's reply, why a check is unscored).
        A task without an ``eval`` spec that the site hook does not score is a ValueError that says so."""
        from webrl_core.env.evaluators import EvalResult, evaluate_task

        hook = getattr(self.hooks, "evaluate_episode", None)
        self.last_eval = None
        try:
            if hook is not None:
                score = await hook(self.page, self.task, self.answer)
                if score is not None:
                    self.last_eval = EvalResult(float(score), [{"evaluator": "site", "check": "evaluate_episode",
                                                                "score": float(score)}])
                    return float(score)
            if not isinstance(self.task.get("eval"), dict):  # a URL played by hand; else a bare KeyError 'eval'
                raise ValueError("this task has no 'eval' spec")
            result = await evaluate_task(self.task, self.page, self.answer, helpers=self.hooks.eval_helpers(),
                                         judge=self.judge)
            self.last_eval = result
            return result.score
        except Exception as e:
            if is_crash(e):
                raise EnvCrash(f"evaluate: {e}") from e
            raise

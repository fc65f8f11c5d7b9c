"""One browser environment running WebRL episodes: reset -> step* -> evaluate.

Episode control (webrl_spec.md §6.1, envs_spec.md §2.3):

* an episode ends when the agent calls ``exit(message=...)`` (status ``done``, answer = message), when the site
  says it is over (a hook's ``episode_status``: MiniWoB++), after ``max_steps`` actions (``max_steps``), after
  ``parse_failure_limit`` consecutive unparseable responses or ``repeat_action_limit`` identical actions in a
  row (``early_stop``; a Type counts every identical Type in the whole episode, as in VAB). Early stop and
  max_steps set the answer to ``"Early stop: <reason>"`` and the episode is still evaluated;
* an action that cannot run (unknown id, no such option, timeout) does not end the episode: its message is the
  first line of the next observation, ``[error] ...``;
* navigation to a host outside ``hooks.allowed_hosts()`` is aborted and recorded in ``info["blocked"]``;
* a dead page/browser raises ``EnvCrash`` (the rollout engine restarts the browser and retries the episode);
* every step reports ``action_s`` (executing the action) and ``obs_s`` (settling + extracting the observation).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from webrl_core.env.actions import (Action, ActionError, ActionParseError, execute, is_crash, parse_action)
from webrl_core.env.browser import BrowserPool, NoHooks, SiteHooks, outside_hosts_pattern, substitute_urls
from webrl_core.env.observation import Observation, RequestTracker, extract


class EnvCrash(RuntimeError):
    """The page or browser died; the episode must be restarted on a fresh browser."""


def split_start_urls(start_url: str) -> list[str]:
    return [u.strip() for u in (start_url or "").split("|AND|") if u.strip()]


class WebEnv:
    def __init__(self, pool: BrowserPool, cfg, hooks: SiteHooks | None = None, slot: int = 0, judge=None) -> None:
        self.pool, self.cfg, self.slot, self.judge = pool, cfg, slot, judge
        self.hooks = hooks or NoHooks()
        self.context = None
        self.page = None
        self.task: dict = {}
        self.episode_id = ""
        self._trackers: dict[Any, RequestTracker] = {}
        self._new_pages: list = []
        self._blocked: list[str] = []
        self._allowed: set[str] = set()
        self._reset_state()

    def _reset_state(self) -> None:
        self.answer: str | None = None
        self.status: str | None = None
        self.n_steps = 0
        self.parse_failures = 0
        self.history: list[Action] = []
        self.blocked_urls: list[str] = []
        self.last_obs: Observation | None = None
        self.site_state: dict = {}

    # ------------------------------------------------------------------ lifecycle
    async def close(self) -> None:
        ctx, self.context, self.page = self.context, None, None
        self._trackers.clear()
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
        await route.abort("blockedbyclient")

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
        self._allowed = {h.lower() for h in self.hooks.allowed_hosts()}
        try:
            urls = split_start_urls(self.task.get("start_url", "")) or ["about:blank"]
            if await self._soft_reset(urls):
                return await self._after_reset()
            await self.close()
            self._new_pages = []
            storage = self._storage_state(self.task)
            self.context = await self.pool.new_context(self.slot, storage_state=storage,
                                                       geolocation=self.task.get("geolocation"))
            if self.cfg.block_other_hosts and self._allowed:
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
        info: dict[str, Any] = {"action": None, "error": None, "blocked": [], "action_s": 0.0}
        error: str | None = None
        done = False
        t0 = time.perf_counter()
        try:
            action = parse_action(response)
        except ActionParseError as e:
            action = None
            self.parse_failures += 1
            error = f"invalid action: {e}"
            if self.parse_failures >= self.cfg.parse_failure_limit:
                done, self.status = True, "early_stop"
                self.answer = f"Early stop: {self.parse_failures} consecutive unparseable actions"
        if action is not None:
            self.parse_failures = 0
            info["action"] = action.to_json()
            repeats = self._repeats(action) + 1
            self.history.append(action)
            if action.name == "exit":
                done, self.status, self.answer = True, "done", action.message or ""
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
                if repeats >= self.cfg.repeat_action_limit and not done:
                    done, self.status = True, "early_stop"
                    self.answer = f"Early stop: the same action {repeats} times"
        info["action_s"] = time.perf_counter() - t0
        try:
            self._follow_tabs()
            if self._blocked:
                info["blocked"] = list(self._blocked)
                self.blocked_urls += self._blocked
                error = (error + "; " if error else "") + \
                    f"navigation to {self._blocked[0]} was blocked (outside the task's websites)"
                self._blocked = []
                await self._leave_error_page()
            obs = await self._observe(error)
            if self._new_pages:  # a tab opened while the page settled (popups arrive asynchronously)
                self._follow_tabs()
                obs = await self._observe(error)
            if not done:
                status_fn = getattr(self.hooks, "episode_status", None)
                if status_fn is not None:
                    st = await status_fn(self.page, self.task)
                    if st:
                        self.site_state = st
                        if st.get("done"):
                            done, self.status = True, "done"
                            if self.answer is None:
                                self.answer = ""
        except EnvCrash:
            raise
        except Exception as e:
            if is_crash(e):
                raise EnvCrash(f"observation after step {self.n_steps}: {e}") from e
            raise
        if not done and self.n_steps >= self.cfg.max_steps:
            done, self.status = True, "max_steps"
            self.answer = f"Early stop: reached max_steps={self.cfg.max_steps}"
        info.update(obs_s=obs.obs_s, error=error, status=self.status, answer=self.answer if done else None)
        return obs, done, info

    async def _leave_error_page(self) -> None:
        """A blocked navigation leaves Chromium's error page: return to where the agent was."""
        if not self.page.url.startswith("chrome-error://"):
            return
        try:
            await self.page.go_back(wait_until="domcontentloaded")
        except Exception:
            pass
        if self.page.url.startswith("chrome-error://") and self.last_obs is not None:
            await self.page.goto(self.last_obs.url, wait_until="domcontentloaded")

    async def _observe(self, error: str | None) -> Observation:
        obs = await extract(self.page, keep_bbox=self.cfg.keep_bbox, viewport_only=self.cfg.viewport_only,
                            settle_timeout_ms=self.cfg.settle_timeout_ms, tracker=self._track(self.page))
        if error:
            obs.error = error
            obs.html = f"[error] {error}\n{obs.html}"
        self.last_obs = obs
        return obs

    # ------------------------------------------------------------------ scoring
    async def evaluate(self) -> float:
        """The task's ground-truth score on the final page state (site hook, else the WebArena evaluators)."""
        hook = getattr(self.hooks, "evaluate_episode", None)
        try:
            if hook is not None:
                score = await hook(self.page, self.task, self.answer)
                if score is not None:
                    return float(score)
            from webrl_core.env.evaluators import evaluate_task
            result = await evaluate_task(self.task, self.page, self.answer, helpers=self.hooks.eval_helpers(),
                                         judge=self.judge)
            return float(result.score)
        except Exception as e:
            if is_crash(e):
                raise EnvCrash(f"evaluate: {e}") from e
            raise

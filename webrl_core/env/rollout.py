"""The rollout engine: many episodes at once over a browser pool, one batched policy call per round.

Contract:

* ``n_envs`` workers each own a ``WebEnv`` (slot i -> browser process i // contexts_per_browser) and take
  (task, attempt) jobs from a queue;
* every worker that needs an action puts its prompt (``build_prompt(intent, past_responses, html,
  cfg.obs_char_budget, compat=prompt_compat)``; ``prompt_compat``: "webrl", "webrl_restated" or "official", see
  ``webrl_core.prompts``) into a shared batch; the batch goes to ONE ``policy.act(prompts, contexts)`` call
  as soon as no worker is busy with its browser, or the oldest request has waited ``cfg.batch_wait_s`` or, if
  longer, ``cfg.batch_wait_calls`` times the last call's seconds (one call in flight at a time, so requests that
  arrive during a call join the next one, and a worker that misses a call waits it out); a policy with
  ``batched = False`` (scripted ones) is called as soon as any request is pending;
* episode id = ``webrl_core.identity.episode_id``: a digest of the task's content, the policy's identity
  (``policy_digest``), the sampling and environment settings (``settings_digest``), seed and attempt (how
  many times the task appeared earlier in ``tasks``, unless ``attempts`` gives them). The same inputs give
  the same ids (a re-run overwrites, never duplicates); any change gives new episodes;
* an episode whose browser/page crashed (or hung past the step watchdog) is retried up to
  ``cfg.episode_retries`` times on a fresh context (a dead browser is relaunched); after that it is stored
  with ``status="error"``, ``env_score=None`` and the error text -- never silently scored 0, never lost;
* each finished episode is written with ``store.write_episode(episode, steps)`` the moment it ends;
* step rewards: 0 for every step but the last, whose reward is the episode's env_score (0 when None);
  ``mc_return`` is left None for the learner;
* screenshots: a format whose observation holds one (``prompt.observation: compact+screenshot``, ``screenshot``;
  ``prompts.PromptFormat.screenshot``) gets each step's PNG of the page the action is chosen on (the viewport, after
  the page settled), in memory, on the step's context (``ObservedStep.screenshot``) for the policy; nothing of it is
  stored. With ``env.screenshots`` the same PNG goes to ``<screenshot_dir>/<episode_id>/<idx>.png`` (the viewer),
  and the page after the last action to ``<screenshot_dir>/<episode_id>/final.png`` (what a judge of the end state
  reads).
"""

from __future__ import annotations

import asyncio
import socket
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from webrl_core import identity
from webrl_core.agent_api import StepContext
from webrl_core.env.actions import is_crash
from webrl_core.env.browser import BrowserPool
from webrl_core.env.episode import EPISODE_COLUMNS, Episode, FinalPage
from webrl_core.env.web_env import EnvCrash, WebEnv
from webrl_core.prompts import PromptFormat, as_format, build_prompt
from webrl_core.websites import is_success


FINAL_SCREENSHOT = "final.png"
"""The name of the end state's screenshot beside the steps' ``<idx>.png`` (``env.screenshots``)."""


@dataclass
class ObservedStep(StepContext):
    """A step's context with the PNG of its page (``screenshot``), for a format whose observation holds it."""

    screenshot: bytes | None = None


class PolicyError(RuntimeError):
    """The policy failed or returned a malformed batch; the rollout stops (finished episodes are stored)."""


def default_attempts(tasks: list[dict]) -> list[int]:
    """Attempt number of each task: how many times its id appeared earlier in the list (duplicates = samples)."""
    seen: dict[str, int] = {}
    out = []
    for task in tasks:
        if "task_id" not in task:
            raise ValueError(f"task has no task_id: {str(task)[:200]}")
        tid = str(task["task_id"])
        out.append(seen.get(tid, 0))
        seen[tid] = seen.get(tid, 0) + 1
    return out


def plan_episode_ids(tasks: list[dict], *, phase: int, purpose: str, seed: int, policy_digest: str,
                     settings_digest: str, attempts: list[int] | None = None) -> list[str]:
    """The episode id each (task, attempt) will be stored under (see ``webrl_core.identity``)."""
    attempts = default_attempts(tasks) if attempts is None else attempts
    return [identity.episode_id(t["task_id"], purpose=purpose, phase=phase, task_digest=identity.task_digest(t),
                                policy_digest=policy_digest, settings_digest=settings_digest, seed=seed, attempt=a)
            for t, a in zip(tasks, attempts)]


class _Batcher:
    """Collects action requests from workers and serves them with one policy call per batch."""

    def __init__(self, policy, wait_s: float, wait_calls: float = 0.0) -> None:
        self.policy, self.base_wait_s, self.wait_calls = policy, wait_s, wait_calls
        self.wait_s = wait_s  # the base wait, or the share of the last call's seconds if that is longer
        # a request is held only while the policy is idle: what waited during a call lost nothing by it, and
        # counting that time let two half-batches alternate (each had waited a whole call when the other returned)
        self.idle_since = time.perf_counter()
        self.pending: list[tuple[str, StepContext, asyncio.Future, float]] = []
        self.busy = 0
        self.closed = False
        self.batch_sizes: list[int] = []
        self._wake = asyncio.Event()

    def enter(self) -> None:
        self.busy += 1

    def leave(self) -> None:
        self.busy -= 1
        self._wake.set()

    async def request(self, prompt: str, ctx: StepContext) -> str:
        fut = asyncio.get_running_loop().create_future()
        self.pending.append((prompt, ctx, fut, time.perf_counter()))
        self.leave()
        try:
            return await fut
        finally:
            self.enter()

    def close(self) -> None:
        self.closed = True
        self._wake.set()

    async def run(self) -> None:
        while True:
            if self.closed and not self.pending:
                return
            now = time.perf_counter()
            held = now - max(self.pending[0][3], self.idle_since) if self.pending else 0.0
            if self.pending and (self.busy <= 0 or held >= self.wait_s or self.closed):
                batch, self.pending = self.pending, []
                self.batch_sizes.append(len(batch))
                try:
                    t0 = time.perf_counter()
                    try:
                        out = await self.policy.act([b[0] for b in batch], [b[1] for b in batch])
                    finally:
                        self.idle_since = time.perf_counter()
                    self.wait_s = max(self.base_wait_s, self.wait_calls * (self.idle_since - t0))
                    if not isinstance(out, list) or len(out) != len(batch):
                        raise PolicyError(f"policy {getattr(self.policy, 'policy_id', self.policy)!r} returned "
                                          f"{len(out) if isinstance(out, list) else type(out).__name__} responses "
                                          f"for {len(batch)} prompts")
                except Exception as e:
                    err = e if isinstance(e, PolicyError) else PolicyError(f"policy.act failed: {e!r}")
                    for b in batch:
                        if not b[2].done():
                            b[2].set_exception(err)
                    continue
                for b, resp in zip(batch, out):
                    if not b[2].done():
                        b[2].set_result(resp if isinstance(resp, str) else str(resp))
                # the served workers run (and count as busy) before the next batch is judged: without this turn
                # no worker looks busy, and what arrived during the call went at once, without them, every round
                await asyncio.sleep(0)
                continue
            self._wake.clear()
            timeout = None
            if self.pending:
                timeout = max(0.0, self.wait_s - held)
            try:
                await asyncio.wait_for(self._wake.wait(), timeout)
            except asyncio.TimeoutError:
                pass


class _Ending(NamedTuple):
    """How an attempt that ran to the end finished (``_run_episode``)."""

    status: str
    final_answer: str | None
    env_score: float | None
    intent: str  # the task's intent after the site hooks' updates ("" when it has none)
    page: FinalPage | None  # None only for the failed episode's stand-in in ``_episode_with_retries``


async def _run_episode(env: WebEnv, task: dict, episode_id: str, batcher: _Batcher, cfg,
                       steps: list[dict], timing: dict, screenshot_dir=None,
                       prompt_compat: str | PromptFormat = "webrl") -> _Ending:
    """One attempt. Appends step dicts to ``steps`` as it goes; returns how the episode ended."""
    watchdog = (cfg.settle_timeout_ms + 3 * cfg.action_timeout_ms) / 1000 + 30
    observes_screenshot = as_format(prompt_compat).screenshot
    t = time.perf_counter()
    obs = await asyncio.wait_for(env.reset(task, episode_id), watchdog)
    timing["env_s"] += time.perf_counter() - t
    intent = env.task.get("intent", "")
    past: list[str] = []
    done = False
    while not done:
        idx = len(past)
        png = None
        if observes_screenshot or screenshot_dir is not None:  # the page the agent acts on, as it settled
            t = time.perf_counter()
            png = await _screenshot(env, screenshot_dir, episode_id, f"{idx}.png", watchdog)
            timing["env_s"] += time.perf_counter() - t
        prompt = build_prompt(intent, past, obs.html, cfg.obs_char_budget, compat=prompt_compat)
        ctx = ObservedStep(task=env.task, html=obs.html, url=obs.url, step=idx, past_responses=list(past),
                           episode_id=episode_id, screenshot=png if observes_screenshot else None)
        t = time.perf_counter()
        response = await batcher.request(prompt, ctx)
        policy_s = time.perf_counter() - t
        timing["policy_s"] += policy_s
        t = time.perf_counter()
        new_obs, done, info = await asyncio.wait_for(env.step(response), watchdog)
        timing["env_s"] += time.perf_counter() - t
        steps.append({"episode_id": episode_id, "idx": idx, "prompt": prompt, "html": obs.html,
                      "response": response, "action": info["action"], "url": obs.url, "reward": 0.0,
                      "done": bool(done), "mc_return": None, "policy_s": policy_s,
                      "action_s": info["action_s"], "obs_s": info["obs_s"], "error": info["error"]})
        past.append(response)
        obs = new_obs
    t = time.perf_counter()
    if screenshot_dir is not None:  # the end state, before an evaluator may load other pages
        await _screenshot(env, screenshot_dir, episode_id, FINAL_SCREENSHOT, watchdog)
    score = await asyncio.wait_for(env.evaluate(), watchdog)
    timing["env_s"] += time.perf_counter() - t
    return _Ending(env.status, env.answer, score, intent,
                   FinalPage(obs.html, obs.url, list(env.blocked_urls), dict(env.site_state)))


async def _screenshot(env: WebEnv, screenshot_dir, episode_id: str, name: str, watchdog: float) -> bytes | None:
    """PNG bytes of the env's current page (its viewport, as Playwright's ``page.screenshot()`` returns them), also
    written to ``<screenshot_dir>/<episode_id>/<name>`` when ``screenshot_dir`` is given; None without a page."""
    if env.page is None:
        return None
    png = await asyncio.wait_for(env.page.screenshot(), watchdog)
    if screenshot_dir is not None:
        path = Path(screenshot_dir) / episode_id / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(png)
    return png


async def rollout(tasks: list[dict], policy, n_envs: int, *, cfg, hooks=None, store=None, phase: int = 0,
                  purpose: str = "rollout", policy_id: str | None = None, policy_digest: str | None = None,
                  settings_digest: str | None = None, attempts: list[int] | None = None, seed: int = 0,
                  progress: bool = True, judge=None, pool: BrowserPool | None = None,
                  screenshot_dir=None, node: str | None = None,
                  prompt_compat: str | PromptFormat = "webrl") -> list[dict]:
    """Run every task once (duplicates = more samples) and return episode dicts (each with a ``steps`` list).

    ``policy_digest`` / ``settings_digest``: the identity of what acts (``webrl_core.identity``); by default the
    policy's own ``policy_digest`` (else its ``policy_id``) and the env's behaviour settings.
    ``screenshot_dir``: with ``cfg.screenshots``, a PNG per step goes to ``<dir>/<episode_id>/<idx>.png`` and the
    page after the last action to ``<dir>/<episode_id>/final.png``.
    ``node``: what episodes record as the machine that produced them (default: the hostname; the Ray engine
    passes ``<hostname>/<node ip>/ray:<node id>``).
    ``prompt_compat``: the prompt format (a ``prompt.compat`` name or a ``prompts.PromptFormat``); a non-default
    format (its ``key``) is folded
    into the default ``settings_digest`` (a caller that passes ``settings_digest`` must include it there)."""
    prompt_compat = as_format(prompt_compat)
    screenshot_dir = screenshot_dir if getattr(cfg, "screenshots", False) else None
    policy_id = policy_id or getattr(policy, "policy_id", type(policy).__name__)
    policy_digest = policy_digest or getattr(policy, "policy_digest", None) or policy_id
    if not settings_digest:
        settings_digest = identity.settings_digest(cfg)
        if prompt_compat.key != "webrl":  # other prompts, other episodes (the default format keeps its ids)
            settings_digest = identity.digest({"settings": settings_digest, "prompt_compat": prompt_compat.key})
    attempts = default_attempts(tasks) if attempts is None else list(attempts)
    if len(attempts) != len(tasks):
        raise ValueError(f"rollout: {len(attempts)} attempts for {len(tasks)} tasks")
    ids = plan_episode_ids(tasks, phase=phase, purpose=purpose, seed=seed, policy_digest=policy_digest,
                           settings_digest=settings_digest, attempts=attempts)
    node = node or socket.gethostname()
    jobs: asyncio.Queue = asyncio.Queue()
    for task, attempt, eid in zip(tasks, attempts, ids):
        jobs.put_nowait((task, attempt, eid))
    n_workers = max(1, min(n_envs, len(tasks)))
    own_pool = pool is None
    pool = pool or BrowserPool(cfg)
    await pool.start()
    batched = getattr(policy, "batched", True)
    batcher = _Batcher(policy, cfg.batch_wait_s if batched else 0.0, cfg.batch_wait_calls if batched else 0.0)
    episodes: list[dict] = []
    bar = _Progress(len(tasks), progress)

    async def worker(slot: int) -> None:
        env = WebEnv(pool, cfg, hooks, slot=slot, judge=judge)
        batcher.enter()
        try:
            while not jobs.empty():
                task, attempt, eid = jobs.get_nowait()
                ep = await _episode_with_retries(env, task, eid)
                end_episode = getattr(hooks, "end_episode", None)  # e.g. drop the episode's site DB copies
                if end_episode is not None:
                    end_episode(ep.episode_id)
                episodes.append(ep.to_record())
                if store is not None:
                    store.write_episode(ep.columns(), ep.steps)
                bar.advance(ep, batcher.batch_sizes if batched else None, n_workers)
        finally:
            batcher.leave()
            await env.close()

    async def _episode_with_retries(env: WebEnv, task: dict, eid: str) -> Episode:
        """Run ``task`` until one try ends (a crash or hang retries it on a fresh context) and build its
        ``Episode``: from that try, or with ``status="error"`` when every try failed."""
        error = None
        ending: _Ending | None = None
        started = time.time()
        t0 = time.perf_counter()
        steps: list[dict] = []
        timing = {"policy_s": 0.0, "env_s": 0.0}
        for _try in range(cfg.episode_retries + 1):
            steps, timing = [], {"policy_s": 0.0, "env_s": 0.0}
            try:
                ending = await _run_episode(env, task, eid, batcher, cfg, steps, timing, screenshot_dir,
                                            prompt_compat)
            except PolicyError:
                raise
            except Exception as e:  # crash, hang or a bug in the site: retry on a fresh context
                crashed = isinstance(e, (EnvCrash, asyncio.TimeoutError)) or is_crash(e)
                error = f"{'crash' if crashed else 'error'} on try {_try + 1}: {type(e).__name__}: {e}"
                error += "\n" + "".join(traceback.format_exception(e)[-3:])
                await env.close()
                continue
            if steps:
                steps[-1]["reward"] = float(ending.env_score or 0.0)
            break
        if ending is None:  # every try failed: stored as an error, never scored
            ending = _Ending("error", None, None, "", None)
            retries = cfg.episode_retries
        else:
            error, retries = None, _try
        score = ending.env_score
        return Episode(
            episode_id=eid, task_id=str(task["task_id"]), phase=phase, policy_id=policy_id, purpose=purpose,
            intent=ending.intent or task.get("intent", ""), site="+".join(task.get("sites") or []), seed=seed,
            task_digest=identity.task_digest(task), policy_digest=policy_digest, settings_digest=settings_digest,
            node=node, status=ending.status, final_answer=ending.final_answer, env_score=score,
            final_page=ending.page, orm_score=None, success=None if score is None else is_success(score),
            n_steps=len(steps), started_at=started, wall_s=time.perf_counter() - t0, policy_s=timing["policy_s"],
            env_s=timing["env_s"], error=error, retries=retries, steps=steps)

    dispatcher = asyncio.create_task(batcher.run())
    try:
        await asyncio.gather(*(worker(i) for i in range(n_workers)))
    finally:
        batcher.close()
        await dispatcher
        bar.close()
        if own_pool:
            await pool.close()
    return episodes  # in finishing order


_EPISODE_KEYS = EPISODE_COLUMNS  # the stored episode columns (former name, kept importable)


class _Progress:
    def __init__(self, total: int, enabled: bool) -> None:
        self.bar = None
        self.ok = self.done = 0
        if enabled:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
            self.bar = Progress(TextColumn("[bold]rollout"), BarColumn(), MofNCompleteColumn(),
                                TextColumn("{task.description}"), TimeElapsedColumn(), transient=False)
            self.bar.start()
            self.task = self.bar.add_task("", total=total)

    def advance(self, ep: Episode, batch_sizes: list[int] | None = None, n_envs: int = 1) -> None:
        self.done += 1
        self.ok += bool(ep.success)
        if self.bar is not None:
            text = f"success {self.ok}/{self.done}"
            if batch_sizes:  # well under n_envs: the envs are not waiting on one call together
                text += f", policy batch {sum(batch_sizes) / len(batch_sizes):.1f} of {n_envs}"
            self.bar.update(self.task, advance=1, description=text)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


def run_rollout(tasks: list[dict], policy, n_envs: int, *, prompt_compat: str | PromptFormat = "webrl",
                **kwargs) -> list[dict]:
    """Synchronous wrapper of ``rollout`` (starts its own event loop)."""
    return asyncio.run(rollout(tasks, policy, n_envs, prompt_compat=prompt_compat, **kwargs))

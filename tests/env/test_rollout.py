"""The rollout engine on MiniWoB++ with real Chromium: batching, store writes, deterministic ids, crash recovery."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from conftest import small_cfg
from webrl_core.env.browser import browser_main_pids
from webrl_core.env.miniwob import MiniWoBHooks, MiniWoBOracle, miniwob_tasks
from webrl_core import identity
from webrl_core.env.rollout import _Batcher, plan_episode_ids, rollout
from webrl_core.runs.store import TrajectoryStore
from test_episode import ERROR_KEYS, SUCCESS_KEYS


class RecordingOracle(MiniWoBOracle):
    """The MiniWoB oracle that records the size of every batch it is given, batched like a model policy."""

    batched = True

    def __init__(self) -> None:
        self.batches: list[int] = []

    async def act(self, prompts, contexts=None):
        self.batches.append(len(prompts))
        assert all(p.startswith("Task Instruction: ") for p in prompts)
        return await super().act(prompts, contexts)


class KillOnce(MiniWoBOracle):
    """Kills every Chromium of this process the first time it sees ``victim``'s first step."""

    def __init__(self, victim: str) -> None:
        self.victim, self.killed = victim, 0

    async def act(self, prompts, contexts=None):
        for c in contexts:
            if not self.killed and c.task["task_id"] == self.victim and c.step == 0:
                for pid in browser_main_pids():
                    os.kill(pid, signal.SIGKILL)
                    self.killed += 1
        return await super().act(prompts, contexts)


def test_batching_store_and_idempotent_ids(aloop, miniwob_server, tmp_path):
    store = TrajectoryStore(tmp_path / "run")
    tasks = miniwob_tasks(["click-button", "enter-text"], 3, seed=7)
    pol = RecordingOracle()
    cfg = small_cfg(batch_wait_s=5.0)  # wait for every env: batches are as full as possible
    eps = aloop.run(rollout(tasks, pol, 3, cfg=cfg, hooks=MiniWoBHooks(miniwob_server), store=store, phase=2,
                            purpose="eval", seed=7, progress=False))
    assert len(eps) == 6 and all(e["success"] for e in eps)
    assert all(list(e) == SUCCESS_KEYS for e in eps)  # the dict layout stages, store and ray_rollout read
    n_steps = sum(e["n_steps"] for e in eps)
    assert sum(pol.batches) == n_steps and max(pol.batches) == 3  # one call serves every waiting env
    assert len(pol.batches) < n_steps
    expected = plan_episode_ids(tasks, phase=2, purpose="eval", seed=7, policy_digest=pol.policy_id,
                                settings_digest=identity.settings_digest(cfg))
    assert sorted(e["episode_id"] for e in eps) == sorted(expected)
    for e in eps:
        assert e["policy_digest"] == pol.policy_id and e["task_digest"] and e["node"]
        assert e["steps"][-1]["done"] and e["steps"][-1]["reward"] == 1.0 and e["env_score"] == 1.0
        assert all(s["prompt"].endswith("<|end_header_id|>\n") for s in e["steps"])
        assert e["policy_s"] >= 0 and e["env_s"] > 0 and e["intent"]
    stored = store.episodes(phase=2)
    assert sorted(r["episode_id"] for r in stored) == sorted(e["episode_id"] for e in eps)
    assert len(store.steps(phase=2)) == n_steps
    # a re-run writes the same ids: nothing is duplicated
    aloop.run(rollout(tasks, MiniWoBOracle(), 2, cfg=cfg, hooks=MiniWoBHooks(miniwob_server), store=store,
                      phase=2, purpose="eval", seed=7, progress=False))
    assert len(store.episodes(phase=2)) == 6
    # the same task twice = two attempts with distinct ids
    twice = [tasks[0], tasks[0]]
    eps2 = aloop.run(rollout(twice, MiniWoBOracle(), 2, cfg=cfg, hooks=MiniWoBHooks(miniwob_server),
                             progress=False))
    assert len({e["episode_id"] for e in eps2}) == 2
    # another policy identity or another env setting: new episodes, the stored ones stay as they were
    aloop.run(rollout(tasks[:2], MiniWoBOracle(), 2, cfg=cfg, hooks=MiniWoBHooks(miniwob_server), store=store,
                      phase=2, purpose="eval", seed=7, policy_digest="hf:other", progress=False))
    aloop.run(rollout(tasks[:2], MiniWoBOracle(), 2, cfg=small_cfg(batch_wait_s=5.0, max_steps=7), store=store,
                      hooks=MiniWoBHooks(miniwob_server), phase=2, purpose="eval", seed=7, progress=False))
    rows = store.episodes(phase=2)
    assert len(rows) == 10
    assert sorted(r["policy_digest"] for r in rows).count("hf:other") == 2


def test_browser_crash_is_retried(aloop, miniwob_server, tmp_path):
    tasks = miniwob_tasks(["click-button"], 3, seed=11)
    pol = KillOnce(tasks[1]["task_id"])
    cfg = small_cfg(episode_retries=1)
    eps = aloop.run(rollout(tasks, pol, 1, cfg=cfg, hooks=MiniWoBHooks(miniwob_server), progress=False))
    assert pol.killed >= 1
    by_id = {e["task_id"]: e for e in eps}
    assert len(eps) == 3 and all(e["status"] == "done" and e["success"] for e in eps)
    assert by_id[tasks[1]["task_id"]]["retries"] == 1 and by_id[tasks[0]["task_id"]]["retries"] == 0


def test_browser_crash_without_retries_is_stored_as_error(aloop, miniwob_server, tmp_path):
    store = TrajectoryStore(tmp_path / "run")
    tasks = miniwob_tasks(["click-button"], 2, seed=12)
    pol = KillOnce(tasks[0]["task_id"])
    eps = aloop.run(rollout(tasks, pol, 1, cfg=small_cfg(episode_retries=0), hooks=MiniWoBHooks(miniwob_server),
                            store=store, progress=False))
    by_id = {e["task_id"]: e for e in eps}
    bad = by_id[tasks[0]["task_id"]]
    assert bad["status"] == "error" and bad["env_score"] is None and bad["success"] is None
    assert list(bad) == ERROR_KEYS and bad["retries"] == 0 and bad["final_answer"] is None
    assert "crash" in bad["error"]
    assert by_id[tasks[1]["task_id"]]["status"] == "done"  # the next episode runs on a relaunched browser
    rows = {r["episode_id"]: r for r in store.episodes()}
    assert rows[bad["episode_id"]]["status"] == "error" and "crash" in rows[bad["episode_id"]]["error"]


class PromptRecorder(MiniWoBOracle):
    """The MiniWoB oracle that keeps every (prompt, context) it is given."""

    batched = True

    def __init__(self) -> None:
        self.seen = []

    async def act(self, prompts, contexts=None):
        self.seen += list(zip(prompts, contexts))
        return await super().act(prompts, contexts)


def test_prompt_compat_official_builds_official_prompts(aloop, miniwob_server):
    from webrl_core.prompts import build_prompt

    tasks = miniwob_tasks(["click-button"], 2, seed=5)
    cfg = small_cfg(obs_char_budget=256)  # small: the official and our cut rules give different prompts
    pol = PromptRecorder()
    eps = aloop.run(rollout(tasks, pol, 2, cfg=cfg, hooks=MiniWoBHooks(miniwob_server), progress=False,
                            prompt_compat="official"))
    assert len(eps) == 2 and all(e["success"] for e in eps) and pol.seen
    for prompt, c in pol.seen:
        assert prompt == build_prompt(c.task["intent"], c.past_responses, c.html, 256, compat="official")
    assert any(p != build_prompt(c.task["intent"], c.past_responses, c.html, 256) for p, c in pol.seen)
    stored = [s["prompt"] for e in eps for s in e["steps"]]
    assert sorted(stored) == sorted(p for p, _ in pol.seen)
    # other prompts, other episodes: the default format's ids are not reused
    default_ids = plan_episode_ids(tasks, phase=0, purpose="rollout", seed=0, policy_digest=pol.policy_id,
                                   settings_digest=identity.settings_digest(cfg))
    assert not {e["episode_id"] for e in eps} & set(default_ids)


class SlowPolicy:
    """A batched policy whose every call takes ``call_s``; records its batch sizes."""

    batched = True

    def __init__(self, call_s: float) -> None:
        self.call_s, self.batches = call_s, []

    async def act(self, prompts, contexts=None):
        self.batches.append(len(prompts))
        await asyncio.sleep(self.call_s)
        return ["ok"] * len(prompts)


def test_two_half_batches_do_not_alternate(aloop):
    """Four workers, two of them 0.2 s late at the start: while the first pair's call runs the late pair arrives and
    waits. When the call returns, that pair has waited longer than the hold (0.5 x 0.4 s), but the time it waited
    was the policy's, not an idle policy's: it is held for the first pair's 0.05 s step, and from then on every call
    serves all four (counting the call's time, the pairs alternated: 2, 2, 2, ...)."""
    pol = SlowPolicy(0.4)
    batcher = _Batcher(pol, 0.02, 0.5)

    async def worker(start_s: float) -> None:
        await asyncio.sleep(start_s)
        batcher.enter()
        try:
            for _ in range(4):
                await asyncio.sleep(0.05)  # the env's step
                assert await batcher.request("prompt", None) == "ok"
        finally:
            batcher.leave()

    async def main():
        dispatcher = asyncio.create_task(batcher.run())
        await asyncio.gather(worker(0.0), worker(0.0), worker(0.2), worker(0.2))
        batcher.close()
        await dispatcher

    aloop.run(main())
    assert pol.batches[:4] == [2, 4, 4, 4] and sum(pol.batches) == 16, pol.batches


@pytest.mark.parametrize("wait_calls", [0.0, 2.0])
def test_a_slow_policy_holds_its_batch_for_a_straggler(aloop, wait_calls):
    """Two workers, 4 actions each: one asks at once, the other after 0.1 s of browser work. With the base wait
    alone (0.02 s) the slower one misses every other call (1, 2, 1, 2, 1, 1). Holding for up to two calls' seconds
    (0.6 s, known after the first call; a wide margin on a loaded box) serves both together from the second call."""
    pol = SlowPolicy(0.3)
    batcher = _Batcher(pol, 0.02, wait_calls)

    async def worker(env_s: float) -> None:
        batcher.enter()
        try:
            for _ in range(4):
                await asyncio.sleep(env_s)  # the env's step
                assert await batcher.request("prompt", None) == "ok"
        finally:
            batcher.leave()

    async def main():
        dispatcher = asyncio.create_task(batcher.run())
        await asyncio.gather(worker(0.0), worker(0.1))
        batcher.close()
        await dispatcher

    aloop.run(main())
    if wait_calls:
        assert pol.batches[0] == 1 and pol.batches[1:4] == [2, 2, 2] and sum(pol.batches) == 8, pol.batches
    else:
        assert pol.batches.count(1) >= 3 and sum(pol.batches) == 8, pol.batches

"""``Episode``: the one shape of a finished episode; its record and stored row keep the dict layout callers read."""

from __future__ import annotations

from webrl_core.env.episode import EPISODE_COLUMNS, Episode, FinalPage
from webrl_core.env.rollout import _EPISODE_KEYS

IDENTITY = dict(episode_id="e", task_id="t", phase=1, policy_id="p", purpose="eval", intent="do it", site="a+b",
                seed=3, task_digest="td", policy_digest="pd", settings_digest="sd", node="host")
COST = dict(n_steps=2, started_at=1.0, wall_s=2.0, policy_s=0.5, env_s=1.0)

SUCCESS_KEYS = ["episode_id", "task_id", "phase", "policy_id", "purpose", "intent", "site", "seed", "task_digest",
                "policy_digest", "settings_digest", "node", "status", "final_answer", "env_score", "final_html",
                "final_url", "blocked_urls", "site_state", "orm_score", "success", "n_steps", "started_at",
                "wall_s", "policy_s", "env_s", "error", "retries", "steps"]
ERROR_KEYS = [k for k in SUCCESS_KEYS if k not in ("final_html", "final_url", "blocked_urls", "site_state")]
STORED = {"episode_id", "task_id", "phase", "policy_id", "purpose", "status", "final_answer", "env_score",
          "orm_score", "success", "n_steps", "started_at", "wall_s", "policy_s", "env_s", "error", "intent", "site",
          "seed", "task_digest", "policy_digest", "settings_digest", "node"}


def test_columns_are_the_stored_episode_keys():
    assert set(EPISODE_COLUMNS) == STORED and len(EPISODE_COLUMNS) == len(STORED)
    assert _EPISODE_KEYS == EPISODE_COLUMNS  # the former name stays importable


def test_success_record_and_row():
    steps = [{"idx": 0}, {"idx": 1}]
    page = FinalPage("<body/>", "http://x/", ["http://evil/"], {"done": True})
    ep = Episode(**IDENTITY, status="done", final_answer="42", env_score=1.0, final_page=page, orm_score=None,
                 success=True, **COST, error=None, retries=1, steps=steps)
    rec = ep.to_record()
    assert list(rec) == SUCCESS_KEYS
    assert rec["final_html"] == "<body/>" and rec["final_url"] == "http://x/" and rec["steps"] is steps
    assert rec["blocked_urls"] == ["http://evil/"] and rec["site_state"] == {"done": True} and rec["retries"] == 1
    row = ep.columns()
    assert list(row) == [k for k in rec if k in STORED]  # the order the old key filter gave
    assert row == {k: rec[k] for k in STORED}


def test_error_record_has_no_final_page():
    ep = Episode(**IDENTITY, status="error", final_answer=None, env_score=None, final_page=None, orm_score=None,
                 success=None, **COST, error="crash on try 1: ...", retries=0, steps=[])
    rec = ep.to_record()
    assert list(rec) == ERROR_KEYS
    assert rec["status"] == "error" and rec["env_score"] is None and rec["error"].startswith("crash")


def test_outcome_counts_errors_and_unscored_apart():
    from webrl_core.env.episode import OUTCOMES, outcome

    assert outcome("error", None) == "error"
    assert outcome("done", None) == "unscored"  # the task needed an LLM judge and none was configured
    assert outcome("done", 1.0) == "success" and outcome("early_stop", 0.0) == "failed"
    assert outcome("max_steps", 1.0) == "success" and set(OUTCOMES) == {"success", "failed", "unscored", "error"}
    ep = Episode(**IDENTITY, status="done", final_answer="4.2 km", env_score=None, final_page=None, orm_score=None,
                 success=None, **COST, error=None, retries=0, steps=[])
    assert outcome(ep.status, ep.env_score) == "unscored" and ep.columns()["env_score"] is None

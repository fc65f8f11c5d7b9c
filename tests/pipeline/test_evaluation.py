"""The evaluation stage counts unscored episodes (a task that needs the LLM judge, and ``eval.judge`` is empty)
apart from solved / failed / errored ones, says when the deterministic fallback scored fuzzy tasks
(``eval.judge: none``), and the run summary says both, naming ``eval.judge``.

The stage runs for real (store, result file, metrics, report); only its rollout is a scripted agent: each test task
is answered with a fixed message and scored by the real WebArena evaluators with the judge ``eval.judge`` gives
(``judge_from_settings``), an LLM judge being a real HTTP endpoint on 127.0.0.1."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import sys
import threading
import time
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest

from webrl_core.runs import report
from webrl_core.artifacts import write_json
from webrl_core.config_loader import load_config
from webrl_core.env.episode import Episode
from webrl_core.env.evaluators import evaluate_task
from webrl_core.env.judge import judge_from_settings
from webrl_core.pipeline import evaluation, experience
from webrl_core.runs.store import TrajectoryStore

NA_NOTE = "the store has no refund policy page"
TASKS = [  # (task id, site, eval spec, the agent's answer)
    ("fz-ok", "map", {"reference_answers": {"fuzzy_match": ["4.2 km", "17 min"]}}, "It is 4.2 km, about 17 min"),
    ("fz-bad", "map", {"reference_answers": {"fuzzy_match": ["4.2 km", "17 min"]}}, "It is 5 km"),
    ("na", "shopping", {"reference_answers": {"fuzzy_match": "N/A"}, "string_note": NA_NOTE},
     "N/A: there is no refund policy page"),
    ("ex-ok", "shopping", {"reference_answers": {"exact_match": "Yes"}}, "yes"),
    ("ex-bad", "gitlab", {"reference_answers": {"exact_match": "Yes"}}, "no"),
]
ANSWERS = {tid: answer for tid, _, _, answer in TASKS}


def _tasks() -> list[dict]:
    return [{"task_id": tid, "sites": [site], "intent": "How far by bike?", "start_url": "__MAP__",
             "eval": {"eval_types": ["string_match"], **spec}} for tid, site, spec, _ in TASKS]


def scripted_rollout(settings, run_dir, phase, purpose, tasks_ref, actor_ref, temperature, shard=0, n_shards=1):
    """The rollout stage's contract (episodes stored, ids and policy digest returned) with a scripted agent: each
    task's fixed answer, scored by the evaluators with the judge eval.judge configures."""
    from webrl_core.artifacts import read_json

    judge = judge_from_settings(settings)
    store, ids = TrajectoryStore(run_dir), []
    for t in read_json(tasks_ref):
        res = asyncio.run(evaluate_task(t, None, ANSWERS[t["task_id"]], judge=judge))
        eid = f"{purpose}-p{phase}-{t['task_id']}"
        ep = Episode(episode_id=eid, task_id=t["task_id"], phase=phase, policy_id="scripted", purpose=purpose,
                     intent=t["intent"], site="+".join(t["sites"]), seed=0, task_digest="td", policy_digest="scripted",
                     settings_digest="sd", node="test", status="done", final_answer=ANSWERS[t["task_id"]],
                     env_score=res.score, final_page=None, orm_score=None,
                     success=None if res.score is None else res.score >= 1.0, n_steps=1, started_at=time.time(),
                     wall_s=0.1, policy_s=0.0, env_s=0.1, error=None, retries=0, steps=[])
        store.write_episode(ep.columns(), [])
        ids.append(eid)
    return {"episode_ids": ids, "policy_digest": "scripted"}


@pytest.fixture
def judge_url():
    """The real OpenAI-compatible judge of tests/env/test_evaluators.py (VAB's prompts, fixed rules)."""
    mod = sys.modules.get("test_evaluators")
    if mod is None:
        path = Path(__file__).resolve().parents[1] / "env" / "test_evaluators.py"
        spec = importlib.util.spec_from_file_location("test_evaluators", path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules["test_evaluators"] = mod
        spec.loader.exec_module(mod)
    handler = mod.JudgeHandler
    handler.requests.clear()
    handler.fail, handler.reply = False, None
    srv = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}/v1"
    srv.shutdown()
    srv.server_close()


def _evaluate(tmp_path, monkeypatch, judge_setting: str):
    monkeypatch.setattr(experience, "rollout", scripted_rollout)
    run_dir = tmp_path / "run"
    settings = load_config("smoke", sets=[f"eval.judge={judge_setting}", "eval.judge_model=judge-mini"])
    test_ref = write_json(_tasks(), tmp_path / "test.json")
    ref, metrics = evaluation.evaluate(settings, str(run_dir), 1, None, test_ref)
    return run_dir, json.loads(Path(ref.path).read_text()), metrics


def test_no_judge_reports_fuzzy_tasks_unscored_not_failed(tmp_path, monkeypatch):
    run_dir, result, metrics = _evaluate(tmp_path, monkeypatch, "''")
    assert result["total"] == {"n": 5, "success": 1, "failed": 1, "unscored": 3, "errors": 0}
    assert result["sites"]["map"] == {"n": 2, "success": 0, "failed": 0, "unscored": 2, "errors": 0}
    assert result["success_rate"] == 0.5  # solved / (solved + failed)
    assert result["judge"].startswith("not configured") and "judge_fallback" not in result
    assert metrics["test_unscored"] == 3.0 and metrics["test_failed"] == 1.0 and metrics["test_solved"] == 1.0
    assert metrics["test_success_rate"] == 0.5 and metrics["test_success_map"] == 0.0
    [row] = report.results_table(run_dir)
    assert (row["solved"], row["failed"], row["unscored"], row["errored"], row["avg"]) == (1, 1, 3, 0, 0.5)
    assert row["map"] is None  # nothing scored on the map
    summary = report.write_summary(run_dir).read_text()
    assert "| 1 / 1 / 3 / 0 |" in summary and "solved / failed / unscored / errored" in summary
    assert "3 test episode(s) were unscored because no LLM judge is configured" in summary
    assert "eval.judge" in summary and "deterministic fallback, not an LLM judge" not in summary
    assert any("3 test episode(s) were unscored" in w and "eval.judge" in w for w in report.phase_warnings(metrics))


def test_judge_none_scores_by_the_fallback_and_says_so(tmp_path, monkeypatch):
    run_dir, result, metrics = _evaluate(tmp_path, monkeypatch, "none")
    assert result["total"] == {"n": 5, "success": 3, "failed": 2, "unscored": 0, "errors": 0}
    assert result["judge"] == "none (deterministic fallback)" and result["judge_fallback"] == 3
    assert metrics["test_judge_fallback"] == 3.0 and metrics["test_unscored"] == 0.0
    summary = report.write_summary(run_dir).read_text()
    assert ("3 test episode(s) of fuzzy tasks were scored by the deterministic fallback, not an LLM judge, because "
            "eval.judge is none") in summary
    assert "unscored because" not in summary
    assert any("deterministic fallback" in w for w in report.phase_warnings(metrics))


def test_a_configured_judge_scores_fuzzy_tasks_by_its_verdict(tmp_path, monkeypatch, judge_url):
    run_dir, result, metrics = _evaluate(tmp_path, monkeypatch, judge_url)
    episodes = {e["task_id"]: e["env_score"] for e in TrajectoryStore(run_dir).episodes()}
    assert episodes == {"fz-ok": 1.0, "fz-bad": 0.0, "na": 1.0, "ex-ok": 1.0, "ex-bad": 0.0}
    assert result["total"] == {"n": 5, "success": 3, "failed": 2, "unscored": 0, "errors": 0}
    assert result["judge"] == f"judge-mini at {judge_url}" and result["judge_tasks"] == 3
    assert "judge_fallback" not in result and "test_judge_fallback" not in metrics
    summary = report.write_summary(run_dir).read_text()
    assert "unscored because" not in summary and "deterministic fallback" not in summary


def test_old_eval_files_without_unscored_still_read():
    row = report._row("old", 1, {"sites": {"map": {"n": 3, "success": 1, "errors": 1}},
                                 "total": {"n": 3, "success": 1, "errors": 1}})
    assert (row["solved"], row["failed"], row["unscored"], row["errored"], row["map"]) == (1, 1, 0, 1, 0.5)
    assert report.judge_notes(row) == []

"""`webrl bench temperature`: an actor's task success on validation tasks at each sampling temperature."""

import json

from typer.testing import CliRunner

from webrl_cli.main import app
from webrl_core.errors import MissingInput
from webrl_core.pretrained import resolve_model_ref
from webrl_core.runs.store import TrajectoryStore

SETS = ["models.actor=smollm2-135m-instruct", "models.max_length=640", "prompt.style=chat",
        "prompt.observation=compact", "policy.max_new_tokens=24", "env.max_steps=2", "env.n_envs=2"]


def _actions(store, ids):
    """{episode id: (task id, its responses in order)}."""
    rows = store.sql("SELECT e.episode_id, e.task_id, s.idx, s.response FROM episodes e JOIN steps s "
                     "USING (episode_id) WHERE e.episode_id IN (SELECT unnest($ids)) ORDER BY s.idx", {"ids": ids})
    out = {}
    for r in rows:
        out.setdefault(r["episode_id"], (r["task_id"], []))[1].append(r["response"])
    return out


def test_sweep_keys_episodes_by_temperature_and_reuses_them(tmp_path):
    """Each temperature rolls out every task ``samples`` times as its own episodes; greedy samples of one task
    act identically; a second call reuses the stored episodes; a folder without a model is refused by name."""
    smollm = resolve_model_ref("smollm2-135m-instruct")
    bench, out = tmp_path / "bench", tmp_path / "temp"
    args = ["bench", "temperature", "--model", str(smollm), "--temperatures", "0,1", "--samples", "2",
            "--config", "smoke", "--demos", "2", "--val-tasks", "2", "--run-dir", str(bench), "--out", str(out),
            *[a for s in SETS for a in ("--set", s)]]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    r = json.loads(out.with_suffix(".json").read_text())
    assert [row["temperature"] for row in r["rows"]] == [0.0, 1.0]
    for row in r["rows"]:
        assert row["episodes"] == 4 and row["tasks"] == 2 and 0 <= row["solved"] <= 4
        assert row["solve_rate"] == round(row["solved"] / 4, 4) and row["solved_sometimes"] is not None
    greedy, hot = (row["episode_ids"] for row in r["rows"])
    assert len(set(greedy) | set(hot)) == 8
    store = TrajectoryStore(bench)
    by_task = {}
    for task, acts in _actions(store, greedy).values():
        by_task.setdefault(task, []).append(acts)
    assert len(by_task) == 2 and all(len(v) == 2 and v[0] == v[1] for v in by_task.values())

    n_stored = store.sql("SELECT count(*) AS n FROM episodes")[0]["n"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    again = json.loads(out.with_suffix(".json").read_text())["rows"]
    assert store.sql("SELECT count(*) AS n FROM episodes")[0]["n"] == n_stored
    assert [row["episode_ids"] for row in again] == [greedy, hot]
    assert out.with_suffix(".png").stat().st_size > 0

    res = CliRunner().invoke(app, [*args[:2], "--model", str(tmp_path), *args[4:]])
    assert isinstance(res.exception, MissingInput) and "no config.json" in str(res.exception)

"""`webrl bench sft` on the smoke config: real oracle demos, a real SFT, real greedy rollouts on validation tasks."""

import json

from typer.testing import CliRunner

from webrl_cli.main import app
from webrl_core.store import TrajectoryStore


def test_bench_sft_measures_on_validation_tasks_unlike_the_demos(tmp_path):
    out = tmp_path / "sft.json"
    res = CliRunner().invoke(app, ["bench", "sft", "--config", "smoke", "--demos", "6", "--val-tasks", "4",
                                   "--run-dir", str(tmp_path / "run"), "--out", str(out)])
    assert res.exit_code == 0, res.output
    r = json.loads(out.read_text())
    assert r["demos"] == 6 and r["oracle_solved"] == 6 and r["sft_pairs"] >= 6
    assert r["val_n"] == 4 and r["val_errors"] == 0 and 0 <= r["val_solved"] <= 4
    assert r["sft_tokens"] > 0 and r["sft_tokens_per_s"] > 0 and r["params"] > 0
    assert 0 <= r["invalid_share"] <= 1 and 0 <= r["arg_from_intent"] <= 1 and r["val_steps"] >= 4
    store = TrajectoryStore(tmp_path / "run")
    demo = {e["intent"] for e in store.sql("SELECT intent FROM episodes WHERE purpose='oracle'")}
    val = {e["intent"] for e in store.sql("SELECT intent FROM episodes WHERE purpose='eval'")}
    assert len(val) == 4 and not demo & val  # the validation split never repeats a demonstrated task

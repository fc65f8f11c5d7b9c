"""`webrl bench sft` on the smoke config: real oracle demos, a real SFT, real greedy rollouts on validation tasks."""

import json

from typer.testing import CliRunner

from webrl_cli.main import app
from webrl_core.runs.store import TrajectoryStore


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


def test_bench_sft_with_the_copy_levers(tmp_path):
    """Entity names as whole tokens, tied embeddings, entity-swapped SFT passes and the restated intent run through
    the real bootstrap stages: the tokenizer holds the names, each epoch is its own pass, the rollouts' prompts
    repeat the intent before the action."""
    from webrl_core.learn.models import load_tokenizer
    from webrl_core.sites.data import entity_names

    out = tmp_path / "sft.json"
    sets = ["models.embedded.entity_tokens=true", "models.embedded.tie_embeddings=true",
            "bootstrap.sft_entity_swap=1.0", "prompt.compat=webrl_restated"]
    res = CliRunner().invoke(app, ["bench", "sft", "--config", "smoke", "--demos", "6", "--val-tasks", "2",
                                   "--run-dir", str(tmp_path / "run"), "--out", str(out),
                                   *[a for s in sets for a in ("--set", s)]])
    assert res.exit_code == 0, res.output
    r = json.loads(out.read_text())
    store = TrajectoryStore(tmp_path / "run")
    demo_steps = store.sql("SELECT count(*) AS n FROM steps JOIN episodes USING (episode_id) "
                           "WHERE purpose='oracle'")[0]["n"]
    assert r["sft_pairs"] == 2 * demo_steps  # smoke: 2 epochs -> 2 swapped passes of one epoch's worth
    tok = load_tokenizer(r["actor"])
    names = entity_names(0)
    assert all(len(tok.encode(n, add_special_tokens=False)) == 1 for n in names[::50])
    rows = store.sql("SELECT e.intent, s.prompt FROM steps s JOIN episodes e USING (episode_id) "
                     "WHERE e.purpose='eval'")
    assert rows and all(r["prompt"].split("Task Instruction: ")[-1].startswith(r["intent"]) for r in rows)

"""`webrl bench sft-curve`: the learning curve of a real SmolLM2 SFT on the smoke sites, and its step marks."""

import json

from typer.testing import CliRunner

from webrl_cli.main import app
from benchmarks.sft_curve import score, summarise

CLICK = '# Element: Members\ndo(action="Click", element="8")'
TYPE = '# Element: Username\ndo(action="Type", argument="vinta", element="9")'


def test_marks_compare_the_action_not_the_comment():
    assert score('# Element: anything\ndo(action="Click", element="8")', CLICK) == \
        {"exact": True, "well_formed": True, "element": True, "typed_args": None, "stops": None, "grounding": None}
    assert score('do(action="Type", argument="vint", element="9")', TYPE) == \
        {"exact": False, "well_formed": True, "element": True, "typed_args": False, "stops": None, "grounding": None}
    assert score('do(action="Click", element="Driftwood", element="Driftwood"', CLICK) == \
        {"exact": False, "well_formed": False, "element": False, "typed_args": None, "stops": None, "grounding": None}
    # grounding: the id, where the response names the oracle's element (a right name with a neighbour's id fails)
    assert score('# Element: members\ndo(action="Click", element="7")', CLICK)["grounding"] is False
    assert score('# Element: Members\ndo(action="Click", element="8")', CLICK)["grounding"] is True
    assert score('exit(message="Done")', '# Note: done\nexit(message="Done")')["exact"]
    # stops: an exit where the oracle exits, whatever the answer; acting on instead fails
    price = '# Note: the page shows $3.99\nexit(message="$3.99")'
    assert score('exit(message="$4.99")', price)["stops"] is True and not score('exit(message="$4.99")', price)["exact"]
    assert score('# Element: Add to Cart\ndo(action="Click", element="8")', price)["stops"] is False
    s = summarise([score(CLICK, CLICK), score(CLICK, TYPE)])
    assert s["exact"] == 0.5 and s["typed_args"] == 0.0 and s["typed_args_n"] == 1 and s["well_formed"] == 1.0
    assert s["grounding"] == 1.0 and s["grounding_n"] == 1  # the Click named Members; the Type answer did not


def test_curve_of_a_pretrained_sft_on_validation_steps(tmp_path):
    """Two demonstrations seen twice, entity-swapped, two validation tasks: points at step 0, every 2 steps and the
    end, each scored on the validation steps in the chat/compact format, written as they are measured; the prompts
    fit the budget; the trained actor is confirmed by a greedy rollout on a validation task."""
    out = tmp_path / "curve"
    sets = ["models.actor=smollm2-135m-instruct", "models.train_layers=1", "models.max_length=640",
            "prompt.style=chat", "prompt.observation=compact", "bootstrap.sft_epochs=2", "actor.batch_size=2",
            "bootstrap.sft_entity_swap=1.0",  # two entity-swapped passes, as the bootstrap's SFT makes them
            "policy.max_new_tokens=24"]
    res = CliRunner().invoke(app, ["bench", "sft-curve", "--config", "smoke", "--demos", "2", "--val-tasks", "2",
                                   "--val-steps", "3", "--every", "2", "--val-rollouts", "1", "--run-dir", str(tmp_path / "run"),
                                   "--out", str(out), *[a for s in sets for a in ("--set", s)]])
    assert res.exit_code == 0, res.output
    r = json.loads(out.with_suffix(".json").read_text())
    points = [json.loads(line) for line in out.with_suffix(".jsonl").read_text().splitlines()]
    assert points == r["points"] and points[0]["step"] == 0 and points[0]["pairs"] == 0
    assert [p["step"] for p in points[1:-1]] == list(range(2, points[-1]["step"], 2))
    assert points[-1]["tokens"] > 0 and points[-1]["tokens_per_s"] > 0
    assert r["entity_swap"] == 1.0 and points[-1]["epochs"] == 2.0  # epochs over the demonstrations' pairs
    for p in points:
        assert all(0 <= p[k] <= 1 for k in ("exact", "well_formed")) and p["exact_n"] == 3
    assert r["prompt_format"].startswith("webrl/chat/compact/") and r["max_prompt_tokens"] <= 640
    assert out.with_suffix(".png").stat().st_size > 0 and " cores, " in r["device"]
    assert r["val_tasks"] == 1 and r["val_errors"] == 0 and r["val_tasks_solved"] in (0, 1)  # task success too


def test_curve_from_an_exported_folder(tmp_path):
    """The export holds the demonstrations' pairs (each with its demonstration's index) and the validation steps in
    the chat/compact format; `--folder` trains on the first --demos demonstrations only, without the run dir, and a
    training budget stops it early with the last point measured; a folder missing a file is named."""
    folder, out = tmp_path / "folder", tmp_path / "curve"
    sets = ["models.actor=smollm2-135m-instruct", "models.train_layers=1", "models.max_length=640",
            "prompt.style=chat", "prompt.observation=compact", "actor.batch_size=1", "policy.max_new_tokens=24"]
    flags = [a for s in sets for a in ("--set", s)]
    res = CliRunner().invoke(app, ["bench", "sft-curve-export", "--config", "smoke", "--demos", "2", "--val-tasks", "2",
                                   "--val-steps", "3", "--run-dir", str(tmp_path / "run"), "--out", str(folder),
                                   *flags])
    assert res.exit_code == 0, res.output
    rows = [json.loads(line) for line in (folder / "train_pairs.jsonl").read_text().splitlines()]
    val = [json.loads(line) for line in (folder / "val_steps.jsonl").read_text().splitlines()]
    assert {r["demo"] for r in rows} == {0, 1} and len(val) == 3
    assert all(r["prompt"].startswith("<|im_start|>") for r in rows + val)  # rendered through the chat template
    first = sum(r["demo"] == 0 for r in rows)
    res = CliRunner().invoke(app, ["bench", "sft-curve", "--folder", str(folder), "--demos", "1", "--every", "1",
                                   "--budget-s", "0", "--out", str(out), "--set", "bootstrap.sft_epochs=3",
                                   "--set", "bootstrap.sft_entity_swap=0"])
    assert res.exit_code == 0, res.output
    r = json.loads(out.with_suffix(".json").read_text())
    assert r["train_pairs"] == first and r["demos"] == 1 and r["val_steps"] == 3 and r["budget_s"] == 0
    assert [p["step"] for p in r["points"]] == [0, 1]  # the budget stopped it after one step, measured
    assert r["prompt_format"].startswith("webrl/chat/compact/") and out.with_suffix(".png").stat().st_size > 0
    res = CliRunner().invoke(app, ["bench", "sft-curve", "--folder", str(folder), "--every-epochs", "0.5",
                                   "--out", str(out), "--set", "bootstrap.sft_epochs=1",
                                   "--set", "bootstrap.sft_entity_swap=0"])
    assert res.exit_code == 0, res.output
    pairs, k = len(rows), -(-len(rows) // 2)  # batch 1: half an epoch is ceil(pairs / 2) optimizer steps
    assert [p["step"] for p in json.loads(out.with_suffix(".json").read_text())["points"]] == [0, *range(k, pairs, k),
                                                                                                pairs]
    (folder / "export.json").unlink()
    res = CliRunner().invoke(app, ["bench", "sft-curve", "--folder", str(folder), "--out", str(out)])
    assert res.exit_code != 0 and "export.json is missing" in str(res.exception)

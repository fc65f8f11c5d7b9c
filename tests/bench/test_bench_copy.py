"""`webrl bench copy-export` / `webrl bench copy` on the smoke config: real oracle demos and validation steps, a real
SFT, greedy decoding and the entity rank probe on the validation steps."""

import json

import pytest
from typer.testing import CliRunner

from webrl_cli.main import app
from benchmarks.copy import _argument, parse_size, run
from webrl_core.runs.store import TrajectoryStore
from webrl_core.websites import is_success


def test_bench_copy_exports_a_folder_and_checks_each_size(tmp_path):
    folder, out = tmp_path / "folder", tmp_path / "copy.json"
    sets = ["--set", "models.embedded.entity_tokens=true", "--set", "models.embedded.tie_embeddings=true"]
    res = CliRunner().invoke(app, ["bench", "copy-export", "--config", "smoke", "--demos", "6", "--val-tasks", "8",
                                   "--run-dir", str(tmp_path / "run"), "--out", str(folder), *sets])
    assert res.exit_code == 0, res.output
    store = TrajectoryStore(tmp_path / "run")
    oracle = store.sql("SELECT e.task_id, e.intent, e.env_score, s.response FROM steps s JOIN episodes e "
                       "USING (episode_id) WHERE e.purpose='oracle'")
    pairs = [json.loads(x) for x in (folder / "train_pairs.jsonl").read_text().splitlines()]
    val = [json.loads(x) for x in (folder / "val_steps.jsonl").read_text().splitlines()]
    assert len(pairs) + len(val) == sum(is_success(r["env_score"]) for r in oracle)  # every successful step, once
    val_intents = {t["intent"] for t in json.loads((tmp_path / "run" / "tasks" / "bench_sft_val_8.json").read_text())}
    assert {v["intent"] for v in val} <= val_intents  # the validation steps are the validation tasks'...
    demo_intents = {r["intent"] for r in oracle} - val_intents
    assert demo_intents and not demo_intents & val_intents  # ...which never repeat a demonstrated task
    kinds = json.loads((folder / "entity_kinds.json").read_text())
    res = CliRunner().invoke(app, ["bench", "copy", str(folder), "--size", "32,64,1,2", "--size", "48,96,2,2",
                                   "--out", str(out)])
    assert res.exit_code == 0, res.output
    rows = json.loads(out.read_text())
    assert [r["size"] for r in rows] == ["32,64,1,2", "48,96,2,2"] and rows[0]["params"] < rows[1]["params"]
    typed = [v for v in val if _argument(v["action"]) is not None]
    probed = [v for v in typed if _argument(v["action"]) in kinds]
    assert typed and probed  # the smoke validation tasks type names: the probe has something to rank
    for r in rows:
        assert r["val_steps"] == len(val) and r["typed"] == len(typed) and r["probe_steps"] == len(probed)
        assert r["n_entities"] == len(kinds)  # every name is one token of the exported tokenizer
        assert 1 <= r["median_rank"] <= r["n_entities"] and 0 <= r["top1"] <= r["top5"] <= 1
        assert 0 <= r["action_match"] <= 1 and 0 <= r["arg_exact"] <= 1 and 0 < r["mean_p"] < 1
        per_kind = [sum(k == kinds[_argument(v["action"])] for k in kinds.values()) for v in probed]
        assert r["chance_top1"] == round(sum(1 / k for k in per_kind) / len(per_kind), 3)


def test_bench_copy_names_a_missing_file_and_a_bad_size(tmp_path):
    (tmp_path / "tokenizer").mkdir()
    with pytest.raises(FileNotFoundError, match="train_pairs.jsonl"):
        run(tmp_path)
    with pytest.raises(ValueError, match="hidden,intermediate,layers,heads"):
        parse_size("768,2048,8")
    assert parse_size("768,2048,8,12") == {"hidden_size": 768, "intermediate_size": 2048, "num_layers": 8,
                                           "num_heads": 12}


def test_argument_is_the_typed_string():
    assert _argument('do(action="Type", argument="graph-viz", element="12")') == "graph-viz"
    assert _argument('do(action="Search", argument = "Maple Hotel")') == "Maple Hotel"
    assert _argument('do(action="Click", element="3")') is None
    assert _argument('do(action="Type", argument="cut off') == "cut off"

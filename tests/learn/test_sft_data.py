"""Demonstrations for a real model's phase 0 (webrl_core.learn.sft_data): the official ShareGPT format, VAB traces, and
their place in the store as replayable phase-0 experience."""

from __future__ import annotations

import json

import pytest

from webrl_core.prompts import build_prompt
from webrl_core.learn.sft_data import (DemonstrationError, demonstration_episodes, read_demonstrations, read_sharegpt,
                                 sharegpt_items, write_sharegpt)
from webrl_core.runs.store import TrajectoryStore


def test_sharegpt_round_trip_and_llama_factory_shape(tmp_path):
    pairs = [(build_prompt("buy a lamp", [], "<a id=1>Lamp</a>"), 'do(action="Click", element="1")'),
             (build_prompt("buy a lamp", ['do(action="Click", element="1")'], "<b>ok</b>"), 'exit(message="done")')]
    path = write_sharegpt(pairs, tmp_path / "d" / "sft.json")
    data = json.loads(path.read_text())
    assert data == sharegpt_items(pairs)
    assert data[0]["conversations"][0] == {"from": "human", "value": pairs[0][0]}
    assert data[0]["conversations"][1]["from"] == "gpt"
    assert read_sharegpt(path) == pairs == read_demonstrations(path)
    assert not list(path.parent.glob("*.tmp"))


def test_multi_turn_items_give_one_pair_per_human_gpt_turn(tmp_path):
    f = tmp_path / "multi.json"
    f.write_text(json.dumps([{"system": "s", "conversations": [
        {"from": "system", "value": "sys"}, {"from": "human", "value": "p1"}, {"from": "gpt", "value": "a1"},
        {"from": "human", "value": "p2"}, {"from": "gpt", "value": "a2"}]}]))
    assert read_sharegpt(f) == [("p1", "a1"), ("p2", "a2")]


@pytest.mark.parametrize("content, message", [
    ("{not json", "not JSON"),
    ('{"conversations": []}', "expected a JSON list"),
    ('[{"messages": []}]', "item 0 has no 'conversations' list"),
    ('[{"conversations": [{"from": "bot", "value": "x"}]}]', r"item 0 conversations\[0\] must be"),
    ('[{"conversations": [{"from": "gpt", "value": "x"}]}]', "no \\(human, gpt\\) turn pair"),
])
def test_bad_files_name_the_file_item_and_field(tmp_path, content, message):
    f = tmp_path / "bad.json"
    f.write_text(content)
    with pytest.raises(DemonstrationError, match=message) as e:
        read_sharegpt(f)
    assert str(f) in str(e.value)
    with pytest.raises(DemonstrationError, match="not found"):
        read_sharegpt(tmp_path / "missing.json")


def test_demonstrations_are_replayable_phase0_experience(tmp_path):
    pairs, past = [], []
    for intent, actions in (("buy a lamp", ["a1", "a2", "a3"]), ("find the forum", ["b1", "b2"])):
        past = []
        for a in actions:
            pairs.append((build_prompt(intent, past, f"<p>{a}</p>"), a))
            past.append(a)
    pairs.append(("no task line here", "c1"))
    path = write_sharegpt(pairs, tmp_path / "sft.json")
    items = demonstration_episodes(path, "ab" * 32)
    assert [(e["intent"], [s["response"] for s in st]) for e, st in items] == [
        ("buy a lamp", ["a1", "a2", "a3"]), ("find the forum", ["b1", "b2"]), ("(demonstration 5)", ["c1"])]
    assert all(e["success"] and st[-1]["reward"] == 1.0 and st[-1]["done"] for e, st in items)
    store = TrajectoryStore(tmp_path / "run")
    store.write_episodes(items)
    store.write_episodes(demonstration_episodes(path, "ab" * 32))  # the same file again: nothing new
    rows = store.successful_steps(before_phase=1, lineage=["0|oracle"])
    assert sorted((r["prompt"], r["response"]) for r in rows) == sorted(pairs)
    assert store.sql("SELECT count(*) AS n FROM episodes")[0]["n"] == 3
    assert {e["policy_digest"] for e, _ in items} == {"imported:sft-data@" + "ab" * 8}

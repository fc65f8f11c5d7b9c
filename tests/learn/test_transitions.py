"""Step samples, MC returns, the official export and the VAB import."""

import json

import pytest
import torch

from webrl_core.prompts import HTML_PLACEHOLDER, build_prompt
from webrl_core.learn.transitions import (OFFICIAL_STEP_KEYS, build_transitions, episode_reward, export_official,
                                    import_vab_traces, mc_returns)


def _episode(eid, success, n, intent="find the price"):
    ep = {"episode_id": eid, "success": success, "orm_score": None, "env_score": None, "intent": intent, "phase": 1}
    steps, past = [], []
    for k in range(n):
        resp = f'do(action="Click", element="{k}")'
        steps.append({"episode_id": eid, "idx": k, "prompt": build_prompt(intent, past, f"<p>page {k}</p>"),
                      "response": resp})
        past.append(resp)
    return ep, steps


def test_mc_returns_by_hand():
    assert mc_returns(1.0, 3, 0.9) == pytest.approx([1 + 0.9 + 0.81, 1 + 0.9, 1.0])
    assert mc_returns(0.0, 3, 0.9) == [0.0, 0.0, 0.0]
    assert mc_returns(0.5, 2, 0.5) == pytest.approx([0.75, 0.5])
    assert mc_returns(1.0, 0) == []


def test_episode_reward_precedence_and_missing_label():
    assert episode_reward({"success": True, "orm_score": 0.0}) == 1.0
    assert episode_reward({"success": None, "orm_score": 0.2, "env_score": 1.0}) == 0.2
    assert episode_reward({"success": None, "orm_score": None, "env_score": 1.0}) == 1.0
    with pytest.raises(ValueError, match="e9"):
        episode_reward({"episode_id": "e9", "success": None, "orm_score": None, "env_score": None})


def test_transitions_fields_like_official_stage1():
    ep, steps = _episode("e1", True, 3)
    samples = build_transitions([(ep, list(reversed(steps)))])  # order comes from idx, not list order
    assert [s["observation"] for s in samples] == [st["prompt"] for st in steps]
    assert [s["next_observation"] for s in samples] == [steps[1]["prompt"], steps[2]["prompt"], steps[2]["prompt"]]
    assert [s["done"] for s in samples] == [False, False, True]
    assert [s["reward"] for s in samples] == [1.0, 1.0, 1.0]  # final label broadcast to every step
    assert [s["mc_return"] for s in samples] == pytest.approx([2.71, 1.9, 1.0])
    assert all(s["trajectory_reward"] == 1.0 and s["task"] == "find the price" for s in samples)
    assert samples[1]["action"] == 'do(action="Click", element="1")'
    failed = build_transitions([_episode("e2", False, 2)])
    assert [s["mc_return"] for s in failed] == [0.0, 0.0] and failed[0]["trajectory_reward"] == 0.0


def test_export_official_round_trip(tmp_path):
    trajs = [_episode("a", True, 2), _episode("b", False, 3)]
    p, fp = export_official(trajs, tmp_path / "phase1.pt")
    assert fp.name == "phase1_filter.pt"
    stage1 = torch.load(p, weights_only=False)
    assert [len(t) for t in stage1] == [2, 3]
    assert set(stage1[0][0]) == set(OFFICIAL_STEP_KEYS)
    flat = torch.load(fp, weights_only=False)
    assert len(flat) == 5 and all("mc_return" in s for s in flat)
    assert sorted(s["mc_return"] for s in flat) == pytest.approx([0, 0, 0, 1.0, 1.9])
    # flat samples with a rank_score (replay items) keep it
    samples = build_transitions(trajs)
    samples[0]["rank_score"] = 0.7
    _, fp2 = export_official(samples, tmp_path / "x.pt")
    assert sorted(s.get("rank_score", -1) for s in torch.load(fp2, weights_only=False))[-1] == 0.7


def test_import_vab_traces_rebuilds_prompts(tmp_path):
    traces, actions = tmp_path / "traces", tmp_path / "actions"
    traces.mkdir(), actions.mkdir()
    lines = [{"trace_id": "7", "index": i, "prompt": "buy milk" if i == 0 else HTML_PLACEHOLDER,
              "html": f"<p>{i}</p>", "response": f"r{i}", "target": "buy milk"} for i in range(3)]
    (traces / "7.jsonl").write_text("\n".join(json.dumps(x) for x in lines))
    (actions / "7.json").write_text(json.dumps({"task_id": 7, "score": 1.0, "actions": ["r0", "r1", "r2"]}))
    (traces / "8.jsonl").write_text(json.dumps({**lines[0], "trace_id": "8"}))
    (actions / "8.json").write_text(json.dumps({"task_id": 8, "score": 0.0}))
    got = dict((ep["task_id"], (ep, st)) for ep, st in import_vab_traces(traces))
    ep, steps = got["7"]
    assert ep["success"] is True and ep["env_score"] == 1.0 and ep["n_steps"] == 3 and ep["intent"] == "buy milk"
    assert steps[2]["prompt"] == build_prompt("buy milk", ["r0", "r1"], "<p>2</p>")
    assert got["8"][0]["success"] is False
    assert [s["mc_return"] for s in build_transitions([got["7"]])] == pytest.approx([2.71, 1.9, 1.0])
    (traces / "9.jsonl").write_text("{not json")
    with pytest.raises(ValueError, match="9.jsonl:1"):
        import_vab_traces(traces)

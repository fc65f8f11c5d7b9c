"""Paired comparison of two evaluations (webrl_core/pipeline/compare.py) on a real store, and `webrl store compare`."""

import json

import pytest
from typer.testing import CliRunner

from webrl_cli.main import app
from webrl_core.errors import BadInput, MissingInput
from webrl_core.pipeline import compare as C
from webrl_core.runs.store import TrajectoryStore


def _evaluation(run, name, outcomes):
    """Write one evaluation's episodes (task -> env score, or "error") and its eval/<name>.json."""
    items = []
    for task, score in outcomes.items():
        eid = f"{name}-{task}"
        ep = {"episode_id": eid, "task_id": task, "phase": 0, "policy_id": name, "purpose": "eval",
              "status": "error" if score == "error" else "done", "env_score": None if score == "error" else score,
              "intent": f"intent of {task}", "site": "gitlab" if task < "t5" else "reddit"}
        steps = [{"prompt": "p", "html": "", "response": "r", "done": True,
                  "action": json.dumps({"name": "Click", "argument": None, "element": "7", "message": None,
                                        "comments": [f"# Element: {name} button"]})}]
        items.append((ep, steps))
    TrajectoryStore(run).write_episodes(items)
    (run / "eval").mkdir(exist_ok=True)
    (run / "eval" / f"{name}.json").write_text(json.dumps({"episode_ids": [f"{name}-{t}" for t in outcomes]}))


def test_tasks_pair_by_id_and_the_sign_test_counts_discordant_pairs(tmp_path):
    _evaluation(tmp_path, "phase=0", {"t1": 1.0, "t2": 1.0, "t3": 0.0, "t4": 0.0, "t6": 1.0, "t7": "error"})
    _evaluation(tmp_path, "phase=1", {"t1": 1.0, "t2": 0.0, "t3": 1.0, "t4": 0.0, "t6": 0.0, "t7": 1.0, "t8": 1.0})
    cmp = C.compare(tmp_path / "eval" / "phase=0.json", tmp_path / "eval" / "phase=1.json")
    assert (cmp.both, cmp.neither) == (1, 1)
    assert [a.task_id for a, _ in cmp.lost] == ["t2", "t6"] and [a.task_id for a, _ in cmp.gained] == ["t3"]
    assert cmp.unpaired == 2  # t7 errored under A, t8 only under B
    assert cmp.solved == (3, 2)
    assert cmp.p_value == pytest.approx(1.0)  # 2 vs 1 of 3: 2 * (1 + 3) / 8
    assert C.episode_actions(tmp_path / "eval" / "phase=1.json", ["phase=1-t3"]) == {
        "phase=1-t3": ["phase=1 button: do(action='Click', element='7')"]}


def test_sign_test_values():
    assert C.sign_test(0, 0) == 1.0
    assert C.sign_test(0, 3) == pytest.approx(0.25)
    assert C.sign_test(8, 2) == pytest.approx(2 * (1 + 10 + 45) / 1024)
    assert C.sign_test(2, 8) == C.sign_test(8, 2) and isinstance(C.sign_test(2, 8), float)  # two-sided
    assert C.sign_test(5, 5) == 1.0 and C.sign_test(1, 0) == 1.0  # never above 1
    assert C.sign_test(0, 20) == pytest.approx(2 / 2 ** 20)


def test_bad_references_name_the_file(tmp_path):
    with pytest.raises(MissingInput, match="no such file"):  # a missing file: exit code 1, as for every command
        C.resolve_evaluation(f"{tmp_path}:phase=3")
    (tmp_path / "x.json").write_text('{"episode_ids": []}')
    with pytest.raises(BadInput, match="no run dir with a store"):
        C.task_outcomes(tmp_path / "x.json")


def test_the_command_compares_a_runs_phases_in_turn(tmp_path):
    _evaluation(tmp_path, "phase=0", {"t1": 1.0, "t2": 1.0, "t5": 0.0})
    _evaluation(tmp_path, "phase=1", {"t1": 1.0, "t2": 0.0, "t5": 1.0})
    _evaluation(tmp_path, "phase=2", {"t1": 1.0, "t2": 1.0, "t5": 1.0})
    out = CliRunner().invoke(app, ["store", "compare", str(tmp_path), "--actions"], env={"COLUMNS": "250"})
    assert out.exit_code == 0, out.output
    text = " ".join(out.output.split())
    assert "solved 2 -> 2 of 3 paired tasks, lost 1, gained 1" in text
    assert "solved 2 -> 3 of 3 paired tasks, lost 0, gained 1" in text
    assert "phase=1 button: do(action='Click', element='7')" in out.output
    bad = CliRunner().invoke(app, ["store", "compare", str(tmp_path / "eval")])
    assert isinstance(bad.exception, BadInput) and "give two evaluations" in str(bad.exception)  # exit 2 in `webrl`

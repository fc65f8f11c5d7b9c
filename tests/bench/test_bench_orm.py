"""`webrl bench orm`: ORMs trained on nested draws of one run's labelled policy episodes, scored on another's."""

import json
import math

import pytest
from typer.testing import CliRunner

from webrl_cli.main import app
from benchmarks.orm import agreement, labelled_episodes, nested_balanced, roc_auc
from webrl_core.config import EmbeddedModelConfig
from webrl_core.errors import MissingInput
from webrl_core.learn.embedded_model import build_embedded_model, train_embedded_tokenizer
from webrl_core.runs.store import TrajectoryStore

OK = 'do(action="Click", element="7")'
BAD = 'do(action="Scroll Down")'


def _write(run_dir, eid, solved, purpose="rollout", task=None, status="done"):
    ep = {"episode_id": eid, "task_id": task or f"t-{eid}", "task_digest": task or f"d-{eid}", "phase": 1,
          "policy_id": "p0", "purpose": purpose, "status": status, "success": solved,
          "env_score": None if status == "error" else float(solved), "intent": f"Buy item {eid}", "site": "shopping"}
    steps = [{"idx": 0, "prompt": "p", "html": "<p>catalogue</p>", "response": OK, "done": False},
             {"idx": 1, "prompt": "p", "html": "<p>Thank you for your order</p>" if solved else "<p>Error: out of stock</p>",
              "response": OK if solved else BAD, "done": True}]
    TrajectoryStore(run_dir).write_episode(ep, steps)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("orm-bench")
    train, test = root / "train", root / "test"
    for i in range(12):
        _write(train, f"a{i:02d}", i % 2 == 0, purpose="bootstrap" if i < 2 else "rollout")
    _write(train, "eval0", True, purpose="eval")  # the held-out test set: never an ORM example
    _write(train, "err0", False, status="error")
    for i in range(8):
        _write(test, f"b{i:02d}", i % 2 == 1)
    _write(test, "a00", True)  # an episode the training run holds too
    _write(test, "b-same-task", False, task="d-a01")  # a task a training episode acted on
    texts = ["Buy item a00 Thank you for your order Error: out of stock catalogue " + OK + BAD]
    train_embedded_tokenizer(texts * 4, 400, root / "tok")
    base = build_embedded_model(root / "tok", EmbeddedModelConfig(vocab_size=400, hidden_size=32,
                                intermediate_size=64, num_layers=2, num_heads=2, max_length=512), root / "base", seed=1)
    return train, test, base, root


def test_policy_episodes_only_and_nested_balanced_draws(runs):
    train, test, _, _ = runs
    eps = labelled_episodes([train])
    assert [e["episode_id"] for e in eps] == [f"a{i:02d}" for i in range(12)]  # no eval, no error
    assert all(len(e["steps"]) == 2 and e["label"] == (int(e["episode_id"][1:]) % 2 == 0) for e in eps)
    # one id in two stores is one episode, the first store's
    both = labelled_episodes([train, test])
    assert len(both) == 12 + 9 and next(e for e in both if e["episode_id"] == "a00")["run_dir"] == str(train)
    draws = nested_balanced(eps, [2, 6, 100], seed=3)
    assert [len(d) for d in draws] == [2, 6, 12]  # 100 capped at twice the 6 of each class
    assert all(sum(e["label"] for e in d) == len(d) // 2 for d in draws)
    ids = [{e["episode_id"] for e in d} for d in draws]
    assert ids[0] < ids[1] < ids[2]
    with pytest.raises(MissingInput, match="has no store"):
        labelled_episodes([train.parent / "nothing"])


def test_agreement_and_auc_hand_computed():
    assert roc_auc([0.9, 0.4, 0.4, 0.1], [True, True, False, False]) == (2 + 1.5) / 4
    assert math.isnan(roc_auc([0.2, 0.3], [True, True]))
    m = agreement([0.9, 0.6, 0.3, 0.7], [True, False, True, False], threshold=0.5)
    assert (m["tp"], m["fp"], m["fn"], m["tn"]) == (1, 2, 1, 0)
    assert m["accuracy"] == 0.25 and m["precision"] == 1 / 3 and m["recall"] == 0.5 and m["yes_rate"] == 0.75


def test_curve_trains_scores_unseen_episodes_and_reuses(runs):
    train, test, base, root = runs
    out = root / "curve"
    args = ["bench", "orm", "--train-run", str(train), "--test-run", str(test), "--sizes", "4,12,40",
            "--base", str(base), "--config", "smoke", "--run-dir", str(root / "bench"), "--out", str(out),
            "--set", "orm.epochs=40", "--set", "orm.lr=2e-2", "--set", "models.max_length=512"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    r = json.loads(out.with_suffix(".json").read_text())
    assert r["test_episodes"] == 8 and r["test_yes"] == 4  # a00 (trained on) and the seen task left out
    assert r["test_left_out_seen_tasks"] == 1 and r["train_pool"] == 12
    assert [row["train_episodes"] for row in r["rows"]] == [4, 12]  # 40 capped to the 12 there are: one point
    assert len({row["orm"] for row in r["rows"]}) == 2 and not any(row["reused"] for row in r["rows"])
    last = r["rows"][-1]
    assert last["accuracy"] == 1.0 and last["precision"] == 1.0 and last["auc"] == 1.0  # the end page tells them apart
    assert last["tp"] + last["fp"] + last["fn"] + last["tn"] == 8
    assert last["by_site"]["shopping"]["n"] == 8 and last["by_site"]["shopping"]["accuracy"] == 1.0
    assert len(last["p_yes"]) == len(r["test_episode_ids"]) == 8 and "a00" not in r["test_episode_ids"]
    assert all((p >= 0.5) == (int(e[1:]) % 2 == 1) for p, e in zip(last["p_yes"], r["test_episode_ids"]))
    assert out.with_suffix(".png").stat().st_size > 0
    again = CliRunner().invoke(app, args)
    assert again.exit_code == 0, again.output
    rerun = json.loads(out.with_suffix(".json").read_text())
    assert all(row["reused"] for row in rerun["rows"])
    assert [row["accuracy"] for row in rerun["rows"]] == [row["accuracy"] for row in r["rows"]]

    res = CliRunner().invoke(app, [*args[:2], "--train-run", str(train), "--config", "smoke", "--base", str(base)])
    assert isinstance(res.exception, MissingInput) and "--test-run" in str(res.exception)

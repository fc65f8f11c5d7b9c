"""`webrl bench faults` in CI: the harness end to end on two rows of the matrix (the whole matrix is
`webrl bench faults`, ~1 h on a 2-core box): kill -9 of the flow mid-rollout, and during actor training.

A smaller bootstrap and phase than `smoke` (fewer demo/eval tasks, one SFT epoch) keep it to a few minutes;
the rows run the same code paths as the full matrix.
"""

from __future__ import annotations

import pytest

from webrl_core.bench.faults import FAULT_NAMES, run_matrix, select, summarize

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]

SMALL = ["bootstrap.demo_tasks=8", "bootstrap.rollout_tasks=4", "bootstrap.random_tasks=2", "eval.max_tasks=4",
         "actor.sft_epochs=1", "curriculum.tasks_per_phase=4"]


def test_select_names_every_fault_and_rejects_unknown():
    assert [f.name for f in select(None)] == list(FAULT_NAMES)
    assert [f.name for f in select("eval,rollout")] == ["rollout", "eval"]
    with pytest.raises(ValueError, match="unknown fault"):
        select("rollout,bogus")


def test_fault_rows_pass(tmp_path):
    res = run_matrix(tmp_path, select("rollout,actor"), sets=SMALL)
    for r in res["rows"]:
        print(f"{r['fault']}: {r['injected']}; re-run {r.get('rerun_wall_s', 0):.0f} s; {summarize(r)}; "
              f"{'PASS' if r['ok'] else 'FAIL ' + r['why']}")
    print(f"bootstrap {res['bootstrap_s']:.0f} s, clean phase {res['clean_s']:.0f} s, total {res['total_s']:.0f} s")
    assert [r["fault"] for r in res["rows"]] == ["rollout", "actor"]
    assert res["failed"] == 0, [(r["fault"], r["why"]) for r in res["rows"] if not r["ok"]]
    rollout, actor = res["rows"]
    assert rollout["injected"].split("/")[0].isdigit()          # "k/n rollout episodes stored"
    assert "into train-actor" in actor["injected"]
    assert rollout["checks"]["doubled"]["kept_from_before"] >= 1  # finished episodes were not rolled out again

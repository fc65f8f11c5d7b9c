"""`webrl bench faults` in CI: the harness end to end on one row of the matrix, kill -9 of the flow during
critic training (the whole matrix is `webrl bench faults`, ~1 h on a 2-core box; the mid-rollout kill is also
covered by tests/flows/test_flows.py).

The row forks the phase 0 of the session's smoke run (`webrl bench faults --bootstrap`, conftest.smoke_run) and
evaluates 4 test tasks per phase; it runs the same code paths and checks as the full matrix. Its commands start
Prefect's temporary server (no PREFECT_API_URL), as a user's `webrl phase` does without a server.
"""

from __future__ import annotations

import pytest

from benchmarks.faults import FAULT_NAMES, recovery, run_matrix, select, summarize

SMALL = ["eval.max_tasks=4"]


def test_select_names_every_fault_and_rejects_unknown():
    assert [f.name for f in select(None)] == list(FAULT_NAMES)
    assert [f.name for f in select("eval,rollout")] == ["rollout", "eval"]
    with pytest.raises(ValueError, match="unknown fault"):
        select("rollout,bogus")


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_kill_during_critic_training_resumes_from_the_cache_with_the_same_outputs(tmp_path, smoke_run):
    res = run_matrix(tmp_path, select("critic"), sets=SMALL, bootstrap_from=smoke_run[2])
    (row,) = res["rows"]
    print(f"{row['fault']}: {row['injected']}; {recovery(row)}; {summarize(row)}; "
          f"{'PASS' if row['ok'] else 'FAIL ' + row['why']}")
    assert not (tmp_path / "bootstrap.log").exists()  # phase 0 forked, no bootstrap run
    print(f"bootstrap {res['bootstrap_s']:.0f} s, clean phase {res['clean_s']:.0f} s, total {res['total_s']:.0f} s")
    assert row["ok"], row["why"]
    assert "into train-critic" in row["injected"]
    states = row["rerun_tasks"]
    # the re-run took everything before the critic from the cache and ran the critic again
    assert {"rollout-shard", "orm-label", "replay-selection"} <= set(states.get("Cached", [])), states
    assert "train-critic" in states.get("Completed", []), states
    assert row["checks"]["doubled"]["kept_from_before"] == row["checks"]["lost"]["rollout"]

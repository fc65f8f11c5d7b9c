import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from webrl_core.runs.store import StoreError, TrajectoryStore


def _episode(eid, phase, success, n=3, purpose="rollout", site="shopping"):
    ep = {"episode_id": eid, "task_id": f"t-{eid}", "phase": phase, "policy_id": "p0", "purpose": purpose,
          "status": "done", "success": success, "intent": f"intent {eid}", "site": site}
    steps = [{"prompt": f"P{eid}-{i}", "html": f"<p>{i}</p>", "response": f'do(action="Click", element="{i}")',
              "done": i == n - 1} for i in range(n)]
    return ep, steps


def test_write_twice_never_duplicates(tmp_path):
    st = TrajectoryStore(tmp_path)
    ep, steps = _episode("a", 1, True)
    assert st.write_episode(ep, steps) is True
    assert st.write_episode(ep, steps) is False  # identical content: skipped
    ep2 = dict(ep, success=False)  # same id, new content: replaces
    assert st.write_episode(ep2, steps[:2]) is True
    rows = st.episodes()
    assert len(rows) == 1 and rows[0]["success"] is False and rows[0]["n_steps"] == 2
    assert [s["idx"] for s in st.steps()] == [0, 1]
    # a fresh store object (another process) sees the same and still skips identical content
    st2 = TrajectoryStore(tmp_path)
    assert st2.write_episode(ep2, steps[:2]) is False
    assert st2.sql("SELECT count(*) AS n FROM steps")[0]["n"] == 2


def test_update_episodes_keeps_steps(tmp_path):
    st = TrajectoryStore(tmp_path)
    st.write_episodes([_episode("a", 0, None), _episode("b", 0, None)])
    st.update_episodes([{"episode_id": "a", "orm_score": 0.8, "success": True}])
    st.update_episodes([{"episode_id": "a", "orm_score": 0.3, "success": False}])
    rows = {r["episode_id"]: r for r in st.episodes()}
    assert rows["a"]["orm_score"] == 0.3 and rows["a"]["success"] is False
    assert len(st.steps(episode_ids=["a"])) == 3
    with pytest.raises(StoreError, match="unknown episode_id"):
        st.update_episodes([{"episode_id": "zzz", "success": True}])


def test_replay_and_helper_queries(tmp_path):
    st = TrajectoryStore(tmp_path)
    st.write_episodes([
        _episode("p0ok", 0, True, 2), _episode("p0bad", 0, False, 4, site="reddit"),
        _episode("p1ok", 1, True, 3), _episode("p2ok", 2, True, 5),
        _episode("p1eval", 1, True, 2, purpose="eval"),
    ])
    got = {(r["episode_id"], r["idx"]) for r in st.successful_steps(before_phase=2)}
    assert got == {("p0ok", 0), ("p0ok", 1), ("p1ok", 0), ("p1ok", 1), ("p1ok", 2)}
    assert st.failed_intents(0) == {"reddit": [{"task_id": "t-p0bad", "intent": "intent p0bad"}]}
    rates = st.success_rate(purpose="rollout")
    assert {(r["phase"], r["site"], r["n"], r["successes"]) for r in rates} == {
        (0, "reddit", 1, 0), (0, "shopping", 1, 1), (1, "shopping", 1, 1), (2, "shopping", 1, 1)}
    err_ep, err_steps = _episode("boom", 1, None, 1)
    st.write_episode(dict(err_ep, status="error", error="browser crashed"), err_steps)
    assert [e["episode_id"] for e in st.error_episodes()] == ["boom"]


def test_bad_rows_are_rejected_with_field_names(tmp_path):
    st = TrajectoryStore(tmp_path)
    ep, steps = _episode("x", 0, True)
    with pytest.raises(StoreError, match="colour"):
        st.write_episode(dict(ep, colour="red"), steps)
    with pytest.raises(StoreError, match="phase"):
        st.write_tasks([{"task_id": "t1", "intent": "x"}])


def test_partial_tmp_file_is_ignored(tmp_path):
    st = TrajectoryStore(tmp_path)
    st.write_episode(*_episode("a", 0, True))
    # a crash mid-write leaves a truncated tmp file: reads must not see or choke on it
    bad = tmp_path / "store" / "steps" / "phase=0" / "99999999999999999999-deadbeef.parquet.tmp"
    bad.write_bytes(b"PAR1\x00\x01garbage")
    assert len(st.steps()) == 3
    assert st.cleanup_tmp() == 1 and not bad.exists()


WRITER = textwrap.dedent("""
    import sys
    from webrl_core.runs.store import TrajectoryStore
    st = TrajectoryStore(sys.argv[1])
    i = 0
    while True:
        eid = f"e{i:06d}"
        n = 1 + i % 7
        ep = {"episode_id": eid, "task_id": "t", "phase": i % 3, "policy_id": "p", "purpose": "rollout",
              "status": "done", "success": i % 2 == 0, "intent": "x" * 50, "site": "map"}
        steps = [{"prompt": "p" * 3000, "html": "h" * 3000, "response": "r"} for _ in range(n)]
        st.write_episode(ep, steps)
        print(eid, flush=True)
        i += 1
""")


def test_kill_during_writes_then_read(tmp_path):
    """kill -9 a writer at arbitrary moments: every visible episode has exactly its steps, nothing is half-read."""
    for attempt, delay in enumerate((0.0, 0.037, 0.11)):
        run = tmp_path / f"run{attempt}"
        proc = subprocess.Popen([sys.executable, "-c", WRITER, str(run)], stdout=subprocess.PIPE, text=True)
        out = [proc.stdout.readline().strip() for _ in range(5 + attempt * 7)]  # let it get going
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        out += proc.communicate()[0].split()
        st = TrajectoryStore(run)
        eps = st.episodes()
        assert len(eps) >= len(out) >= 1  # everything reported written is there (plus maybe one in flight)
        counts = {r["episode_id"]: r["n"] for r in st.sql("SELECT episode_id, count(*) AS n FROM steps GROUP BY 1")}
        for e in eps:
            assert counts.get(e["episode_id"]) == e["n_steps"], e["episode_id"]
        assert set(counts) <= {e["episode_id"] for e in eps}


def test_replay_candidates_follow_the_lineage(tmp_path):
    st = TrajectoryStore(tmp_path)
    items = [_episode("demo", 0, True, 2, purpose="oracle"), _episode("cur", 1, True, 2), _episode("stale", 1, True, 2),
             _episode("vab", 0, True, 2)]
    digests = ["oracle", "hf:sft", "hf:old-sft", "imported:vab"]
    st.write_episodes([(dict(ep, policy_digest=d), steps) for (ep, steps), d in zip(items, digests)])
    got = {r["episode_id"] for r in st.successful_steps(before_phase=2, lineage=["0|oracle", "1|hf:sft"])}
    assert got == {"demo", "cur", "vab"}  # the stale branch's episode of phase 1 is not replayed
    assert {r["episode_id"] for r in st.successful_steps(before_phase=2)} == {"demo", "cur", "stale", "vab"}


def test_unscored_episodes_are_counted_apart(tmp_path):
    # unscored: ran to the end, no env score and no label (its task needed an LLM judge; eval.judge was empty)
    st = TrajectoryStore(tmp_path)
    rows = [("ok", "done", 1.0, True), ("bad", "max_steps", 0.0, False), ("fz", "done", None, None),
            ("err", "error", None, None)]
    st.write_episodes([(dict(_episode(eid, 1, success, purpose="eval")[0], status=status, env_score=score), [])
                       for eid, status, score, success in rows])
    [r] = st.success_rate(phase=1)
    assert (r["n"], r["successes"], r["failures"], r["unscored"], r["errors"], r["rate"]) == (4, 1, 1, 1, 1, 0.5)
    [by] = st.stats()["by_phase"]
    assert (by["unscored"], by["errors"], by["success_rate"]) == (1, 1, 0.5)


def test_the_duckdb_file_follows_the_tables_and_the_run_dirs_place(tmp_path):
    """store/webrl.duckdb (README: `duckdb runs/demo/store/webrl.duckdb`) holds the four views: written when a table
    gets its first file, rewritten for a copied run dir, readable by the duckdb CLI of .venv (duckdb-cli)."""
    import shutil

    st = TrajectoryStore(tmp_path / "run")
    db = st.root / "webrl.duckdb"
    assert not db.exists()  # nothing written yet
    st.write_episodes([_episode("a", 0, True), _episode("b", 1, False)])
    st.write_tasks([{"task_id": "t-a", "phase": 0, "intent": "i"}])
    state = json.loads((st.root / "webrl.duckdb.json").read_text())
    assert db.is_file() and state["tables"] == ["tasks", "episodes", "steps", "scores"]
    st.write_episodes([_episode("c", 2, True)])  # a new phase: the views glob it, no rewrite needed
    copy = tmp_path / "copy"
    shutil.copytree(tmp_path / "run", copy)
    TrajectoryStore(copy).write_episodes([_episode("d", 0, True)])  # the copy's first write rewrites its file
    assert json.loads((copy / "store" / "webrl.duckdb.json").read_text())["root"] == str((copy / "store").resolve())
    cli = os.path.join(os.path.dirname(sys.executable), "duckdb")
    if not os.path.exists(cli):
        pytest.skip("no duckdb CLI in this environment (infra/requirements.txt installs duckdb-cli)")
    for root, n in ((tmp_path / "run", 3), (copy, 4)):
        r = subprocess.run([cli, str(root / "store" / "webrl.duckdb"), "-csv", "-noheader", "-c",
                            "SELECT count(*) FROM episodes; SELECT count(*) FROM steps; SELECT count(*) FROM tasks"],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0 and r.stdout.split() == [str(n), str(3 * n), "1"], r.stdout + r.stderr

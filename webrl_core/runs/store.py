"""Trajectory store: Parquet files partitioned by phase, exposed as DuckDB views.

Layout (``<run_dir>/store``)::

    tasks/phase=k/<batch>.parquet      one row per task (latest write per task_id wins)
    episodes/phase=k/<batch>.parquet   one row per episode (latest write per episode_id wins)
    steps/phase=k/<batch>.parquet      one row per step, tagged with the batch of its episode write
    scores/phase=k/<batch>.parquet     per-step / per-task values written by later stages
    webrl.duckdb                       the four views over the files, for the duckdb CLI (`duckdb <this file>`);
                                       rewritten when a table gets its first file or the run dir is moved or
                                       copied (webrl.duckdb.json records what it was written for)

Atomicity: a batch is written to ``<name>.parquet.tmp`` and renamed; readers only glob ``*.parquet``,
so a crash mid-write leaves at most a ``.tmp`` file that reads ignore (and ``cleanup_tmp`` removes).
Steps are written BEFORE their episode row, and an episode's steps are visible only through the episode
row that names their batch, so a crash between the two never shows half an episode.

Idempotence: every row carries ``_batch`` (a sortable write id). Views keep, per key, the rows of the
latest batch: episodes by ``episode_id``, steps through their episode's latest batch, tasks by
``task_id``, scores by (kind, episode_id, step_idx, task_id, model_id). Writing the same episode twice
therefore never duplicates it; writing identical content again is skipped entirely.

Schema version: ``SCHEMA_VERSION``; every file carries it in ``_schema`` and ``store/schema.json`` records the
version the store was written with. Opening a store of another version fails with a message naming both
versions; ``migrate`` brings a version-1 store (episodes keyed by purpose/phase/task id/seed only) to version 2
(episodes also keyed by task content, policy identity and settings; see ``webrl_core.identity``).
See ``SCHEMAS`` for columns.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Iterable

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from webrl_core.errors import BadInput

SCHEMA_VERSION = 2
SCHEMA_FILE = "schema.json"
DUCKDB_FILE = "webrl.duckdb"
DUCKDB_STATE = "webrl.duckdb.json"  # the absolute store path and the tables with files that DUCKDB_FILE was written for
# The file's storage format: the duckdb CLI (PyPI's duckdb-cli 1.5, infra/requirements.txt) reads formats up to
# DuckDB 1.5's, and the Python package 2.0 writes a newer one unless told otherwise.
DUCKDB_STORAGE = "v1.0.0"

_S, _I, _F, _B = pa.string(), pa.int64(), pa.float64(), pa.bool_()

SCHEMAS: dict[str, pa.Schema] = {
    "tasks": pa.schema([
        ("task_id", _S), ("phase", _I), ("site", _S), ("sites", _S), ("intent", _S), ("start_url", _S),
        ("eval_json", _S), ("origin", _S), ("parent_task_id", _S), ("family", _S), ("config_json", _S),
    ]),
    "episodes": pa.schema([
        ("episode_id", _S), ("task_id", _S), ("phase", _I), ("policy_id", _S), ("purpose", _S), ("status", _S),
        ("final_answer", _S), ("env_score", _F), ("orm_score", _F), ("success", _B), ("n_steps", _I),
        ("started_at", _F), ("wall_s", _F), ("policy_s", _F), ("env_s", _F), ("error", _S), ("intent", _S),
        ("site", _S), ("seed", _I), ("task_digest", _S), ("policy_digest", _S), ("settings_digest", _S), ("node", _S),
    ]),
    "steps": pa.schema([
        ("episode_id", _S), ("idx", _I), ("phase", _I), ("prompt", _S), ("html", _S), ("response", _S),
        ("action", _S), ("url", _S), ("reward", _F), ("done", _B), ("mc_return", _F), ("policy_s", _F),
        ("action_s", _F), ("obs_s", _F), ("error", _S),
    ]),
    "scores": pa.schema([
        ("kind", _S), ("episode_id", _S), ("step_idx", _I), ("task_id", _S), ("phase", _I), ("value", _F),
        ("model_id", _S), ("note", _S),
    ]),
}
# What each column means (printed by `webrl store schema`).
COLUMN_DOCS = {
    "tasks": "task_id, phase that created it, first site, sites (JSON list), intent, start_url (placeholders), eval spec "
             "JSON, origin seed|generated|test|train, parent task id (generation), family (embedded), full config JSON",
    "episodes": "episode id, task id, phase, policy/model id, purpose rollout|eval|oracle|bootstrap|random|early-exit, status "
                "done|early_stop|max_steps|error, final answer, env score (empty after an error, or unscored: the task needed an "
                "LLM judge and eval.judge was empty), ORM score, success, step count, timings, error, "
                "intent, site, seed, task content digest, policy identity (hf:<checkpoint sha256>, openai:<model>@<served "
                "digest>, oracle, random:s<seed>), sampling+environment settings digest, node (host) that ran it",
    "steps": "episode id, step index, prompt given to the policy, observation html before the action, raw response, "
             "parsed action JSON, url, reward, done, mc_return, timings (policy/action/observation), error",
    "scores": "kind (critic_v, critic_p1, ppl_inv, replay_selected, orm_p_yes, ...), episode id, step index (-1: "
              "per episode/task), task id, phase, value, model id, note",
}
_KEYS = {"tasks": ["task_id"], "episodes": ["episode_id"], "scores": ["kind", "episode_id", "step_idx", "task_id", "model_id"]}
_EXTRA = [pa.field("_batch", _S), pa.field("_schema", _I)]


class StoreError(BadInput):
    """The store cannot be read or written as asked: its schema version, a damaged file, a row that does not fit."""


def _batch_id() -> str:
    # time-sortable, unique across processes: <ns since epoch, 20 digits>-<random>
    return f"{time.time_ns():020d}-{uuid.uuid4().hex[:8]}"


def _to_table(name: str, rows: list[dict], batch: str) -> pa.Table:
    schema = SCHEMAS[name]
    cols: dict[str, list] = {f.name: [] for f in schema}
    for i, r in enumerate(rows):
        unknown = set(r) - set(cols) - {"steps"}
        if unknown:
            raise StoreError(f"{name} row {i}: unknown field(s) {sorted(unknown)}; allowed: {schema.names}")
        for f in schema:
            v = r.get(f.name)
            if v is not None and f.type == _S and not isinstance(v, str):
                v = json.dumps(v, sort_keys=True, default=str)
            cols[f.name].append(v)
    try:
        arrays = [pa.array(cols[f.name], type=f.type) for f in schema]
    except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
        raise StoreError(f"{name}: a value does not fit the schema: {e}") from None
    n = len(rows)
    arrays += [pa.array([batch] * n, type=_S), pa.array([SCHEMA_VERSION] * n, type=_I)]
    return pa.Table.from_arrays(arrays, schema=pa.schema(list(schema) + _EXTRA))


class TrajectoryStore:
    """Tasks, episodes, steps and scores of one run (see module docstring)."""

    def __init__(self, run_dir: str | Path, check_version: bool = True):
        self.root = Path(run_dir) / "store"
        self.root.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._con: duckdb.DuckDBPyConnection | None = None
        self._digests: dict[str, str] | None = None
        self._checked_file: set[str] = set()  # tables after whose first write here DUCKDB_FILE was checked
        if check_version:
            self._check_version()

    # ------------------------------------------------------------------ schema version
    def written_version(self) -> int | None:
        """Schema version the store was written with; None for an empty store."""
        f = self.root / SCHEMA_FILE
        if f.exists():
            try:
                return int(json.loads(f.read_text())["version"])
            except (ValueError, KeyError, TypeError) as e:
                raise StoreError(f"{f}: unreadable schema file ({e}); expected {{\"version\": {SCHEMA_VERSION}}}") from None
        if any(self.root.glob("*/phase=*/*.parquet")):
            return 1  # version 1 wrote no schema file
        return None

    def _check_version(self) -> None:
        v = self.written_version()
        if v is None:
            (self.root / SCHEMA_FILE).write_text(json.dumps({"version": SCHEMA_VERSION}))
        elif v < SCHEMA_VERSION:
            raise StoreError(
                f"the store {self.root} was written with schema version {v}; this webrl reads version {SCHEMA_VERSION} "
                f"(episodes keyed by task content, policy identity and settings). Run `webrl store migrate "
                f"{self.root.parent}` to upgrade it in place (every row is kept; old episodes are marked legacy and "
                f"never reused for new rollouts).")
        elif v > SCHEMA_VERSION:
            raise StoreError(f"the store {self.root} was written with schema version {v} by a newer webrl; this one "
                             f"reads version {SCHEMA_VERSION}: upgrade webrl")

    def migrate(self) -> dict:
        """Upgrade a version-1 store in place: episodes get ``policy_digest = legacy:<policy_id>`` and
        ``settings_digest = legacy`` (their ids never match a version-2 key, so they are kept for queries but
        never reused), ``task_digest`` from the stored task config where the task is known."""
        from webrl_core.identity import task_digest

        v = self.written_version()
        if v is None or v == SCHEMA_VERSION:
            return {"from": v, "to": SCHEMA_VERSION, "episodes": 0}
        if v != 1:
            raise StoreError(f"{self.root}: no migration from schema version {v} to {SCHEMA_VERSION}")
        tasks = {r["task_id"]: r["config_json"] for r in self.sql("SELECT task_id, config_json FROM tasks")}
        updates = []
        for e in self.sql("SELECT episode_id, task_id, policy_id FROM episodes"):
            try:
                td = task_digest(json.loads(tasks[e["task_id"]])) if e["task_id"] in tasks else None
            except (ValueError, TypeError):
                td = None
            updates.append({"episode_id": e["episode_id"], "policy_digest": f"legacy:{e['policy_id']}",
                            "settings_digest": "legacy", "task_digest": td})
        self.update_episodes(updates)
        (self.root / SCHEMA_FILE).write_text(json.dumps({"version": SCHEMA_VERSION, "migrated_from": v}))
        return {"from": v, "to": SCHEMA_VERSION, "episodes": len(updates)}

    # ------------------------------------------------------------------ writing
    def _write(self, name: str, rows: list[dict], batch: str) -> int:
        if not rows:
            return 0
        by_phase: dict[int, list[dict]] = {}
        for r in rows:
            if r.get("phase") is None:
                raise StoreError(f"{name} row {r.get('episode_id') or r.get('task_id')}: field 'phase' is required")
            by_phase.setdefault(int(r["phase"]), []).append(r)
        for phase, prs in by_phase.items():
            folder = self.root / name / f"phase={phase}"
            folder.mkdir(parents=True, exist_ok=True)
            table = _to_table(name, prs, batch)
            final = folder / f"{batch}.parquet"
            tmp = folder / f"{batch}.parquet.tmp"
            pq.write_table(table, tmp, compression="zstd")
            with open(tmp, "rb") as fh:
                os.fsync(fh.fileno())
            os.replace(tmp, final)
        if name not in self._checked_file:  # once per table and store object: a first file, or a moved run dir
            self._checked_file.add(name)
            try:
                self.ensure_duckdb_file()
            except (duckdb.Error, OSError, StoreError):
                pass  # a convenience for the duckdb CLI: the Parquet files are the store, and reads name what is wrong
        return len(rows)

    def write_tasks(self, rows: Iterable[dict]) -> int:
        return self._write("tasks", [dict(r) for r in rows], _batch_id())

    def write_scores(self, rows: Iterable[dict]) -> int:
        rows = [{"step_idx": -1, "episode_id": None, "task_id": None, "model_id": "", **r} for r in rows]
        return self._write("scores", rows, _batch_id())

    @staticmethod
    def _digest(episode: dict, steps: list[dict]) -> str:
        ep = {k: v for k, v in episode.items() if k not in ("steps",)}
        return hashlib.sha256(json.dumps([ep, steps], sort_keys=True, default=str).encode()).hexdigest()

    def write_episode(self, episode: dict, steps: list[dict] | None = None) -> bool:
        """Atomically write one episode and its steps; returns False when identical content is already stored."""
        return self.write_episodes([(episode, steps if steps is not None else episode.get("steps", []))]) > 0

    def write_episodes(self, items: Iterable[tuple[dict, list[dict]]]) -> int:
        """Write several episodes in one batch (steps first, then episode rows). Returns the number written."""
        items = list(items)
        with self._lock:
            if self._digests is None:
                self._digests = self._load_digests()
            fresh = []
            for ep, steps in items:
                if not ep.get("episode_id"):
                    raise StoreError("episode without 'episode_id'")
                d = self._digest(ep, steps)
                if self._digests.get(ep["episode_id"]) == d:
                    continue
                fresh.append((ep, steps, d))
            if not fresh:
                return 0
            batch = _batch_id()
            step_rows = []
            for ep, steps, _ in fresh:
                for i, s in enumerate(steps):
                    row = {"idx": i, **s, "episode_id": ep["episode_id"], "phase": ep["phase"]}
                    step_rows.append(row)
            self._write("steps", step_rows, batch)
            ep_rows = [{k: v for k, v in ep.items() if k != "steps"} | {"n_steps": ep.get("n_steps", len(steps))}
                       for ep, steps, _ in fresh]
            self._write("episodes", ep_rows, batch)
            digest_rows = [{"kind": "_digest", "episode_id": ep["episode_id"], "phase": ep["phase"], "note": d}
                           for ep, _, d in fresh]
            self._write("scores", [{"step_idx": -1, "task_id": None, "model_id": "", **r} for r in digest_rows], batch)
            for ep, _, d in fresh:
                self._digests[ep["episode_id"]] = d
            return len(fresh)

    def _load_digests(self) -> dict[str, str]:
        if not self._has("scores"):
            return {}
        con = duckdb.connect()
        try:
            rows = con.execute(f"""SELECT episode_id, note FROM {self._source('scores')} WHERE kind = '_digest'
                                   QUALIFY row_number() OVER (PARTITION BY episode_id ORDER BY _batch DESC) = 1""").fetchall()
        except duckdb.Error as e:
            raise damaged_files_error(self.root, e) or e
        finally:
            con.close()
        return {e: n for e, n in rows}

    def update_episodes(self, updates: list[dict]) -> int:
        """Rewrite episode rows with some fields changed (e.g. orm_score/success after ORM labelling).

        The steps stay where they are: the new row's batch is ``<steps batch>-u<new id>``, which sorts after
        the original, and the steps view reads the part before ``-u`` to find the steps."""
        if not updates:
            return 0
        ids = [u["episode_id"] for u in updates]
        cur = {r["episode_id"]: r for r in self.sql(
            "SELECT * FROM episodes WHERE episode_id IN (SELECT unnest($ids))", {"ids": ids})}
        missing = sorted(set(ids) - set(cur))
        if missing:
            raise StoreError(f"update_episodes: unknown episode_id(s) {missing[:5]}")
        by_batch: dict[str, list[dict]] = {}
        for u in updates:
            row = {k: v for k, v in cur[u["episode_id"]].items() if not k.startswith("_")} | u
            by_batch.setdefault(cur[u["episode_id"]]["_batch"].split("-u")[0], []).append(row)
        for batch, rows in by_batch.items():
            self._write("episodes", rows, batch + "-u" + _batch_id())
        self._digests = None
        return len(updates)

    # ------------------------------------------------------------------ reading
    def _has(self, name: str) -> bool:
        return any((self.root / name).glob("phase=*/*.parquet"))

    def _source(self, name: str, root: Path | None = None) -> str:
        if self._has(name):
            glob = ((root or self.root) / name / "phase=*" / "*.parquet").as_posix()
            return f"read_parquet('{glob}', hive_partitioning=false, union_by_name=true)"
        cols = ", ".join(f"NULL::{_duck(f.type)} AS {f.name}" for f in list(SCHEMAS[name]) + _EXTRA)
        return f"(SELECT {cols} WHERE false)"

    def view_sql(self, absolute: bool = False) -> dict[str, str]:
        """SQL of the four deduplicated views (latest batch per key); ``absolute``: the files by absolute path (for
        a database file opened from anywhere)."""
        root = self.root.resolve() if absolute else None
        t, e, s, sc = (self._source(n, root) for n in ("tasks", "episodes", "steps", "scores"))
        # episodes: latest row per episode_id; updates carry "<batch>-u<new>" so they sort after the original.
        # The batch of the steps is the prefix before "-u".
        return {
            "tasks": f"SELECT * EXCLUDE (_schema) FROM {t} QUALIFY row_number() OVER "
                     f"(PARTITION BY task_id ORDER BY _batch DESC) = 1",
            "episodes": f"SELECT * EXCLUDE (_schema) FROM {e} QUALIFY row_number() OVER "
                        f"(PARTITION BY episode_id ORDER BY _batch DESC) = 1",
            "steps": f"SELECT s.* EXCLUDE (_schema) FROM {s} s SEMI JOIN (SELECT episode_id, "
                     f"split_part(max(_batch), '-u', 1) AS b FROM {e} GROUP BY episode_id) le "
                     f"ON s.episode_id = le.episode_id AND s._batch = le.b",
            "scores": f"SELECT * EXCLUDE (_schema) FROM {sc} WHERE kind <> '_digest' QUALIFY row_number() OVER "
                      f"(PARTITION BY kind, episode_id, step_idx, task_id, model_id ORDER BY _batch DESC) = 1",
        }

    def connect(self) -> duckdb.DuckDBPyConnection:
        """An in-memory DuckDB connection with the views (re)defined over the current files. A damaged Parquet
        file (cut short by a crash, a full disk or an interrupted copy) fails with a ``StoreError`` naming every
        damaged file and how to set it aside; nothing is changed or skipped silently."""
        con = duckdb.connect()
        try:
            for name, q in self.view_sql().items():
                con.execute(f"CREATE OR REPLACE VIEW {name} AS {q}")
        except duckdb.Error as e:
            con.close()
            raise damaged_files_error(self.root, e) or e
        return con

    def _duckdb_state(self) -> dict:
        return {"root": str(self.root.resolve()), "tables": [n for n in SCHEMAS if self._has(n)]}

    def ensure_duckdb_file(self) -> Path:
        """``refresh_duckdb_file`` when ``webrl.duckdb`` is missing or was written for other files: a table that had
        none has some now, or the run dir was moved or copied (its views name the files by absolute path). The views
        glob the files, so new files of a table need nothing."""
        path = self.root / DUCKDB_FILE
        try:
            old = json.loads((self.root / DUCKDB_STATE).read_text())
        except (OSError, ValueError):
            old = None
        if old != self._duckdb_state() or not path.is_file():
            self.refresh_duckdb_file()
        return path

    def refresh_duckdb_file(self) -> Path:
        """Write ``webrl.duckdb``: a DuckDB database that holds the four views (tasks, episodes, steps, scores) over
        this store's files, for the duckdb CLI (``duckdb <run_dir>/store/webrl.duckdb``). Written to a temporary
        file and renamed, under a lock, so a reader never sees half a file and a CLI that has the old one open does
        not block it. A damaged Parquet file fails with the ``StoreError`` that names it."""
        path = self.root / DUCKDB_FILE
        with open(self.root / f".{DUCKDB_FILE}.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # one writer at a time: the last rename carries the newest views
            state = self._duckdb_state()
            tmp = self.root / f".{DUCKDB_FILE}.{os.getpid()}-{threading.get_ident()}.tmp"
            try:
                con = duckdb.connect(str(tmp), config={"storage_compatibility_version": DUCKDB_STORAGE})
                try:
                    for name, q in self.view_sql(absolute=True).items():
                        con.execute(f"CREATE VIEW {name} AS {q}")
                finally:
                    con.close()
                os.replace(tmp, path)
            except duckdb.Error as e:
                raise damaged_files_error(self.root, e) or e
            finally:
                tmp.unlink(missing_ok=True)
                Path(f"{tmp}.wal").unlink(missing_ok=True)
            part = self.root / f".{DUCKDB_STATE}.{os.getpid()}-{threading.get_ident()}.tmp"
            part.write_text(json.dumps(state))
            os.replace(part, self.root / DUCKDB_STATE)
        return path

    def sql(self, query: str, params: dict | list | None = None) -> list[dict]:
        con = self.connect()
        try:
            rel = con.execute(query, params) if params is not None else con.execute(query)
            cols = [d[0] for d in rel.description] if rel.description else []
            return [dict(zip(cols, row)) for row in rel.fetchall()]
        except duckdb.Error as e:  # a file whose footer is fine but whose data is not fails only here
            raise damaged_files_error(self.root, e, full=True) or e
        finally:
            con.close()

    def arrow(self, query: str, params: dict | list | None = None) -> pa.Table:
        con = self.connect()
        try:
            return con.sql(query, params=params).to_arrow_table()
        finally:
            con.close()

    def cleanup_tmp(self) -> int:
        n = 0
        for p in self.root.glob("*/phase=*/*.parquet.tmp"):
            p.unlink(missing_ok=True)
            n += 1
        return n

    # ------------------------------------------------------------------ helpers the stages need
    def episodes(self, phase: int | None = None, purpose: str | None = None) -> list[dict]:
        q, p = "SELECT * FROM episodes WHERE 1=1", {}
        if phase is not None:
            q, p["phase"] = q + " AND phase = $phase", phase
        if purpose is not None:
            q, p["purpose"] = q + " AND purpose = $purpose", purpose
        return self.sql(q + " ORDER BY episode_id", p)

    def steps(self, phase: int | None = None, episode_ids: list[str] | None = None) -> list[dict]:
        q, p = "SELECT * FROM steps WHERE 1=1", {}
        if phase is not None:
            q, p["phase"] = q + " AND phase = $phase", phase
        if episode_ids is not None:
            q, p["ids"] = q + " AND episode_id IN (SELECT unnest($ids))", list(episode_ids)
        return self.sql(q + " ORDER BY episode_id, idx", p)

    def finished_episodes(self, episode_ids: list[str]) -> tuple[list[dict], dict[str, list[dict]]]:
        """The episodes among ``episode_ids`` that did not error (by id), and each one's steps (by index)."""
        eps = [e for e in self.sql("SELECT * FROM episodes WHERE episode_id IN (SELECT unnest($ids)) "
                                   "ORDER BY episode_id", {"ids": list(episode_ids)}) if e["status"] != "error"]
        by_episode: dict[str, list[dict]] = {}
        for s in self.steps(episode_ids=[e["episode_id"] for e in eps]):
            by_episode.setdefault(s["episode_id"], []).append(s)
        return eps, by_episode

    def tasks(self, phase: int | None = None, origin: str | None = None) -> list[dict]:
        q, p = "SELECT * FROM tasks WHERE 1=1", {}
        if phase is not None:
            q, p["phase"] = q + " AND phase = $phase", phase
        if origin is not None:
            q, p["origin"] = q + " AND origin = $origin", origin
        return self.sql(q + " ORDER BY task_id", p)

    REPLAY_SQL = """
        SELECT s.episode_id, s.idx, s.phase, s.prompt, s.response, e.intent, e.task_id
        FROM steps s JOIN episodes e USING (episode_id)
        WHERE e.success AND e.phase < $phase AND e.purpose IN ('rollout', 'bootstrap', 'oracle')
        AND ($lineage IS NULL OR (e.phase::VARCHAR || '|' || e.policy_digest) IN (SELECT unnest($lineage))
             OR starts_with(e.policy_digest, 'imported:'))
        ORDER BY s.episode_id, s.idx
    """

    def successful_steps(self, before_phase: int, lineage: list[str] | None = None) -> list[dict]:
        """Steps of successful episodes of phases < before_phase (the replay candidates); with ``lineage``
        (``"<phase>|<policy digest>"`` strings) only the episodes of those policies in those phases, plus
        imported traces (``store import-traces``: experience the user added on purpose)."""
        return self.sql(self.REPLAY_SQL, {"phase": before_phase, "lineage": lineage})

    def failed_intents(self, phase: int, purpose: str = "rollout") -> dict[str, list[dict]]:
        """Failed tasks of a phase grouped by site: {site: [{task_id, intent}]} (seeds of the next generation)."""
        rows = self.sql("""SELECT DISTINCT site, task_id, intent FROM episodes
                           WHERE phase = $phase AND purpose = $purpose AND success = false
                           ORDER BY site, task_id""", {"phase": phase, "purpose": purpose})
        out: dict[str, list[dict]] = {}
        for r in rows:
            out.setdefault(r["site"], []).append({"task_id": r["task_id"], "intent": r["intent"]})
        return out

    def success_rate(self, phase: int | None = None, purpose: str = "eval", policy_digest: str | None = None
                     ) -> list[dict]:
        """Per-site outcome counts per phase and policy: [{phase, policy_digest, site, n, successes, failures,
        unscored, errors, rate}]; ``rate`` = successes / (successes + failures): errored episodes and unscored ones
        (no env score and no label: the task needed an LLM judge and none was configured) are counted apart."""
        q = """SELECT phase, policy_digest, site, count(*) AS n,
                      count(*) FILTER (WHERE status <> 'error' AND success) AS successes,
                      count(*) FILTER (WHERE status <> 'error' AND NOT coalesce(success, false)
                                       AND (success IS NOT NULL OR env_score IS NOT NULL)) AS failures,
                      count(*) FILTER (WHERE status <> 'error' AND success IS NULL AND env_score IS NULL) AS unscored,
                      count(*) FILTER (WHERE status = 'error') AS errors,
                      avg(CASE WHEN success THEN 1.0 ELSE 0.0 END)
                          FILTER (WHERE status <> 'error' AND (success IS NOT NULL OR env_score IS NOT NULL)) AS rate
               FROM episodes WHERE purpose = $purpose"""
        p: dict[str, Any] = {"purpose": purpose}
        if phase is not None:
            q, p["phase"] = q + " AND phase = $phase", phase
        if policy_digest is not None:
            q, p["policy_digest"] = q + " AND policy_digest = $policy_digest", policy_digest
        return self.sql(q + " GROUP BY ALL ORDER BY phase, policy_digest, site", p)

    def error_episodes(self, phase: int | None = None) -> list[dict]:
        q, p = "SELECT episode_id, task_id, phase, purpose, error FROM episodes WHERE status = 'error'", {}
        if phase is not None:
            q, p["phase"] = q + " AND phase = $phase", phase
        return self.sql(q + " ORDER BY episode_id", p)

    def stats(self) -> dict[str, Any]:
        out: dict[str, Any] = {"root": str(self.root), "schema_version": SCHEMA_VERSION}
        for name in SCHEMAS:
            out[name] = self.sql(f"SELECT count(*) AS n FROM {name}")[0]["n"]
        out["by_phase"] = self.sql("""SELECT phase, purpose, policy_digest, count(*) AS episodes, sum(n_steps) AS steps,
                   avg(CASE WHEN success THEN 1.0 ELSE 0.0 END)
                       FILTER (WHERE status <> 'error' AND (success IS NOT NULL OR env_score IS NOT NULL)) AS success_rate,
                   sum(CASE WHEN status <> 'error' AND success IS NULL AND env_score IS NULL THEN 1 ELSE 0 END)
                       AS unscored,
                   sum(CASE WHEN status = 'error' THEN 1 ELSE 0 END) AS errors
                   FROM episodes GROUP BY ALL ORDER BY phase, purpose, policy_digest""")
        return out


def damaged_files(root: str | Path, full: bool = False) -> list[tuple[Path, str]]:
    """(file, reason) for every Parquet file of the store that cannot be read: its footer (cheap), and with
    ``full`` every row too (only when a query failed and no footer is damaged)."""
    bad = []
    for f in sorted(Path(root).glob("*/phase=*/*.parquet")):
        try:
            pq.read_table(f) if full else pq.read_metadata(f)
        except Exception as e:  # ArrowInvalid, OSError, ...: the file is what is wrong
            bad.append((f, (str(e).strip().splitlines() or [type(e).__name__])[0][:200]))
    return bad


def damaged_files_error(root: str | Path, err: Exception, full: bool = False) -> StoreError | None:
    """A ``StoreError`` naming the damaged files behind a DuckDB error, or None when every file reads fine (then
    the error is something else and is raised as it is)."""
    root = Path(root).resolve()
    bad = damaged_files(root)
    if not bad and full:
        bad = damaged_files(root, full=True)
    if not bad:
        return None
    batches = sorted({f.stem.split("-u")[0] for f, _ in bad})
    lines = [f"  {f}: {why}" for f, why in bad[:10]] + ([f"  ... and {len(bad) - 10} more"] if len(bad) > 10 else [])
    moves = [f"  cd {root} && for f in */phase=*/{b}*.parquet; do mkdir -p quarantine/$(dirname $f) && "
             f"mv $f quarantine/$f; done" for b in batches[:5]]
    return StoreError(
        f"store {root}: {len(bad)} damaged Parquet file(s) (cut short by a crash, a full disk or an interrupted copy?):\n"
        + "\n".join(lines) + "\nNothing was read, changed or skipped. Each file belongs to one write batch "
        f"({', '.join(batches[:5])}{', ...' if len(batches) > 5 else ''}); to go on without it, move the batch's "
        f"files aside (kept under {root / 'quarantine'}, which readers ignore); its episodes are then rolled out "
        f"again by the next run:\n" + "\n".join(moves) + f"\n(DuckDB said: {(str(err).strip().splitlines() or [''])[0][:200]})")


def _duck(t: pa.DataType) -> str:
    return {_S: "VARCHAR", _I: "BIGINT", _F: "DOUBLE", _B: "BOOLEAN"}[t]

"""The harness: run directories restored from the bootstrap snapshot, the clean run, one run per fault and the
re-run after it."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from benchmarks.faults.catalog import Fault
from benchmarks.faults.checks import check, collect
from benchmarks.faults.probes import HOLD_ENV, PHASE, PROBE_ENV, _times, stage_durations
from benchmarks.faults.procs import browser_pids, browsers_with_pages, descendants, kill_tree, sites_pids


def _env(root: Path, probes: Path | None = None, hold: str | None = None) -> dict:
    env = dict(os.environ, PREFECT_HOME=str(root / ".prefect"),
               PREFECT_RESULTS_LOCAL_STORAGE_PATH=str(root / ".prefect-results"),
               PREFECT_SERVER_ANALYTICS_ENABLED="false", TOKENIZERS_PARALLELISM="false")
    for k in ("PREFECT_API_URL", "MLFLOW_TRACKING_URI", PROBE_ENV, HOLD_ENV):
        env.pop(k, None)  # an ephemeral Prefect API and MLflow store per run
    if probes is not None:
        env[PROBE_ENV] = str(probes)
        if hold:
            env[HOLD_ENV] = hold
    return env


def webrl_command(probed: bool = False) -> list[str]:
    if probed:
        return [sys.executable, "-c", "from webrl_cli.probed import main; main()"]
    exe = Path(sys.executable).parent / "webrl"
    if exe.exists():
        return [str(exe)]
    return [sys.executable, "-c", "from webrl_cli.main import app; app(prog_name='webrl')"]


@dataclass
class RunOutcome:
    rc: int | None
    wall_s: float
    killed: bool = False
    injected: str = ""
    at_kill: dict = field(default_factory=dict)   # episode_id -> first write batch, stored when the fault hit
    survived: bool | None = None                   # process faults: did the flow finish by itself


class Harness:
    """The matrix's work directories and runs (see module docstring)."""

    def __init__(self, root: str | Path, config: str = "smoke", sets: list[str] | None = None,
                 fraction: float = 0.5, weight_tol: float = 0.0, timeout_s: float = 1800.0,
                 log: Callable[[str], None] = print, bootstrap_from: str | Path | None = None):
        self.root = Path(root).resolve()
        self.bootstrap_from = Path(bootstrap_from).resolve() if bootstrap_from else None
        self.config, self.sets = config, list(sets or [])
        self.fraction, self.weight_tol, self.timeout_s = fraction, weight_tol, timeout_s
        self.base, self.work, self.runs = self.root / "base", self.root / "work", self.root / "runs"
        self.probes = self.root / "probes"
        self.log = log
        self.clean: dict | None = None
        self.durations: dict[str, float] = {}
        self._stored_cache: dict = {}

    # -- layout
    @property
    def run_dir(self) -> Path:
        return self.work / "smoke"

    @property
    def cfg(self) -> Path:
        return self.work / "faults.yaml"

    def _write_cfg(self) -> None:
        import yaml

        self.work.mkdir(parents=True, exist_ok=True)
        self.cfg.write_text(yaml.safe_dump({"extends": self.config, "run": {"name": "smoke", "root": str(self.work)}}))

    def _args(self, *extra: str) -> list[str]:
        out = ["--config", str(self.cfg), *extra]
        for s in self.sets:
            out += ["--set", s]
        return out

    def _restore(self) -> None:
        if self.work.exists():
            shutil.rmtree(self.work)
        subprocess.run(["cp", "-a", str(self.base), str(self.work)], check=True)
        if self.probes.exists():
            shutil.rmtree(self.probes)
        self.probes.mkdir(parents=True)

    def _stash(self, name: str) -> Path:
        dst = self.runs / name
        if dst.exists():
            shutil.rmtree(dst)
        dst.parent.mkdir(parents=True, exist_ok=True)
        os.replace(self.work, dst)
        if self.probes.exists():
            os.replace(self.probes, dst / "probes")
        return dst

    def bootstrap(self) -> float:
        """Phase 0 into the snapshot (reused when ``<root>/base`` holds one for the same config): ``webrl bootstrap``,
        or a fork of ``bootstrap_from``'s phase 0 (webrl_core.experiments.ablation.fork_bootstrap)."""
        stamp = json.dumps({"config": self.config, "sets": self.sets,
                            "bootstrap_from": str(self.bootstrap_from or "")})
        done = self.base / ".faults-bootstrap"
        if done.exists() and done.read_text() == stamp:
            self.log(f"bootstrap: reusing {self.base}")
            return 0.0
        for p in (self.base, self.work):
            if p.exists():
                shutil.rmtree(p)
        self._write_cfg()
        t0 = time.perf_counter()
        if self.bootstrap_from is not None:
            self._fork(self.bootstrap_from)
        else:
            r = self._run(webrl_command() + ["bootstrap", *self._args()], self.root / "bootstrap.log")
            if r.rc != 0:
                raise RuntimeError(f"webrl bootstrap failed (exit {r.rc}); see {self.root / 'bootstrap.log'}")
        (self.work / ".faults-bootstrap").write_text(stamp)
        os.replace(self.work, self.base)
        wall = time.perf_counter() - t0
        self.log(f"bootstrap: {wall:.0f} s")
        return wall

    def _fork(self, src: Path) -> None:
        from webrl_core.experiments.ablation import fork_bootstrap

        mark = fork_bootstrap(src, self.run_dir)
        for name in mark["models"]:  # absolute links: the rows' copies of the run dir sit at other depths
            link = self.run_dir / "models" / name
            target = link.resolve()
            link.unlink()
            link.symlink_to(target)
        self.log(f"bootstrap: phase 0 forked from {src}")

    # -- one command
    def _run(self, cmd: list[str], log: Path, probes: bool = False, hold: str | None = None,
             trigger: Callable[[subprocess.Popen, float], dict | None] | None = None) -> RunOutcome:
        env = _env(self.work, self.probes if probes else None, hold)
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as out:
            out.write(f"\n$ {' '.join(cmd)}\n".encode())
            out.flush()
            t0 = time.perf_counter()
            proc = subprocess.Popen(cmd, env=env, cwd=str(self.work if self.work.exists() else self.root),
                                    stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        outcome = RunOutcome(rc=None, wall_s=0.0)
        try:
            while proc.poll() is None:
                if time.perf_counter() - t0 > self.timeout_s:
                    kill_tree(proc)
                    raise TimeoutError(f"{' '.join(cmd[-6:])} ran past {self.timeout_s:.0f} s; see {log}")
                if trigger is not None:
                    hit = trigger(proc, t0)
                    if hit is not None:
                        outcome.injected = hit.get("injected", "")
                        outcome.at_kill = hit.get("at_kill", {})
                        if hit.get("killed"):
                            outcome.killed = True
                            kill_tree(proc)
                            break
                        if not getattr(trigger, "watch", False):  # a process fault: the flow goes on
                            trigger = None
                time.sleep(getattr(trigger, "poll_s", 0.25) if trigger is not None else 0.25)
        except BaseException:
            if proc.poll() is None:
                kill_tree(proc)
            raise
        outcome.rc = proc.wait()
        outcome.wall_s = time.perf_counter() - t0
        if not outcome.killed:
            for p in descendants(proc.pid):  # nothing of a finished flow may linger (none should)
                try:
                    os.kill(p, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        return outcome

    def phase(self, log: Path, probes: bool = False, hold: str | None = None, trigger=None) -> RunOutcome:
        return self._run(webrl_command(probes) + ["phase", *self._args("--phase", str(PHASE))], log, probes, hold,
                         trigger)

    # -- stored episodes while a run is going on
    def _stored(self, purpose: str) -> dict[str, str]:
        """{episode_id: first write batch} of the phase's episodes of ``purpose`` stored without error."""
        import duckdb

        files = self.run_dir / "store" / "episodes" / f"phase={PHASE}"
        names = tuple(sorted(p.name for p in files.glob("*.parquet"))) if files.exists() else ()
        if not names:
            return {}
        key = (purpose, names)
        if key in self._stored_cache:
            return self._stored_cache[key]
        rows = None
        for _ in range(5):  # a file renamed into place while duckdb globbed: read again
            con = duckdb.connect()
            try:
                rows = con.execute(f"""SELECT episode_id, min(_batch) FROM read_parquet('{files.as_posix()}/*.parquet',
                                       union_by_name=true) WHERE purpose = ? AND status <> 'error'
                                       GROUP BY episode_id""", [purpose]).fetchall()
                break
            except duckdb.Error:
                time.sleep(0.05)
            finally:
                con.close()
        if rows is None:
            return {}
        self._stored_cache = {key: {e: b.split("-u")[0] for e, b in rows}}
        return self._stored_cache[key]

    def _n_planned(self, purpose: str) -> int:
        if purpose == "rollout":
            p = self.run_dir / "tasks" / f"phase={PHASE}" / "tasks.json"
        else:
            p = self.run_dir / "tasks" / "test.json"
        try:
            return len(json.loads(p.read_text()))
        except (OSError, ValueError):
            return 0

    # -- triggers
    def _stage_trigger(self, fault: Fault):
        clean = self.durations.get(fault.target, 0.0)
        delay = self.fraction * clean

        def trigger(proc, t0):
            enter = _times(self.probes, fault.target, "enter")
            if not enter or time.time() - enter[0] < delay:
                return None
            done = bool(_times(self.probes, fault.target, "exit"))
            into = time.time() - enter[0]
            how = "after its work, before its result was recorded" if done else f"clean run: {clean:.1f} s"
            return {"killed": True, "injected": f"{into:.1f} s into {fault.stage} ({how})",
                    "at_kill": self._stored("rollout")}
        trigger.poll_s = 0.05  # stages of a second or less
        return trigger

    def _episodes_trigger(self, fault: Fault):
        purpose = fault.target.split(".")[1]

        def trigger(proc, t0):
            if not _times(self.probes, fault.target, "enter"):
                return None
            stored = self._stored(purpose)
            if not stored:
                return None
            n = self._n_planned(purpose)
            return {"killed": True, "injected": f"{len(stored)}/{n} {purpose} episodes stored",
                    "at_kill": {**self._stored("rollout"), **self._stored("eval")}}
        return trigger

    def _process_trigger(self, fault: Fault):
        """Kill one process of the ``fault.purpose`` rollout once its browsers have run half a second (episodes in
        flight: a smoke episode lasts a few seconds, an evaluation episode about one, so there at once) and not all
        its episodes are stored; then watch, until that rollout ends, for the replacement the pipeline starts."""
        settle_s = 0.5 if fault.purpose == "rollout" else 0.0
        seen: dict[int, float] = {}
        state: dict[str, Any] = {"victim": None, "new": set()}
        probe = f"rollout.{fault.purpose}"

        def pids(proc) -> list[int]:
            return browser_pids(proc.pid) if fault.target == "chromium" else sites_pids(proc.pid)

        def trigger(proc, t0):
            if state["victim"] is not None:  # after the kill: a relaunched browser / a new sites server
                ended = (len(_times(self.probes, probe, "exit")) + len(_times(self.probes, probe, "error"))
                         >= len(_times(self.probes, probe, "enter")))
                if not ended:
                    state["new"].update(p for p in pids(proc) if p not in seen)
                return None
            enter = _times(self.probes, probe, "enter")
            if not enter:
                return None
            now = time.time()
            browsers = browser_pids(proc.pid)
            for p in set(browsers) | set(pids(proc)):
                seen.setdefault(p, now)
            if not any(now - seen[p] >= settle_s for p in browsers):
                return None
            victims = [p for p in pids(proc) if now - seen[p] >= settle_s]
            if fault.target == "chromium":  # one whose episodes are in flight
                victims = [p for p in browsers_with_pages(proc.pid) if p in victims]
            stored = self._stored(fault.purpose)
            n = self._n_planned(fault.purpose)
            if not victims or len(stored) >= n:
                return None
            try:
                os.kill(victims[0], signal.SIGKILL)
            except ProcessLookupError:
                return None
            state["victim"] = victims[0]
            what = "Chromium browser" if fault.target == "chromium" else "sites server"
            return {"killed": False, "at_kill": {**self._stored("rollout"), **self._stored("eval")},
                    "injected": f"{what} pid {victims[0]}, {now - enter[0]:.1f} s into the {fault.purpose}, "
                                f"{len(stored)}/{n} {fault.purpose} episodes stored"}
        trigger.watch = True
        trigger.state = state
        trigger.poll_s = 0.1
        return trigger

    # -- the matrix
    def run_clean(self) -> dict:
        self._restore()
        r = self.phase(self.root / "logs" / "clean.log", probes=True)
        if r.rc != 0:
            raise RuntimeError(f"the clean phase {PHASE} failed (exit {r.rc}); see {self.root / 'logs' / 'clean.log'}")
        self.durations = stage_durations(self.probes)
        facts = collect(self.run_dir)
        facts["wall_s"] = r.wall_s
        facts["durations"] = self.durations
        facts["shard_attempts"] = {p: len(_times(self.probes, f"rollout.{p}", "enter")) for p in ("rollout", "eval")}
        dst = self._stash("clean")
        (dst / "facts.json").write_text(json.dumps(facts, indent=1, sort_keys=True))
        facts["dir"] = str(dst)
        self.clean = facts
        self.log(f"clean phase {PHASE}: {r.wall_s:.0f} s; stages: "
                 + ", ".join(f"{k} {v:.1f} s" for k, v in sorted(self.durations.items(), key=lambda kv: kv[1])))
        return facts

    def run_fault(self, fault: Fault, keep: bool = False) -> dict:
        assert self.clean is not None, "run_clean first"
        self._restore()
        log = self.root / "logs" / f"{fault.name}.log"
        if log.exists():
            log.unlink()
        if fault.kind == "stage":
            first = self.phase(log, probes=True, hold=fault.target, trigger=self._stage_trigger(fault))
        elif fault.kind == "episodes":
            first = self.phase(log, probes=True, hold=fault.target, trigger=self._episodes_trigger(fault))
        else:
            trigger = self._process_trigger(fault)
            first = self.phase(log, probes=True, trigger=trigger)
            first.survived = first.rc == 0
            if first.injected:
                kind = "browser launched" if fault.target == "chromium" else "sites server started"
                n_new = len(trigger.state["new"])
                first.injected += (f"; {n_new} new {kind} during the {fault.purpose}" if n_new
                                   else f"; no new {kind} during the {fault.purpose}")
        attempts = {p: len(_times(self.probes, f"rollout.{p}", "enter")) for p in ("rollout", "eval")}
        row: dict[str, Any] = {"fault": fault.name, "title": fault.title, "injected": first.injected or "not injected",
                               "first_rc": first.rc, "first_wall_s": first.wall_s, "survived": first.survived,
                               "shard_retries": {p: n - self.clean["shard_attempts"][p] for p, n in attempts.items()
                                                 if n > self.clean["shard_attempts"][p]}}
        rerun = None
        if first.killed or first.rc != 0:
            rerun = self.phase(log)
            row.update(rerun_rc=rerun.rc, rerun_wall_s=rerun.wall_s, rerun_tasks=task_states(self.work / ".prefect"))
        row["resumed_by"] = ("re-run" if rerun is not None else "flow itself")
        problems: list[str] = []
        if not first.injected:
            problems.append("fault not injected (the stage or process never showed up)")
        final_rc = rerun.rc if rerun is not None else first.rc
        facts = None
        if final_rc != 0:
            problems.append(f"{'re-run' if rerun else 'run'} failed with exit {final_rc} (see {log})")
            checks = {}
        else:
            facts = collect(self.run_dir)
            with open(log, "a") as out, contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
                checks = check(facts, self.clean, first.at_kill, self.run_dir, self.weight_tol)
            problems += [f"{k}: {v['why']}" for k, v in checks.items() if not v["ok"]]
        row["checks"] = checks
        row["ok"] = not problems
        row["why"] = "; ".join(problems)
        if keep or not row["ok"]:
            dst = self._stash(fault.name)
            (dst / "row.json").write_text(json.dumps(row, indent=1, default=str))
            if facts is not None:
                (dst / "facts.json").write_text(json.dumps(facts, indent=1, sort_keys=True))
            row["dir"] = str(dst)
        else:
            shutil.rmtree(self.work, ignore_errors=True)
        return row


def task_states(prefect_home: Path, flow: str = "webrl-phase") -> dict[str, list[str]]:
    """{state: [task names]} of the latest run of ``flow`` in a Prefect home's database (what a re-run took from
    the cache and what it ran again)."""
    db = prefect_home / "prefect.db"
    if not db.exists():
        return {}
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        fr = con.execute("""SELECT flow_run.id FROM flow_run JOIN flow ON flow.id = flow_run.flow_id
                            WHERE flow.name = ? ORDER BY flow_run.created DESC LIMIT 1""", (flow,)).fetchone()
        rows = con.execute("SELECT name, state_name FROM task_run WHERE flow_run_id = ? ORDER BY start_time",
                           (fr[0],)).fetchall() if fr else []
    except sqlite3.Error:
        return {}
    finally:
        con.close()
    out: dict[str, list[str]] = {}
    for name, state in rows:
        out.setdefault(state or "?", []).append(name.rsplit("-", 1)[0])
    return out

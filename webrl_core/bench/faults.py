"""`webrl bench faults`: the fault matrix. Inject one fault into a WebRL phase, re-run the same command,
check the outcome against a clean run of the same phase.

Method (every run drives the ``webrl`` command line as a subprocess with its own Prefect home)::

    <root>/base   `webrl bootstrap` once (phase 0), kept as a snapshot
    <root>/work   where every phase 1 runs: restored from the snapshot (cp -a) before each run, so every run has
                  the same absolute paths, run id, SFT actor and Prefect database: the same cache keys, policy
                  digests and episode ids as the clean run
    <root>/runs   finished runs (the clean reference always; the fault rows with --keep)

1. Clean reference: ``webrl phase --phase 1`` from the snapshot, with probes that only record when each stage
   function of ``webrl_core.stages`` starts and ends (files under ``<root>/probes``).
2. Per fault: the same command from the snapshot, with the same probes, and the fault injected:

   * ``kill -9`` of the flow's whole process tree (flow, Prefect's server, Playwright, Chromium, sites) while a
     stage runs: ``fraction`` x the stage's clean duration after it started. The probe holds a killed stage at
     its end until the kill lands, so the kill always precedes Prefect's record of the stage's result (a
     stage faster than the delay is killed after its work, before the result was persisted);
   * mid-rollout / mid-evaluation: ``kill -9`` as soon as at least one of the rollout's episodes is stored;
   * one Chromium browser process (``kill -9`` of the main process of a browser that renders a page) or the
     embedded sites' server process, once the rollout's browsers have run for half a second (the evaluation's
     server as soon as its browser is up: its later episodes need the server); the flow itself is left alone and
     the row reports whether a new browser / server was started while that rollout ran.

   Then the same ``webrl phase`` command again (no probes) when the first run did not finish by itself; the
   row records which Prefect tasks the re-run took from the cache and which it ran again.
3. Checks of each run against the clean one (and against the run's own planned episodes):

   * ``tasks``: ``tasks/phase=1/tasks.json`` equals the clean one byte for byte;
   * ``lost``: every planned episode (tasks x phase-start policy x settings; test set x the run's phase-1 actor)
     is stored, not errored, and the rollout's ids equal the clean run's;
   * ``doubled``: no (episode, step) twice, steps per episode = ``n_steps``, no finished episode written twice
     (an episode is written again only when its earlier write was an error), and the episodes stored before
     the kill kept their first write;
   * ``stale``: no phase-1 episode outside the planned ids; every rollout episode's ``policy_digest`` is
     ``hf:`` + the digest of ``models/phase=0/actor``, every eval episode's the digest of
     ``models/phase=1/actor``; ``eval/phase=1.json`` names that policy and exactly those episodes; every
     rollout episode carries its ORM label; no stored step was observed on Chromium's error page for an
     unreachable server (an episode that went on after its site died would look like a plain failure);
   * ``artifacts``: where the run's rollout trajectories equal the clean run's (the same responses at every
     step), ``samples.jsonl`` and ``replay.jsonl`` by sha256, critic and actor by the largest absolute weight
     difference (<= ``weight_tol``, default 0: training on CPU is bit-reproducible here) and the evaluation's
     solved count. Rollouts sample at ``policy.temperature`` from torch's global RNG, shared by the
     concurrent shards and by batches whose make-up depends on timing, so two clean runs already differ
     there; then every downstream artifact is compared with a recomputation from the run's own stored
     episodes instead (``webrl_core.experiments.reproduce``: transitions -> replay -> critic -> actor, same tolerance;
     the ORM's P(YES) re-scored, 1e-6; the evaluation's counts recomputed from its stored episodes).
     With ``--set policy.temperature=0`` the rollouts are greedy and were measured identical across runs
     (kill and resume included), and then every artifact is compared with the clean run's.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import webrl_core.pipeline.bootstrap  # noqa: F401 -- each stage module registers its stages in STAGES
import webrl_core.pipeline.evaluation  # noqa: F401
import webrl_core.pipeline.experience  # noqa: F401
import webrl_core.pipeline.generation  # noqa: F401
import webrl_core.pipeline.task_sets  # noqa: F401
import webrl_core.pipeline.updates  # noqa: F401
from webrl_core.pipeline.stage import STAGES
from webrl_core.agent.rollout_policy import rollout_identity
from webrl_core.runs.rundir import model_ref

PHASE = 1
PROBE_ENV, HOLD_ENV = "WEBRL_FAULT_PROBES", "WEBRL_FAULT_HOLD"
HOLD_S = 1800.0
PROBED = ("generate_tasks", "filter_tasks", "materialise_tasks", "rollout", "orm_label", "phase_transitions",
          "replay_transitions", "update_critic", "update_actor", "evaluate")


@dataclass(frozen=True)
class Fault:
    name: str
    title: str
    kind: str     # stage | episodes | process
    target: str   # the probe (stage function, or rollout.<purpose>) or the process to kill (chromium | sites)
    stage: str    # the Prefect task it hits, for the table
    purpose: str = "rollout"  # process faults: the rollout whose processes are killed (rollout | eval)


FAULTS: tuple[Fault, ...] = (
    Fault("generate", "kill -9 of the flow during task generation", "stage", "generate_tasks", "generate-tasks"),
    Fault("rollout", "kill -9 of the flow mid-rollout", "episodes", "rollout.rollout", "rollout-shard"),
    Fault("orm", "kill -9 of the flow during ORM labelling", "stage", "orm_label", "orm-label"),
    Fault("replay", "kill -9 of the flow during replay selection", "stage", "replay_transitions", "replay-selection"),
    Fault("critic", "kill -9 of the flow during critic training", "stage", "update_critic", "train-critic"),
    Fault("actor", "kill -9 of the flow during actor training", "stage", "update_actor", "train-actor"),
    Fault("eval", "kill -9 of the flow mid-evaluation", "episodes", "rollout.eval", "evaluate"),
    Fault("chromium", "kill -9 of one Chromium browser mid-episode", "process", "chromium", "rollout-shard"),
    Fault("sites", "kill -9 of the embedded sites' server mid-rollout", "process", "sites", "rollout-shard"),
    Fault("sites-eval", "kill -9 of the embedded sites' server mid-evaluation (later episodes need it)", "process",
          "sites", "evaluate", "eval"),
)
FAULT_NAMES = tuple(f.name for f in FAULTS)


# ------------------------------------------------------------------------------------------- probes
def _probe_name(fn: str, args: tuple, kwargs: dict) -> str:
    if fn == "rollout":  # rollout(settings, run_dir, phase, purpose, tasks_ref, actor_ref, temperature, shard, n)
        purpose = args[3] if len(args) > 3 else kwargs.get("purpose")
        shard = args[7] if len(args) > 7 else kwargs.get("shard", 0)
        return f"rollout.{purpose}.{shard}"
    return fn


def _mark(folder: Path, probe: str, event: str) -> None:
    with open(folder / f"{probe}.{event}", "a") as fh:
        fh.write(f"{time.time():.3f}\n")


def install_probes(folder: str | Path, hold: str | None = None) -> None:
    """Wrap the stage functions of ``webrl_core.pipeline`` (in their modules) so each writes ``<probe>.enter`` / ``.exit`` / ``.error``
    (a time per call) into ``folder``; a probe named by ``hold`` (or under it: ``rollout.eval`` holds every
    eval shard) then waits at its end, so the harness's kill lands before the flow records the result. Nothing
    else changes: the Prefect task wrappers, their sources and their inputs (the cache keys) are the same."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)

    def wrap(name: str, orig: Callable) -> Callable:
        @functools.wraps(orig)
        def probed(*args, **kwargs):
            probe = _probe_name(name, args, kwargs)
            _mark(folder, probe, "enter")
            try:
                out = orig(*args, **kwargs)
            except BaseException as e:
                _mark(folder, probe, "error")
                with open(folder / f"{probe}.error.txt", "a") as fh:
                    fh.write(f"{type(e).__name__}: {e}\n")
                raise
            _mark(folder, probe, "exit")
            if hold and (probe == hold or probe.startswith(hold + ".")):
                time.sleep(HOLD_S)
            return out
        return probed

    for name in PROBED:
        module = sys.modules[STAGES[name].__module__]
        setattr(module, name, wrap(name, getattr(module, name)))


def _times(folder: Path, probe: str, event: str) -> list[float]:
    """Times of a probe's event, every call of every probe under ``probe`` (``rollout.rollout`` = all shards)."""
    out: list[float] = []
    for f in folder.glob(f"{probe}*.{event}"):
        stem = f.name[: -len(event) - 1]
        if stem == probe or stem.startswith(probe + "."):
            out += [float(x) for x in f.read_text().split()]
    return sorted(out)


def stage_durations(folder: Path) -> dict[str, float]:
    """Clean duration of each probe (first enter to last exit), from a probed run."""
    out = {}
    for f in folder.glob("*.enter"):
        probe = f.name[:-6]
        enter, exit_ = _times(folder, probe, "enter"), _times(folder, probe, "exit")
        if enter and exit_:
            out[probe] = exit_[-1] - enter[0]
    for agg in ("rollout.rollout", "rollout.eval"):
        enter, exit_ = _times(folder, agg, "enter"), _times(folder, agg, "exit")
        if enter and exit_:
            out[agg] = exit_[-1] - enter[0]
    return out


# ------------------------------------------------------------------------------------------- processes
def _proc_table() -> dict[int, tuple[int, str]]:
    out = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                stat = f.read()
            with open(f"/proc/{d}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        out[int(d)] = (int(stat[stat.rindex(")") + 2:].split()[1]), cmd)
    return out


def descendants(pid: int) -> dict[int, str]:
    """{pid: command line} of every process below ``pid``."""
    table = _proc_table()
    children: dict[int, list[int]] = {}
    for p, (pp, _) in table.items():
        children.setdefault(pp, []).append(p)
    out, todo = {}, [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out[c] = table[c][1]
            todo.append(c)
    return out


def kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL a flow and everything below it (its process group, then any descendant in another group)."""
    below = descendants(proc.pid)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    for p in below:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait()


def browser_pids(pid: int) -> list[int]:
    """Main process of each Chromium browser below ``pid`` (a chromium whose command line has no ``--type=``:
    renderers, GPU and utility processes have one)."""
    return sorted(p for p, cmd in descendants(pid).items()
                  if "chrom" in cmd.split(" ", 1)[0].rsplit("/", 1)[-1] and "--type=" not in cmd)


def browsers_with_pages(pid: int) -> list[int]:
    """The browsers below ``pid`` that render a page right now (a ``--type=renderer`` child): their episodes are in
    flight, where a browser without one is idle or closing."""
    return sorted(b for b in browser_pids(pid) if any("--type=renderer" in c for c in descendants(b).values()))


def sites_pids(pid: int) -> list[int]:
    return sorted(p for p, cmd in descendants(pid).items() if "_serve_child" in cmd)


# ------------------------------------------------------------------------------------------- run directories
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
                 log: Callable[[str], None] = print):
        self.root = Path(root).resolve()
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
        """Phase 0 into the snapshot (reused when ``<root>/base`` holds one for the same config)."""
        stamp = json.dumps({"config": self.config, "sets": self.sets})
        done = self.base / ".faults-bootstrap"
        if done.exists() and done.read_text() == stamp:
            self.log(f"bootstrap: reusing {self.base}")
            return 0.0
        for p in (self.base, self.work):
            if p.exists():
                shutil.rmtree(p)
        self._write_cfg()
        t0 = time.perf_counter()
        r = self._run(webrl_command() + ["bootstrap", *self._args()], self.root / "bootstrap.log")
        if r.rc != 0:
            raise RuntimeError(f"webrl bootstrap failed (exit {r.rc}); see {self.root / 'bootstrap.log'}")
        (self.work / ".faults-bootstrap").write_text(stamp)
        os.replace(self.work, self.base)
        wall = time.perf_counter() - t0
        self.log(f"bootstrap: {wall:.0f} s")
        return wall

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


# ------------------------------------------------------------------------------------------- facts and checks
def _digest(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


def collect(run: str | Path) -> dict:
    """What the checks need from a finished phase-1 run directory (plain JSON)."""
    import duckdb

    from webrl_core.artifacts import ArtifactRef, read_json, sha256_path
    from webrl_core.config import load_config
    from webrl_core.env.rollout import plan_episode_ids
    from webrl_core.runs.store import TrajectoryStore

    run = Path(run)
    s = load_config(run / "config.yaml")
    models = run / "models"
    a0 = ArtifactRef.of(models / "phase=0" / "actor", "model")
    a1 = ArtifactRef.of(models / f"phase={PHASE}" / "actor", "model")
    tasks = read_json(run / "tasks" / f"phase={PHASE}" / "tasks.json")
    test = read_json(run / "tasks" / "test.json")
    planned_r = plan_episode_ids(tasks, phase=PHASE, purpose="rollout", seed=s.run.seed,
                                 **rollout_identity(s, a0, s.policy.temperature, "rollout"))
    planned_e = plan_episode_ids(test, phase=PHASE, purpose="eval", seed=s.run.seed,
                                 **rollout_identity(s, a1, s.policy.eval_temperature, "eval"))
    store = TrajectoryStore(run)
    eps = store.sql("""SELECT episode_id, purpose, status, policy_digest, n_steps, env_score, orm_score, success
                       FROM episodes WHERE phase = $p ORDER BY episode_id""", {"p": PHASE})
    steps = {r["episode_id"]: r for r in store.sql(
        """SELECT episode_id, count(*) AS n, count(DISTINCT idx) AS n_idx, list(response ORDER BY idx) AS responses
           FROM steps WHERE phase = $p GROUP BY episode_id""", {"p": PHASE})}
    files = (run / "store" / "episodes" / f"phase={PHASE}").as_posix()
    con = duckdb.connect()
    try:  # every original write of an episode (updates carry '-u' in their batch)
        writes = con.execute(f"""SELECT episode_id, _batch, status FROM read_parquet('{files}/*.parquet',
                                 union_by_name=true) WHERE _batch NOT LIKE '%-u%'
                                 ORDER BY episode_id, _batch""").fetchall()
    finally:
        con.close()
    by_writes: dict[str, list] = {}
    for e, b, st in writes:
        by_writes.setdefault(e, []).append([b, st])
    # steps observed on Chromium's error page for an unreachable server: an episode that went on after its site died
    unreachable = [r["episode_id"] for r in store.sql(
        """SELECT DISTINCT episode_id FROM steps WHERE phase = $p AND (url LIKE 'chrome-error:%'
           OR regexp_matches(coalesce(html, ''), 'ERR_CONNECTION_(REFUSED|RESET|CLOSED)|ERR_EMPTY_RESPONSE'))""",
        {"p": PHASE})]
    ev = read_json(run / "eval" / f"phase={PHASE}.json")
    for e in eps:
        st = steps.get(e["episode_id"], {})
        e["steps_rows"], e["steps_idx"] = st.get("n", 0), st.get("n_idx", 0)
        e["trajectory"] = _digest([st.get("responses", []), e["env_score"], e["status"]])
    rollout_eps = [e for e in eps if e["purpose"] == "rollout"]
    return {
        "run_dir": str(run), "tasks_sha": sha256_path(run / "tasks" / f"phase={PHASE}" / "tasks.json"),
        "actor0": f"hf:{a0.sha256}", "actor1": f"hf:{a1.sha256}",
        "critic1": sha256_path(models / f"phase={PHASE}" / "critic"),
        "samples_sha": sha256_path(run / "data" / f"phase={PHASE}" / "samples.jsonl"),
        "replay_sha": sha256_path(run / "data" / f"phase={PHASE}" / "replay.jsonl"),
        "planned_rollout": sorted(planned_r), "planned_eval": sorted(planned_e), "episodes": eps,
        "writes": by_writes, "orm_threshold": s.orm.threshold, "unreachable": sorted(unreachable),
        "rollout_trajectories": _digest(sorted((e["episode_id"], e["trajectory"]) for e in rollout_eps)),
        "eval_json": {k: ev.get(k) for k in ("success_rate", "total", "policy_digest", "episode_ids")},
    }


def _ok(ok: bool, why: str = "", **info) -> dict:
    return {"ok": bool(ok), "why": "" if ok else why, **info}


def check(f: dict, c: dict, at_kill: dict, run: Path, weight_tol: float = 0.0) -> dict[str, dict]:
    """The row's checks: run facts ``f`` against the clean run's ``c`` (see module docstring)."""
    eps = {e["episode_id"]: e for e in f["episodes"]}
    roll = {i for i, e in eps.items() if e["purpose"] == "rollout"}
    evl = {i for i, e in eps.items() if e["purpose"] == "eval"}
    c_roll = {e["episode_id"] for e in c["episodes"] if e["purpose"] == "rollout"}
    c_eval = {e["episode_id"] for e in c["episodes"] if e["purpose"] == "eval"}
    out: dict[str, dict] = {}
    out["tasks"] = _ok(f["tasks_sha"] == c["tasks_sha"], "tasks/phase=1/tasks.json differs from the clean run's")

    missing = (set(f["planned_rollout"]) - roll) | (set(f["planned_eval"]) - evl)
    errored = sorted(i for i, e in eps.items() if e["status"] == "error")
    why = []
    if missing:
        why.append(f"{len(missing)} planned episode(s) not stored, e.g. {sorted(missing)[:2]}")
    if errored:
        why.append(f"{len(errored)} episode(s) left errored, e.g. {errored[:2]}")
    if roll != c_roll:
        why.append(f"rollout ids differ from the clean run's ({len(roll ^ c_roll)} not in both)")
    if len(evl) != len(c_eval) or (f["actor1"] == c["actor1"] and evl != c_eval):
        why.append(f"eval ids differ from the clean run's ({len(evl)} vs {len(c_eval)} episodes)")
    out["lost"] = _ok(not why, "; ".join(why), rollout=len(roll), eval=len(evl))

    why = []
    bad_steps = [i for i, e in eps.items() if e["status"] != "error" and
                 not (e["steps_rows"] == e["steps_idx"] == e["n_steps"])]
    if bad_steps:
        why.append(f"{len(bad_steps)} episode(s) whose steps are doubled or missing, e.g. {bad_steps[:2]}")
    rewritten = [i for i, w in f["writes"].items() if len(w) > 1 and any(st != "error" for _, st in w[:-1])]
    if rewritten:
        why.append(f"{len(rewritten)} finished episode(s) rolled out again, e.g. {rewritten[:2]}")
    last = {i: w[-1][0] for i, w in f["writes"].items()}
    redone = [i for i, b in at_kill.items() if last.get(i) != b]
    if redone:
        why.append(f"{len(redone)} of the {len(at_kill)} episodes stored before the fault were written again")
    out["doubled"] = _ok(not why, "; ".join(why), kept_from_before=len(at_kill) - len(redone),
                         rewritten_errors=sum(1 for w in f["writes"].values() if len(w) > 1))

    why = []
    extra = set(eps) - set(f["planned_rollout"]) - set(f["planned_eval"])
    if extra:
        why.append(f"{len(extra)} phase-1 episode(s) outside the planned ids, e.g. {sorted(extra)[:2]}")
    wrong_r = [i for i in roll if eps[i]["policy_digest"] != f["actor0"]]
    wrong_e = [i for i in evl if eps[i]["policy_digest"] != f["actor1"]]
    if wrong_r:
        why.append(f"{len(wrong_r)} rollout episode(s) not of the phase-0 actor")
    if wrong_e:
        why.append(f"{len(wrong_e)} eval episode(s) not of the phase-1 actor")
    ev = f["eval_json"]
    if ev["policy_digest"] != f["actor1"]:
        why.append("eval/phase=1.json names another policy than models/phase=1/actor")
    if sorted(ev["episode_ids"] or []) != sorted(f["planned_eval"]):
        why.append("eval/phase=1.json lists other episodes than the actor's planned ones")
    if f["unreachable"]:
        why.append(f"{len(f['unreachable'])} stored episode(s) with steps on an unreachable site's error page, "
                   f"e.g. {f['unreachable'][:2]}")
    unlabelled = [i for i in roll if eps[i]["status"] != "error" and (
        eps[i]["orm_score"] is None or eps[i]["success"] != (eps[i]["orm_score"] >= f["orm_threshold"]))]
    if unlabelled:
        why.append(f"{len(unlabelled)} rollout episode(s) without a current ORM label")
    out["stale"] = _ok(not why, "; ".join(why))

    out["artifacts"] = _artifacts(f, c, run, weight_tol)
    return out


def _artifacts(f: dict, c: dict, run: Path, weight_tol: float) -> dict:
    from webrl_core.experiments.reproduce import max_weight_diff

    why = []
    if f["rollout_trajectories"] == c["rollout_trajectories"]:
        mode = "vs clean"
        for k, name in (("samples_sha", "samples.jsonl"), ("replay_sha", "replay.jsonl")):
            if f[k] != c[k]:
                why.append(f"{name} differs from the clean run's")
        dw = {}
        for name in ("critic", "actor"):
            dw[name] = max_weight_diff(Path(c["dir"]) / "models" / f"phase={PHASE}" / name,
                                       run / "models" / f"phase={PHASE}" / name)
            if dw[name] > weight_tol:
                why.append(f"{name} max |dw| {dw[name]:.3g} > {weight_tol:g}")
        ft, ct = f["eval_json"]["total"], c["eval_json"]["total"]
        if (ft["success"], ft["failed"], ft["errors"]) != (ct["success"], ct["failed"], ct["errors"]):
            why.append(f"eval solved/failed/errored {ft['success']}/{ft['failed']}/{ft['errors']}, clean "
                       f"{ct['success']}/{ct['failed']}/{ct['errors']}")
        return _ok(not why, "; ".join(why), mode=mode, max_dw=max(dw.values()))
    mode = "vs recompute"
    rep = _recompute(run, f)
    why = rep["why"]
    return _ok(not why, "; ".join(why), mode=mode, max_dw=rep["max_dw"])


def _recompute(run: Path, f: dict) -> dict:
    """Recompute the phase's data-dependent outputs from the run's own stored episodes and compare."""
    from webrl_core.config import load_config
    from webrl_core.learn.orm import OrmScorer, orm_prompt_for_episode
    from webrl_core.experiments.reproduce import reproduce_phase
    from webrl_core.runs.store import TrajectoryStore

    why: list[str] = []
    rep = reproduce_phase(run, PHASE)
    dw = 0.0
    for name, v in rep["outputs"].items():
        if "max_abs_weight_diff" in v:
            dw = max(dw, v["max_abs_weight_diff"])
        if not v["match"]:
            why.append(f"{name} differs from its recomputation"
                       + (f" (max |dw| {v['max_abs_weight_diff']:.3g})" if "max_abs_weight_diff" in v else ""))
    s = load_config(run / "config.yaml")
    store = TrajectoryStore(run)
    ids = f["planned_rollout"]
    eps, by_ep = store.finished_episodes(ids)
    eps = [e for e in eps if by_ep.get(e["episode_id"])]
    orm = model_ref(run, 0, "orm")
    p = OrmScorer(orm.path, s.orm, s.models).p_yes(
        [orm_prompt_for_episode(e, by_ep[e["episode_id"]], s.orm.max_html_chars) for e in eps])
    off = [e["episode_id"] for e, x in zip(eps, p) if e["orm_score"] is None or abs(e["orm_score"] - float(x)) > 1e-6]
    if off:
        why.append(f"{len(off)} ORM label(s) differ from a re-scoring")
    ev = f["eval_json"]
    solved = sum(1 for e in f["episodes"] if e["purpose"] == "eval" and e["status"] != "error"
                 and (e["env_score"] or 0) >= 1.0)
    if ev["total"]["success"] != solved or ev["total"]["n"] != len(f["planned_eval"]):
        why.append("eval/phase=1.json counts differ from its stored episodes")
    return {"why": why, "max_dw": dw}


# ------------------------------------------------------------------------------------------- entry point
def select(names: str | None) -> list[Fault]:
    if not names:
        return list(FAULTS)
    want = [n.strip() for n in names.split(",") if n.strip()]
    unknown = sorted(set(want) - set(FAULT_NAMES))
    if unknown:
        raise ValueError(f"unknown fault(s) {unknown}; known: {', '.join(FAULT_NAMES)}")
    return [f for f in FAULTS if f.name in want]


def summarize(row: dict) -> str:
    """One line of what the checks saw."""
    ch = row.get("checks") or {}
    if not ch:
        return "-"
    lost, dbl, art = ch["lost"], ch["doubled"], ch["artifacts"]
    parts = [f"{lost.get('rollout', '?')}+{lost.get('eval', '?')} episodes",
             f"{dbl.get('kept_from_before', 0)} stored before the fault kept",
             f"{dbl.get('rewritten_errors', 0)} redone after error" if dbl.get("rewritten_errors") else "",
             *[f"{p} rollout retried by Prefect x{n}" for p, n in (row.get("shard_retries") or {}).items()],
             f"artifacts {art.get('mode', '?')}"]
    return ", ".join(p for p in parts if p)


def recovery(row: dict) -> str:
    """How the phase got to its end: the re-run (its wall time, what it took from the cache and what it ran
    again) or the flow itself."""
    if row.get("rerun_wall_s") is not None:
        states = row.get("rerun_tasks") or {}
        ran = list(dict.fromkeys(states.get("Completed", [])))
        n_cached = len(states.get("Cached", []))
        return (f"re-run {row['rerun_wall_s']:.0f} s: {n_cached} tasks cached, ran "
                + (", ".join(ran) if ran else "nothing"))
    if row.get("survived"):
        return f"flow went on, finished in {row.get('first_wall_s', 0):.0f} s"
    return "-"


def run_matrix(root: str | Path, faults: list[Fault], *, config: str = "smoke", sets: list[str] | None = None,
               keep: bool = False, fraction: float = 0.5, weight_tol: float = 0.0, timeout_s: float = 1800.0,
               log: Callable[[str], None] = print, on_row: Callable[[dict], None] | None = None) -> dict:
    """Bootstrap (or reuse it), the clean phase, then one row per fault. Returns {clean, rows, passed, failed}."""
    h = Harness(root, config=config, sets=sets, fraction=fraction, weight_tol=weight_tol, timeout_s=timeout_s,
                log=log)
    t0 = time.perf_counter()
    boot = h.bootstrap()
    clean = h.run_clean()
    rows = []
    for fault in faults:
        log(f"{fault.name}: {fault.title} ...")
        try:
            row = h.run_fault(fault, keep=keep)
        except Exception as e:  # a harness failure is a failed row, not a crash of the matrix
            row = {"fault": fault.name, "title": fault.title, "injected": "-", "ok": False,
                   "why": f"{type(e).__name__}: {e}", "checks": {}}
        rows.append(row)
        if on_row:
            on_row(row)
    passed = sum(1 for r in rows if r["ok"])
    return {"bootstrap_s": boot, "clean_s": clean["wall_s"], "rows": rows, "passed": passed,
            "failed": len(rows) - passed, "total_s": time.perf_counter() - t0, "root": str(h.root),
            "durations": h.durations}


def as_json(result: dict) -> str:
    return json.dumps(result, indent=1, default=lambda o: asdict(o) if hasattr(o, "__dataclass_fields__") else str(o))

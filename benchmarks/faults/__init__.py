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

Modules: ``catalog`` (the faults), ``probes``, ``procs`` (process trees), ``harness`` (the runs), ``checks``
(facts and checks), ``matrix`` (the entry point).
"""

from benchmarks.faults.catalog import FAULT_NAMES, FAULTS, Fault
from benchmarks.faults.probes import HOLD_ENV, PROBE_ENV, install_probes, stage_durations
from benchmarks.faults.matrix import as_json, recovery, run_matrix, select, summarize

__all__ = ["FAULT_NAMES", "FAULTS", "Fault", "HOLD_ENV", "PROBE_ENV", "install_probes", "stage_durations", "as_json", "recovery", "run_matrix", "select", "summarize"]

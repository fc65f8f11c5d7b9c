"""The faults the matrix injects: one ``Fault`` per row, in the table's order."""

from __future__ import annotations

from dataclasses import dataclass


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

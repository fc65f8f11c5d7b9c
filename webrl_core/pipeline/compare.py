"""Paired comparison of two evaluations on the same test tasks: which tasks one actor solves and the other does not.

Two evaluations (``eval/<name>.json``, written by ``pipeline.evaluation.evaluate``) of one test set pair up by task.
A task is *lost* when evaluation A solved it and B did not, *gained* the other way round. With two actors equally
good, each of the n = lost + gained discordant tasks is a fair coin (the exact sign test, McNemar's test for paired
binary outcomes):

    p = min(1, 2 * sum_{k <= min(lost, gained)} C(n, k) / 2^n)

Tasks with an errored or unscored episode on either side, or evaluated on one side only, are counted apart and never
paired. Success is ``env.episode.outcome`` (the sites' evaluators), the one definition the evaluation itself counts.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from webrl_core.env.actions import Action
from webrl_core.env.episode import outcome
from webrl_core.errors import BadInput, MissingInput
from webrl_core.runs.store import TrajectoryStore


@dataclass
class TaskOutcome:
    """One task's episode in one evaluation."""

    task_id: str
    site: str
    intent: str
    outcome: str  # env.episode.OUTCOMES
    episode_id: str


@dataclass
class PairedComparison:
    """Evaluation A against evaluation B over the tasks both scored."""

    a: str
    b: str
    both: int = 0
    neither: int = 0
    lost: list[tuple[TaskOutcome, TaskOutcome]] = field(default_factory=list)
    gained: list[tuple[TaskOutcome, TaskOutcome]] = field(default_factory=list)
    unpaired: int = 0  # errored or unscored on a side, or evaluated on one side only

    @property
    def p_value(self) -> float:
        return sign_test(len(self.lost), len(self.gained))

    @property
    def paired(self) -> int:
        return self.both + self.neither + len(self.lost) + len(self.gained)

    @property
    def solved(self) -> tuple[int, int]:
        return self.both + len(self.lost), self.both + len(self.gained)


def sign_test(lost: int, gained: int) -> float:
    """Two-sided exact sign test of ``lost`` against ``gained`` discordant pairs (scipy's binomial test at p = 0.5;
    1.0 when there are none)."""
    n = lost + gained
    if not n:
        return 1.0
    from scipy.stats import binomtest  # scipy.stats takes a second or two to import: only when a comparison asks

    return float(binomtest(gained, n, p=0.5, alternative="two-sided").pvalue)


def run_dir_of(eval_file: Path) -> Path:
    """The run dir holding ``eval_file``'s episodes: the nearest folder above it with a ``store``."""
    for parent in eval_file.resolve().parents:
        if (parent / "store").is_dir():
            return parent
    raise BadInput(f"{eval_file}: no run dir with a store/ above this evaluation file")


def resolve_evaluation(ref: str) -> Path:
    """``ref`` is an evaluation file (``<run>/eval/phase=1.json``) or ``<run dir>:<name>`` (``runs/x:phase=1``)."""
    path = Path(ref)
    if ":" in ref and not path.is_file():
        run, name = ref.rsplit(":", 1)
        path = Path(run) / "eval" / f"{name}.json"
    if not path.is_file():
        raise MissingInput(f"evaluation {ref!r}: no such file {path} (give <run>/eval/<name>.json or <run dir>:<name>)")
    return path


def evaluation_names(run_dir: str | Path) -> list[str]:
    """The phase evaluations of a run, in phase order (``phase=0``, ``phase=1``, ...)."""
    files = sorted((Path(run_dir) / "eval").glob("phase=*.json"), key=lambda p: int(p.stem.split("=", 1)[1]))
    return [p.stem for p in files]


def task_outcomes(eval_file: Path) -> dict[str, TaskOutcome]:
    """Each test task's outcome in the evaluation ``eval_file``, read from its run's store."""
    try:
        ids = json.loads(eval_file.read_text())["episode_ids"]
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise BadInput(f"{eval_file}: not an evaluation file (no episode_ids): {e}") from e
    run_dir = run_dir_of(eval_file)
    rows = TrajectoryStore(run_dir).sql(
        "SELECT episode_id, task_id, site, intent, status, env_score FROM episodes "
        "WHERE episode_id IN (SELECT unnest($ids))", {"ids": ids})
    if len(rows) != len(set(ids)):
        raise BadInput(f"{eval_file}: {len(set(ids)) - len(rows)} of its {len(set(ids))} episodes are not in the "
                       f"store of {run_dir}")
    return {str(r["task_id"]): TaskOutcome(str(r["task_id"]), r["site"], r["intent"] or "",
                                           outcome(r["status"], r["env_score"]), r["episode_id"]) for r in rows}


def compare(a_file: Path, b_file: Path) -> PairedComparison:
    """Evaluation ``a_file`` against ``b_file``, paired by task."""
    a, b = task_outcomes(a_file), task_outcomes(b_file)
    out = PairedComparison(str(a_file), str(b_file))
    out.unpaired = len(set(a) ^ set(b))
    scored = {"success", "failed"}
    for task_id in sorted(set(a) & set(b)):
        x, y = a[task_id], b[task_id]
        if x.outcome not in scored or y.outcome not in scored:
            out.unpaired += 1
        elif x.outcome == y.outcome:
            if x.outcome == "success":
                out.both += 1
            else:
                out.neither += 1
        else:
            (out.lost if x.outcome == "success" else out.gained).append((x, y))
    return out


def action_line(action_json: str | None) -> str:
    """A stored step's action (``env.actions.Action`` as JSON) as the actor wrote it, after the element it named:
    ``Reports: do(action='Click', element='5')``."""
    if not action_json:
        return "(no action)"
    action = Action(**json.loads(action_json))
    named = next((c.split(":", 1)[1].strip() for c in action.comments if c.startswith("# Element:")), "")
    return f"{named}: {action}" if named else str(action)


def episode_actions(eval_file: Path, episode_ids: list[str]) -> dict[str, list[str]]:
    """The actions of evaluation episodes, in order, by episode id (one store query)."""
    out: dict[str, list[str]] = {eid: [] for eid in episode_ids}
    for step in TrajectoryStore(run_dir_of(eval_file)).steps(episode_ids=list(episode_ids)):  # ordered by idx
        out[step["episode_id"]].append(action_line(step["action"]))
    return out

"""Optional human review of generated tasks: pause the flow and ask in the Prefect UI."""

from __future__ import annotations

from pathlib import Path

from prefect import get_run_logger
from prefect.exceptions import FlowPauseTimeout
from prefect.flow_runs import pause_flow_run
from prefect.input import RunInput

from webrl_core.artifacts import read_json, write_json


class TaskReview(RunInput):
    keep_task_ids: list[str]
    note: str = ""


def review_tasks(run_dir: str, phase: int, kept_ref, timeout_s: int, default: str):
    """Pause until a person edits the list of task ids to keep (Prefect UI -> Resume); on timeout apply the default.
    Any other failure (no API to pause against, a malformed answer) fails the flow: approving or dropping every
    task because something broke would look like a review that never happened."""
    log = get_run_logger()
    tasks = read_json(kept_ref)
    listing = "\n".join(f"- {t['task_id']}: {t['intent']}" for t in tasks)
    log.info("waiting up to %ss for a review of %d generated tasks:\n%s", timeout_s, len(tasks), listing)
    try:
        answer = pause_flow_run(wait_for_input=TaskReview.with_initial_data(
            keep_task_ids=[t["task_id"] for t in tasks], description=f"Phase {phase}: remove ids to drop tasks.\n\n" + listing),
            timeout=timeout_s)
        keep = set(answer.keep_task_ids)
        how = "reviewed"
    except FlowPauseTimeout:  # nobody answered in time: the configured default applies
        keep = {t["task_id"] for t in tasks} if default == "approve" else set()
        how = f"default={default} (no review within {timeout_s}s)"
    unknown = sorted(keep - {t["task_id"] for t in tasks})
    if unknown:
        raise ValueError(f"review of phase {phase}: keep_task_ids names tasks that are not in the list: {unknown[:5]}")
    kept = [t for t in tasks if t["task_id"] in keep]
    log.info("review %s: kept %d of %d", how, len(kept), len(tasks))
    return write_json(kept, Path(run_dir) / "tasks" / f"phase={phase}" / "reviewed.json")

"""One finished rollout episode, as the rollout engine builds it (``rollout._episode_with_retries``).

``Episode`` has one field per episode column the store keeps (``EPISODE_COLUMNS``, what
``store.write_episode`` receives), plus what stays in memory: ``final_page``, ``retries`` and ``steps``. The
rest of the project sees episodes as dicts: ``Episode.to_record()`` is the dict ``rollout()`` returns and
``Episode.columns()`` the one it stores.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from webrl_core.websites import is_success

_IN_MEMORY = {"stored": False}  # field metadata: not an episode column (returned by rollout(), never stored)


@dataclass
class FinalPage:
    """The page an episode ended on. Only an episode that ran to the end has one; in its record the fields
    appear as ``final_html``, ``final_url``, ``blocked_urls`` and ``site_state``."""

    html: str                # the last observation's text (the ORM's input: ``prompts.build_orm_prompt``)
    url: str                 # the last observation's URL
    blocked_urls: list[str]  # everything the containment blocked during the episode (``WebEnv.blocked_urls``)
    site_state: dict         # the site hook's last ``episode_status`` (MiniWoB++: done, reward, raw reward, ...)


@dataclass(kw_only=True)
class Episode:
    """One episode: its identity, its outcome and its cost. Field order = the record's key order."""

    # identity: known before the first try (``webrl_core.identity``)
    episode_id: str              # content digest of the inputs below (``identity.episode_id``)
    task_id: str                 # the task's id, as a string
    phase: int                   # the curriculum phase that ran it
    policy_id: str               # the policy's name (``policy.policy_id``, else its class name)
    purpose: str                 # why it ran: "rollout", "eval", ...
    intent: str                  # the task's instruction (after the site hooks' updates when the episode ran)
    site: str                    # the task's sites joined with "+"
    seed: int                    # the run's seed
    task_digest: str             # ``identity.task_digest`` of the task
    policy_digest: str           # the identity of the weights / policy that acted
    settings_digest: str         # the identity of the sampling and environment settings
    node: str                    # the machine that ran it (hostname; on Ray ``<hostname>/<ip>/ray:<node id>``)
    # outcome
    status: str                  # ``WebEnv.status`` ("done", "early_stop", "max_steps"), or "error": every try failed
    final_answer: str | None     # the agent's exit message or "Early stop: ..." (None after an error)
    env_score: float | None      # the ground-truth score of the final state; None after an error, or when the task
    #                              needed an LLM judge and none was configured (eval.judge empty): "unscored"
    final_page: FinalPage | None = field(metadata=_IN_MEMORY)  # None after an error
    orm_score: float | None      # the outcome reward model's score: filled in later, always None here
    success: bool | None         # ``websites.is_success(env_score)`` (None when there is no score: error, unscored)
    n_steps: int                 # steps of the last try
    # cost
    started_at: float            # wall-clock time (epoch seconds) the first try started
    wall_s: float                # seconds from the first try's start to the end (retries included)
    policy_s: float              # seconds the last try waited for the policy
    env_s: float                 # seconds the last try spent in the browser (reset, steps, evaluation)
    error: str | None            # the last try's error and traceback tail when every try failed, else None
    # in memory only
    retries: int = field(metadata=_IN_MEMORY)       # failed tries before the one that counted
    steps: list[dict] = field(metadata=_IN_MEMORY)  # the last try's step dicts (stored separately)

    def columns(self) -> dict:
        """The episode row for ``store.write_episode`` (the steps go separately)."""
        return {name: getattr(self, name) for name in EPISODE_COLUMNS}

    def to_record(self) -> dict:
        """The episode as the dict ``rollout()`` returns: the columns, ``final_html`` / ``final_url`` /
        ``blocked_urls`` / ``site_state`` when the episode ran to the end, ``retries`` and ``steps``."""
        record: dict = {}
        for f in fields(self):
            if f.name != "final_page":
                record[f.name] = getattr(self, f.name)
            elif self.final_page is not None:
                page = self.final_page
                record.update(final_html=page.html, final_url=page.url, blocked_urls=page.blocked_urls,
                              site_state=page.site_state)
        return record


EPISODE_COLUMNS: tuple[str, ...] = tuple(f.name for f in fields(Episode) if f.metadata.get("stored", True))

OUTCOMES = ("success", "failed", "unscored", "error")


def outcome(status: str | None, env_score: float | None) -> str:
    """How an episode (a record or a stored row: its ``status`` and ``env_score``) counts against the ground truth:
    "error" (every try failed), "unscored" (it ran to the end but has no score: its task needs an LLM judge and
    none was configured), "success" or "failed" (``websites.is_success``). A success rate is
    success / (success + failed); errored and unscored episodes are counted apart."""
    if status == "error":
        return "error"
    if env_score is None:
        return "unscored"
    return "success" if is_success(env_score) else "failed"

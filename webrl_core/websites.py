"""The WebArena websites and what counts as solving a task on them: each defined once for the whole project.

Sites: WebArena (Zhou et al., 2023) hosts its tasks on five self-hosted sites; WebArena-Lite's 165 test tasks
spread over them as 45 / 35 / 30 / 26 / 19 single-site tasks (shopping, shopping_admin, gitlab, map, reddit; WebRL
paper, Table 1 and Appendix). ``SITES`` keeps that order, which is also the order of the embedded test set.
Wikipedia and the homepage are reachable from tasks but host none; the official task configs may still name
wikipedia in ``sites`` and use ``__WIKIPEDIA__`` / ``__HOMEPAGE__`` placeholders in URLs.

Success: WebArena's evaluators (official ``evaluation_harness/evaluators.py``, ``EvaluatorComb.__call__``) multiply
0/1 scores, and WebRL's outcome reward model answers YES with probability P(YES), counted as success when
P(YES) >= 0.5 (paper, Sec. 3.2). Both are rewards R in [0, 1]; an episode is solved when R >= 0.5, which for an
evaluator score in {0, 1} means R = 1.
"""

from __future__ import annotations

SITES: tuple[str, ...] = ("shopping", "shopping_admin", "gitlab", "map", "reddit")
"""The five sites that host tasks (embedded or real), in WebArena-Lite's order."""

AUXILIARY_SITES: tuple[str, ...] = ("wikipedia", "homepage")
"""Reachable from tasks, host none of them."""

ALL_SITES: tuple[str, ...] = SITES + AUXILIARY_SITES
"""Every site a config may give a URL for."""

TASK_CONFIG_SITES: tuple[str, ...] = SITES + ("wikipedia",)
"""Sites a WebArena task config may list in its ``sites`` field."""

SITE_TITLES: dict[str, str] = {"shopping": "OSS", "shopping_admin": "CMS", "gitlab": "GitLab", "map": "Map",
                               "reddit": "Reddit"}
"""Column titles of the paper's Table 1."""

SUCCESS_THRESHOLD = 0.5
"""R >= SUCCESS_THRESHOLD is success, for an evaluator score and for the ORM's P(YES) alike."""


def is_success(reward: float | None) -> bool:
    """Whether an outcome reward (evaluator score or ORM P(YES)) counts as solved; no reward is not solved."""
    return reward is not None and float(reward) >= SUCCESS_THRESHOLD

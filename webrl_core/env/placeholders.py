"""WebArena's site-URL placeholders (``__SHOPPING__``, ``__GITLAB__`` ...), shared by the task files (webarena.py)
and the evaluators (evaluators.py), which both substitute them.

A placeholder is replaced by its site's base URL (no trailing "/") in every string of a task, eval included, as
VAB's ``generate_test_data.py`` does for the raw test file.
"""

from __future__ import annotations

import re
from typing import Any

PLACEHOLDERS = {"__SHOPPING__": "shopping", "__SHOPPING_ADMIN__": "shopping_admin", "__REDDIT__": "reddit",
                "__GITLAB__": "gitlab", "__MAP__": "map", "__WIKIPEDIA__": "wikipedia", "__HOMEPAGE__": "homepage"}
SITE_PLACEHOLDER = {site: ph for ph, site in PLACEHOLDERS.items()}
PLACEHOLDER_RE = re.compile(r"__(?:SHOPPING_ADMIN|SHOPPING|REDDIT|GITLAB|MAP|WIKIPEDIA|HOMEPAGE)__")


def substitute_placeholders(obj: Any, urls: dict[str, str]) -> Any:
    """Replace site placeholders in every string of ``obj`` (dicts, lists, nested) with ``urls[site]``."""
    if isinstance(obj, str):
        def repl(m: re.Match) -> str:
            site = PLACEHOLDERS[m.group(0)]
            if site not in urls:
                raise ValueError(f"no URL for site {site!r} (placeholder {m.group(0)}); given: {sorted(urls)}")
            return urls[site].rstrip("/")
        return PLACEHOLDER_RE.sub(repl, obj)
    if isinstance(obj, list):
        return [substitute_placeholders(x, urls) for x in obj]
    if isinstance(obj, dict):
        return {k: substitute_placeholders(v, urls) for k, v in obj.items()}
    return obj


def placeholder_sites(obj: Any) -> set[str]:
    """Sites whose placeholder (``__GITLAB__`` ...) occurs in any string of ``obj``."""
    if isinstance(obj, str):
        return {PLACEHOLDERS[m] for m in PLACEHOLDER_RE.findall(obj)}
    if isinstance(obj, list):
        return set().union(*(placeholder_sites(x) for x in obj)) if obj else set()
    if isinstance(obj, dict):
        return set().union(*(placeholder_sites(v) for v in obj.values())) if obj else set()
    return set()

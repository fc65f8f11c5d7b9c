"""List-order shuffle of the SFT demonstrations: the clicked id must be found by its name, not remembered.

The entity swap (``entity_swap.py``) renames things but keeps every element id where it was, so a demonstration's
id stays predictable from whatever the swap leaves unchanged (a post title, a comment's text, the steps before):
on the reddit clone's forum list, twelve lines ``[6] books 24 submissions`` ... ``[17] travel 24 submissions``,
a start trained on 44 such steps wrote one or two ids whatever forum it named (docs/notebook/grounding.md, "Where the
starts fail"). The shuffle permutes the texts of a run of list lines among the run's ids, and the action's id follows
its text:

    lines ``[i_1] t_1`` ... ``[i_n] t_n`` (ids consecutive, one shape, n >= ``MIN_RUN``)  ->  ``[i_k] t_π(k)``
    ``element="i_j"``  ->  ``element="i_π⁻¹(j)"``

with π a uniform random permutation over k = 1..n, drawn anew for each pair and each epoch. A list line is a line of
the compact observation (``compact_page.py``: one line per list item or table row) with exactly one element id,
written first (``[6] books 24 submissions``, ``prompt.observation: compact``) or after the text that names it
(``books [6] 24 submissions``, ``compact_id_after``); its text is the rest of the line around the id. The lines of
one list share a shape (``shape``: words and numbers folded, ``books 24 submissions`` -> ``a 9 a``, ``Aurora Trail
Tent $142.99`` -> ``a $9.9``), which keeps a list's neighbours out of it (an order's items, ``a 9``, and the ``Back
to My Orders`` link after them, ``a``). A prompt carries one page (earlier rounds show only their actions,
``prompts.build_prompt``), and only its list lines move: the intent, the earlier actions and every other line stay
as they are; a prompt without a list is left as it is.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence

# one id on the line: first, or after a text that has no id (the header's "[0] Postmill [1] Forums" has two)
_NO_ID = r"(?:(?!\[\d+\]).)"
LIST_LINE = re.compile(rf"^(?P<before>(?:(?=\S){_NO_ID}+? )?)\[(?P<id>\d+)\](?P<after>(?: {_NO_ID}*)?)$")
MIN_RUN = 3  # two lines are a pair of links (Sign in / Sign up), not a list to choose from
_ELEMENT = re.compile(r'element="(\d+)"')
_NUMBER = re.compile(r"\d+")
_WORDS = re.compile(r"[A-Za-z][\w'-]*(?: [A-Za-z][\w'-]*)*")


def shape(text: str) -> str:
    """A list line's text with every number folded to ``9`` and every run of words to ``a``."""
    return _WORDS.sub("a", _NUMBER.sub("9", text))


def _parse(line: str) -> tuple[int, str, str] | None:
    """(id, text before it, text after it) of a list line, else None."""
    m = LIST_LINE.match(line)
    if not m or not (m["before"] or m["after"].strip()):
        return None
    return int(m["id"]), m["before"], m["after"]


def _runs(lines: list[str]) -> list[tuple[int, list[tuple[int, str, str]]]]:
    """(first line, the parsed lines) of each maximal run of list lines of one shape whose ids go up by one, at
    least MIN_RUN long."""
    runs, run, prev_shape = [], [], None
    for i, line in enumerate(lines + [""]):
        parsed = _parse(line)
        line_shape = f"{shape(parsed[1])}[]{shape(parsed[2])}" if parsed else None
        if run and (parsed is None or parsed[0] != run[-1][0] + 1 or line_shape != prev_shape):
            if len(run) >= MIN_RUN:
                runs.append((i - len(run), run))
            run = []
        if parsed is not None:
            run.append(parsed)
        prev_shape = line_shape
    return runs


def shuffle_lists(prompt: str, action: str, rng: random.Random) -> tuple[str, str]:
    """``(prompt, action)`` with the texts of each list run permuted, the action's id moved with its text."""
    lines = prompt.split("\n")
    m = _ELEMENT.search(action)
    target = int(m.group(1)) if m else None
    moved_to = target
    for start, parsed in _runs(lines):
        ids = [p[0] for p in parsed]
        order = list(range(len(parsed)))
        rng.shuffle(order)
        for k, src in enumerate(order):
            lines[start + k] = f"{parsed[src][1]}[{ids[k]}]{parsed[src][2]}"
            if ids[src] == target:
                moved_to = ids[k]
    if moved_to != target:
        action = action[:m.start(1)] + str(moved_to) + action[m.end(1):]
    return "\n".join(lines), action


def shuffle_pairs(pairs: Sequence[tuple[str, str]], p: float, seed: int) -> list[tuple[str, str]]:
    """Each pair list-shuffled with probability ``p`` (its own permutation), in order."""
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"list shuffle probability must be in [0, 1], got {p}")
    rng = random.Random(seed)
    return [shuffle_lists(a, b, rng) if rng.random() < p else (a, b) for a, b in pairs]

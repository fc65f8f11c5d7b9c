"""List-order shuffle: a list's texts move among its ids, the clicked id follows its text, nothing else changes."""

from __future__ import annotations

import random
import re

import pytest

from webrl_core.compact_page import compact_page
from webrl_core.learn.list_shuffle import shuffle_lists, shuffle_pairs

FORUMS = ["books", "cooking", "fitness", "gaming", "gardening", "movies", "music"]
HTML = ('<body><header><a id="0">Postmill</a><a id="1">Forums</a><input id="2" placeholder="Search"/></header>'
        '<main><h1>Forums</h1><ul>'
        + "".join(f'<li><a id="{6 + i}">{f}</a> 24 submissions</li>' for i, f in enumerate(FORUMS))
        + '</ul><p><a id="13">Sign in</a></p><p><a id="14">Sign up</a></p></main></body>')
INTENT = "Task: Go to the movies forum."
PAST = '# Element: Forums\ndo(action="Click", element="1")'
ACTION = '# Element: movies\ndo(action="Click", element="11")'


def prompt(id_after: bool = False) -> str:
    return f"{INTENT}\n{PAST}\n{compact_page(HTML, id_after=id_after)}\n{INTENT}"


def listed(text: str) -> dict[str, int]:
    """forum -> id, in either layout ("[6] books 24 submissions" or "books [6] 24 submissions")"""
    first = {m[2]: int(m[1]) for m in re.finditer(r"^\[(\d+)\] (\w+) 24 submissions$", text, re.M)}
    after = {m[1]: int(m[2]) for m in re.finditer(r"^(\w+) \[(\d+)\] 24 submissions$", text, re.M)}
    return first or after


@pytest.mark.parametrize("id_after", [False, True])
def test_the_clicked_id_follows_its_text(id_after):
    before = listed(prompt(id_after))
    assert before == {f: 6 + i for i, f in enumerate(FORUMS)}  # the compact page lists one forum a line
    clicked, orders = set(), set()
    for seed in range(30):
        p, a = shuffle_lists(prompt(id_after), ACTION, random.Random(seed))
        after = listed(p)
        assert sorted(after.values()) == sorted(before.values())  # the same ids, in place
        assert a == ACTION.replace('"11"', f'"{after["movies"]}"')  # the action clicks movies wherever it went
        clicked.add(after["movies"])
        orders.add(tuple(sorted(after, key=after.get)))
        # the intent, the earlier action and the lines outside the list are untouched
        assert p.split("\n")[:4] == prompt(id_after).split("\n")[:4]
        assert p.endswith(f"Sign in [13]\nSign up [14]\n{INTENT}" if id_after else f"[13] Sign in\n[14] Sign up\n{INTENT}")
    assert len(clicked) >= 5 and len(orders) >= 20  # the id is no longer predictable from the demonstration


def test_short_runs_and_other_actions():
    pair_only = "[3] Sign in\n[4] Sign up"
    assert shuffle_lists(pair_only, 'do(action="Click", element="3")', random.Random(0)) == \
        (pair_only, 'do(action="Click", element="3")')  # two lines are not a list
    gap = "[3] a\n[4] b\n[6] c"  # ids not consecutive: not one list
    assert shuffle_lists(gap, 'do(action="Click", element="3")', random.Random(0))[0] == gap
    p, a = shuffle_lists(prompt(), 'exit(message="Done")', random.Random(1))
    assert a == 'exit(message="Done")' and listed(p).keys() == listed(prompt()).keys()
    p, a = shuffle_lists(prompt(), PAST, random.Random(1))
    assert a == PAST  # an id outside the list keeps its number


def test_shuffle_pairs_share_and_bad_probability():
    pairs = [(prompt(), ACTION)] * 200
    out = shuffle_pairs(pairs, 0.5, seed=0)
    moved = sum(p != prompt() for p, _ in out)
    assert 70 < moved < 130  # about half (a draw can return the order it had: 1 in 5,040 here)
    assert shuffle_pairs(pairs, 0.0, seed=0) == pairs
    with pytest.raises(ValueError, match="list shuffle probability"):
        shuffle_pairs(pairs, 1.5, seed=0)

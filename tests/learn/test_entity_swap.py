"""Entity-swap augmentation: same-kind, injective, consistent across intent, page and action; whole names only."""

from __future__ import annotations

import random

import pytest

from webrl_core.learn.entity_swap import EntitySwapper, augment_pairs
from webrl_core.sites.data import entity_kinds

INTENT = "Task: What is the bike distance between Maple Hotel and Summit Diner?"
PAGE = '<a id="3">Maple Hotel</a> <a id="4">Summit Diner</a> <a id="5">Maple Hotels Annex</a> order #001132'
ACTION = 'do(action="Type", argument="Maple Hotel", element="4")'


@pytest.fixture(scope="module")
def swapper():
    kinds = entity_kinds(0)
    kinds.update({"Maple Hotel": "map.places.name", "Summit Diner": "map.places.name"})
    return EntitySwapper(kinds)


def test_swap_is_same_kind_consistent_and_injective(swapper):
    places = set(swapper.by_kind["map.places.name"])
    for seed in range(20):
        intent, page, action = swapper.swap((INTENT, PAGE, ACTION), random.Random(seed))
        a = action.split('argument="')[1].split('"')[0]
        assert a in places and a in intent and a in page  # the typed name is still the intent's first place
        first, second = intent.removeprefix("Task: What is the bike distance between ").rstrip("?").split(" and ")
        assert a == first and first != second and second in places
        assert "Maple Hotels Annex" in page  # a longer word that starts with a name is not a name
        number = page.split("#")[1]
        assert number.isdigit() and number in swapper.by_kind[swapper.kinds["001132"]]
    draws = {swapper.swap((INTENT, ACTION), random.Random(s))[1] for s in range(20)}
    assert len(draws) > 10  # the typed name varies: nothing to memorise


def test_text_without_entities_is_unchanged(swapper):
    texts = ("Go to page 2 of the Beauty category.", 'do(action="Click", element="2")')
    assert swapper.swap(texts, random.Random(0)) == texts


def test_augment_pairs_passes_and_probability(swapper):
    pairs = [(INTENT + PAGE, ACTION)] * 50
    out = augment_pairs(pairs, swapper, copies=3, p=0.5, seed=1)
    assert len(out) == 150
    swapped = sum(o != pairs[0] for o in out)
    assert 40 < swapped < 110  # about half
    assert augment_pairs(pairs, swapper, 2, 0.0, seed=1) == pairs * 2
    assert augment_pairs(pairs, swapper, 1, 0.5, seed=1) == augment_pairs(pairs, swapper, 1, 0.5, seed=1)
    with pytest.raises(ValueError, match="probability"):
        augment_pairs(pairs, swapper, 1, 1.5, seed=1)


def test_a_page_listing_every_name_of_a_kind_gets_a_permutation(swapper):
    """The forum list names all 12 forums of the reddit clone: σ must permute them, so every swapped list still
    has one line per forum and the clicked id still belongs to the name the action's comment writes."""
    forums = swapper.by_kind[swapper.kinds["movies"]]
    page = "\n".join(f"[{i + 6}] {f} 24 submissions" for i, f in enumerate(forums))
    action = '# Element: movies\ndo(action="Click", element="{}")'.format(6 + forums.index("movies"))
    for seed in range(200):
        new_page, new_action = swapper.swap((page, action), random.Random(seed))
        names = [line.split()[1] for line in new_page.splitlines()]
        assert sorted(names) == sorted(forums), (seed, names)
        target = new_action.splitlines()[0].removeprefix("# Element: ")
        assert f'element="{6 + names.index(target)}"' in new_action

"""Task sets: the fixed test set, training sampling, disjointness, vary_task, schema (no browser)."""

from __future__ import annotations

import json
import random

from webrl_core.sites.data import site_data
from webrl_core.sites.families import FAMILIES
from webrl_core.sites.tasks import TEST_COUNTS, _pools, families_of, train_tasks, vary_task, widen_task
from webrl_core.sites.tasks import test_set as held_out_set

KEYS = {"sites", "task_id", "require_login", "storage_state", "start_url", "geolocation", "intent_template",
        "instantiation_dict", "intent", "require_reset", "eval", "intent_template_id", "family", "split"}


def test_test_set_is_fixed_and_spread_like_webarena_lite():
    a, b = held_out_set(), held_out_set()
    assert a == b and len(a) == 165
    counts = {}
    for t in a:
        counts[t["sites"][0]] = counts.get(t["sites"][0], 0) + 1
    assert counts == TEST_COUNTS
    assert len({t["task_id"] for t in a}) == 165
    for t in a:
        assert KEYS <= set(t), KEYS - set(t)
        assert t["start_url"].startswith("__") and t["storage_state"] is None
        assert set(t["eval"]["eval_types"]) <= {"string_match", "url_match", "program_html"}
        json.dumps(t)  # JSON-able


def test_every_site_has_four_families_and_all_eval_kinds():
    kinds = {}
    for t in held_out_set():
        kinds.setdefault(t["sites"][0], set()).update(t["eval"]["eval_types"])
    for site in TEST_COUNTS:
        assert sum(f.site == site for f in FAMILIES.values()) >= 4
        # the map has no state to change (as in WebArena, whose map tasks are string/url checks)
        want = {"string_match", "url_match"} | (set() if site == "map" else {"program_html"})
        assert kinds[site] == want, (site, kinds[site])


def test_train_and_test_instantiations_are_disjoint():
    test_insts = {(t["family"], json.dumps(t["instantiation_dict"], sort_keys=True)) for t in held_out_set()}
    train = train_tasks(300, seed=3)
    assert len({t["family"] for t in train}) == len(FAMILIES)
    for t in train:
        assert (t["family"], json.dumps(t["instantiation_dict"], sort_keys=True)) not in test_insts
    for name, (te, tr) in _pools(0).items():
        assert tr and not ({json.dumps(i, sort_keys=True) for i in te} & {json.dumps(i, sort_keys=True) for i in tr})
    assert train_tasks(20, seed=1) == train_tasks(20, seed=1)
    assert train_tasks(20, seed=1) != train_tasks(20, seed=2)


def test_vary_task_keeps_family_and_rebuilds_the_evaluator():
    rng = random.Random(0)
    for t in train_tasks(len(FAMILIES), seed=5):
        v = vary_task(t, rng)
        assert v["family"] == t["family"] and v["intent"] != t["intent"]
        # the evaluator is the family's, for the NEW instantiation (rebuilding it gives the same thing)
        fam = FAMILIES[v["family"]]
        assert fam.build(v["instantiation_dict"], site_data(0))["eval"] == v["eval"]


def test_widen_task_draws_another_family_of_the_same_site_with_its_evaluator():
    rng = random.Random(0)
    for t in train_tasks(len(FAMILIES), seed=6):
        seen = {widen_task(t, rng)["family"] for _ in range(60)}
        site_families = {f.name for f in families_of(t["sites"][0])}
        assert seen == site_families - {t["family"]}  # every other family of the site, never its own
    w = widen_task(t, rng)
    assert FAMILIES[w["family"]].build(w["instantiation_dict"], site_data(0))["eval"] == w["eval"]
    # a task in strict WebArena-Lite format (no ``family``) is of the family its intent_template_id encodes
    strict = {k: v for k, v in t.items() if k != "family"}
    assert all(widen_task(strict, rng)["family"] != t["family"] for _ in range(30))


def test_entity_names_cover_what_intents_name():
    """``entity_names`` (the embedded tokenizer's whole tokens): the sites' named things, sorted and unique, from
    every site; nearly every held-out intent names one (the rest name a category or a month)."""
    from webrl_core.sites.data import entity_names

    names = entity_names(0)
    assert names == sorted(set(names)) and "" not in names
    data = site_data(0)
    assert {p["name"] for p in data["map"]["places"]} <= set(names)
    assert {c["name"] for c in data["shopping_admin"]["customers"]} <= set(names)
    assert {u["username"] for u in data["gitlab"]["users"]} <= set(names)
    naming = [t for t in held_out_set() if any(n in t["intent"] for n in names)]
    assert len(naming) >= 0.9 * 165
    assert entity_names(1) != names  # another data seed, other things

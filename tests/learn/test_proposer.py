"""The phase's task sources that need no failures: PAE's context-aware proposer (``webrl_core.learn.proposer``,
embedded and LLM) against the real served embedded sites, and WebAgent-R1's training-pool draw (``generate_tasks``
with ``curriculum.generator: train_pool``)."""

from __future__ import annotations

import asyncio
import html
import json
import random

import httpx
import pytest

from chat_endpoint import chat_handler, serve
from webrl_core.artifacts import read_json
from webrl_core.config_loader import load_config
from webrl_core.env.judge import needs_judge
from webrl_core.env.placeholders import SITE_PLACEHOLDER
from webrl_core.env.rollout import rollout
from webrl_core.learn.proposer import ENTITY_KEYS, EmbeddedProposer, page_entities, parse_proposals, read_sites
from webrl_core.pipeline.generation import generate_tasks
from webrl_core.sites.data import site_data
from webrl_core.sites.families import FAMILIES
from webrl_core.sites.oracle import OraclePolicy
from webrl_core.sites.server import EmbeddedSites
from webrl_core.sites.tasks import families_of, train_instances
from webrl_core.sites.tasks import test_set as held_out_set
from webrl_core.websites import SITES


@pytest.fixture(scope="module")
def sites():
    s = EmbeddedSites(data_seed=0, workers="thread").start()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def contexts(sites):
    return read_sites(sites, list(SITES))


def _fetch(sites, site: str, path: str) -> str:
    """A page as a fresh visitor of the run sees it (its own episode database), read apart from the proposer."""
    cookies = {c["name"]: c["value"] for c in sites.login_cookies([site], "test-fetch")}
    try:
        return httpx.get(sites.urls[site] + path, cookies=cookies, timeout=30).text
    finally:
        sites.end_episode("test-fetch")


def test_entity_keys_name_every_family_and_keys_of_its_instantiations():
    assert set(ENTITY_KEYS) == set(FAMILIES)  # a new family must say which of its keys the pages show
    for name, fam in FAMILIES.items():
        inst = train_instances(fam)[0]
        assert ENTITY_KEYS[name] and set(ENTITY_KEYS[name]) <= set(inst), name


def test_page_entities_are_names_of_the_main_content_not_its_chrome():
    page = """<html><head><title> My  Shop </title></head><body>
    <header><a href="/">My Shop</a> <nav><a href="/orders">My Orders</a></nav></header>
    <main><ul><li><a href="/category/home">Home &amp; Kitchen</a></li><li><a href="/product/7">Blue Mug</a></li></ul>
    <table><tr><td><a href="/order/001299">#001299</a></td><td>12</td><td>Ann Lee</td><td><a href="/e/1">Edit</a></td></tr>
    <tr><td>Bo Kim</td><td>Bo Kim</td><td><a href="/e/2">Edit</a></td></tr><tr><td><a href="/e/3">Edit</a></td></tr></table>
    <select><option>March 2023</option></select><p><a href="?page=2">Next</a></p></main></body></html>"""
    title, links, names = page_entities(page)
    assert title == "My Shop"
    assert links == ["/", "/orders", "/category/home", "/product/7", "/order/001299", "/e/1", "/e/2", "/e/3",
                     "?page=2"]
    # no menu links, no pager, no row action repeated on every row, no bare small number; "#" dropped
    assert names == ["Home & Kitchen", "Blue Mug", "001299", "Ann Lee", "Bo Kim", "March 2023"]


def test_embedded_proposer_writes_tasks_of_every_family_from_entities_the_pages_show(sites, contexts):
    n = 12
    tasks = EmbeddedProposer().propose(contexts, {s: n for s in SITES}, random.Random(0))
    test_insts = {(t["family"], json.dumps(t["instantiation_dict"], sort_keys=True)) for t in held_out_set()}
    pages: dict[tuple[str, str], str] = {}
    for site in SITES:
        mine = [t for t in tasks if t["sites"] == [site]]
        assert len(mine) == n
        # taken in turns over the families: every family of the site the pages ground (here all of them)
        assert {t["family"] for t in mine} == {f.name for f in families_of(site)}, site
    for t in tasks:
        fam = FAMILIES[t["family"]]
        assert fam.site == t["sites"][0] and t["start_url"] == fam.start_url
        # a regular family task: the evaluator its family builds for the instantiation, no judge needed
        assert not needs_judge(t) and not t.get("judge_only")
        assert t["eval"] == fam.build(t["instantiation_dict"], site_data(0))["eval"]
        assert (t["family"], json.dumps(t["instantiation_dict"], sort_keys=True)) not in test_insts
        for e in t["proposal"]["entities"]:
            assert t["instantiation_dict"][e["key"]] == e["value"] and e["value"] in t["intent"]
            key = (t["sites"][0], e["page"])
            if key not in pages:
                pages[key] = html.unescape(_fetch(sites, *key))
            assert e["value"] in pages[key], (e, t["intent"])  # the entity is on the page it was read from
    again = EmbeddedProposer().propose(contexts, {s: n for s in SITES}, random.Random(0))
    assert [t["intent"] for t in again] == [t["intent"] for t in tasks]  # deterministic for one rng
    other = EmbeddedProposer().propose(contexts, {s: n for s in SITES}, random.Random(1))
    assert [t["intent"] for t in other] != [t["intent"] for t in tasks]


def test_embedded_proposals_are_solved_and_scored_by_the_sites_evaluators(sites, contexts):
    """One proposed task of every kind of evaluator on every site (string_match, url_match, program_html), solved by
    the scripted oracle in Chromium and scored by the sites' evaluators: every one scores (no judge needed) and
    scores 1. (Every proposed task's evaluator is its family's, checked above; tests/sites/test_families.py runs
    every family's.)"""
    tasks = EmbeddedProposer().propose(contexts, {s: 6 for s in SITES}, random.Random(2))
    one = {}
    for i, t in enumerate(tasks):
        one.setdefault((t["sites"][0], *t["eval"]["eval_types"]), dict(t, task_id=f"proposed-{i}"))
    assert len(one) >= 14 and {k[1] for k in one} == {"string_match", "url_match", "program_html"}
    cfg = load_config().env.model_copy(update={"n_envs": 4})
    episodes = asyncio.run(rollout(list(one.values()), OraclePolicy(), 4, cfg=cfg, hooks=sites, purpose="oracle",
                                   progress=False))
    by_id = {t["task_id"]: t for t in one.values()}
    bad = [(by_id[e["task_id"]]["intent"], e["status"], e["env_score"], e["error"]) for e in episodes
           if e["env_score"] != 1.0]
    assert len(episodes) == len(one) and not bad, bad


def test_parse_proposals_reads_replies_of_many_shapes():
    assert parse_proposals("Sure! Here are tasks for the shop:\nOutput:\n- Find the price of the Blue Mug\n"
                           "- **Add the Red Kettle to my cart.**\n\nHope this helps!") == [
        "Find the price of the Blue Mug", "Add the Red Kettle to my cart."]
    assert parse_proposals('<think>Output: nothing yet</think>Output: ["Open the Books forum", '
                           '{"task": "Who wrote the top post?"}, 3]') == ["Open the Books forum",
                                                                         "Who wrote the top post?"]
    assert parse_proposals("Tasks:\n1. Open the gitlab project dotfiles\n2) Count the open issues of dotfiles\n"
                           "Task 3: open the gitlab project dotfiles") == [
        "Open the gitlab project dotfiles", "Count the open issues of dotfiles"]  # duplicates dropped
    assert parse_proposals("1. `Show the cafe on the map` and `Get directions to the museum`") == [
        "Show the cafe on the map", "Get directions to the museum"]
    assert parse_proposals("") == [] and parse_proposals("Output:\n- ok\n- 123456789") == []


def _propose(body: dict) -> str:
    """An LLM proposer's answer to the prompt: prose, then its tasks after Output:."""
    prompt = body["messages"][0]["content"]
    name = prompt.split("Website: ", 1)[1].split("\n", 1)[0]
    first = prompt.split("What its start page shows:\n- ", 1)[1].split("\n", 1)[0]
    return (f"Here are tasks for {name}.\nOutput:\n1. Find {first} on {name} and tell me what it shows\n"
            f"2. Name the three newest things listed on the start page of {name}\n")


def test_llm_proposer_asks_with_the_sites_context_and_marks_its_tasks_for_the_judge(tmp_path, contexts):
    proposer = chat_handler(_propose)
    with serve(proposer) as url:
        s = load_config("smoke", sets=[f"run.root={tmp_path}", "curriculum.generator=propose", "sites.workers=thread",
                                       f"curriculum.base_url={url}",
                                       "curriculum.model_name=proposer", "curriculum.generation_turns=1",
                                       "curriculum.tasks_per_phase=10"])
        ref, stats = generate_tasks(s, str(tmp_path / "run"), 1, "bootstrap")  # an empty run: no failures needed
    prompts = [body["messages"][0]["content"] for body in proposer.bodies()]
    assert len(prompts) == len(SITES)  # one call per site (2 tasks each, asked in one turn)
    for site in SITES:
        ctx = contexts[site]
        start = html.unescape(ctx.pages["/"])
        (prompt,) = [p for p in prompts if f"Website: {ctx.name}\n" in p]
        assert ctx.name and f"<title>{ctx.name}</title>" in start
        shown = ctx.start_entities[:5]
        assert len(shown) >= 5 and all(f"- {e}\n" in prompt and e in start for e in shown), site
        assert "Write 2 tasks" in prompt and "An example of a task on this website:" in prompt
    tasks = read_json(ref)
    assert len(tasks) == 10 and stats["generated"] == 10 and stats["proposed_judge_only"] == 10
    assert stats["seed_source"] == "site contexts (openai proposer)" and stats["proposed_families"] == 0
    for t in tasks:
        site = t["sites"][0]
        assert t["judge_only"] is True and "family" not in t and t["start_url"] == SITE_PLACEHOLDER[site]
        assert t["proposal"]["by"] == "openai" and t["task_id"].startswith("p1-g")
        first = contexts[site].start_entities[0]
        assert t["intent"] in (f"Find {first} on {contexts[site].name} and tell me what it shows",
                               f"Name the three newest things listed on the start page of {contexts[site].name}")
        if t["intent"].startswith("Find"):
            assert t["proposal"]["entities"][0] == first


def test_propose_stage_needs_no_failures_and_reports_each_site(tmp_path):
    s = load_config("smoke", sets=[f"run.root={tmp_path}", "curriculum.generator=propose", "sites.workers=thread",
                                   "curriculum.tasks_per_phase=12"])
    ref, stats = generate_tasks(s, str(tmp_path / "run"), 1, "bootstrap")
    tasks = read_json(ref)
    assert len(tasks) == stats["generated"] == 12 and stats["proposed_judge_only"] == 0
    assert sum(stats[f"proposed_{site}"] for site in SITES) == 12
    assert all(stats[f"proposed_pages_{site}"] > 1 and stats[f"proposed_entities_{site}"] > 10 for site in SITES)
    assert stats["generated_families"] == stats["proposed_families"] == len({t["family"] for t in tasks}) >= 10
    assert all(t["task_id"].startswith("p1-g") and t["eval"] for t in tasks)
    with pytest.raises(ValueError, match="curriculum.base_url"):
        generate_tasks(load_config("smoke", sets=["curriculum.generator=propose", "sites.mode=webarena"]),
                       str(tmp_path / "run2"), 1, "bootstrap")


def test_train_pool_is_a_fresh_deterministic_draw_per_phase_and_never_a_test_task(tmp_path):
    def draw(phase, seed=0, run="run"):
        s = load_config("smoke", sets=[f"run.root={tmp_path}", "curriculum.generator=train_pool",
                                       "curriculum.tasks_per_phase=40", f"run.seed={seed}"])
        ref, stats = generate_tasks(s, str(tmp_path / run), phase, "rollout")  # no episodes at all: no seeds needed
        assert stats["generated"] == 40 and stats["seed_source"] == "training pool"
        return read_json(ref)

    one = draw(1)
    assert [t["intent"] for t in draw(1, run="again")] == [t["intent"] for t in one]  # same seed and phase
    two = draw(2)
    assert len({t["intent"] for t in one} & {t["intent"] for t in two}) < 10  # a fresh draw each phase
    assert [t["intent"] for t in draw(1, seed=1, run="seed1")] != [t["intent"] for t in one]
    held_out = held_out_set()
    test_insts = {(t["family"], json.dumps(t["instantiation_dict"], sort_keys=True)) for t in held_out}
    for t in one + two:
        assert t["split"] == "train" and t["eval"] and not needs_judge(t)
        assert (t["family"], json.dumps(t["instantiation_dict"], sort_keys=True)) not in test_insts
        assert t["instantiation_dict"] in train_instances(FAMILIES[t["family"]])
    assert not {t["intent"] for t in one + two} & {t["intent"] for t in held_out}
    assert len({t["family"] for t in one}) >= 20  # drawn over the families in turns

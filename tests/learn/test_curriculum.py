import random

from webrl_core.curriculum import EmbeddedGenerator, backtick_tasks, dedupe, filter_by_value, normalise_intent, top_up
from webrl_core.sites import vary_task
from webrl_core.sites.tasks import train_tasks


def _tasks(n):
    return [{"task_id": f"t{i}", "intent": f"task {i}"} for i in range(n)]


def test_filter_keeps_the_window_and_annotates_values():
    values = [(0.01, 0.01, 0.5), (0.05, 0.05, 0.9), (0.5, 0.6, 0.5), (0.75, 0.8, 0.75), (0.9, 0.9, 0.95)]
    kept, dropped = filter_by_value(_tasks(5), values, 0.05, 0.75)
    assert [t["task_id"] for t in kept] == ["t1", "t2", "t3"]  # both bounds inclusive
    assert [t["task_id"] for t in dropped] == ["t0", "t4"]
    assert kept[1]["critic_value"] == 0.5 and kept[1]["critic_p1"] == 0.6


def test_top_up_adds_the_nearest_dropped_tasks_only_when_needed():
    values = [(0.0, 0, 0), (0.04, 0, 0), (0.99, 0, 0), (0.78, 0, 0), (0.3, 0, 0)]
    kept, dropped = filter_by_value(_tasks(5), values, 0.05, 0.75)
    assert [t["task_id"] for t in top_up(kept, dropped, 1, 0.05, 0.75)] == ["t4"]  # enough already
    topped = top_up(kept, dropped, 3, 0.05, 0.75)
    assert [t["task_id"] for t in topped] == ["t4", "t1", "t3"]  # 0.01 and 0.03 away from the window
    assert [bool(t.get("filter_top_up")) for t in topped] == [False, True, True]
    assert len(top_up([], dropped, 10, 0.05, 0.75)) == len(dropped)


def test_dedupe_by_normalised_intent():
    cands = [{"intent": "Buy the Red Mug."}, {"intent": "buy  the red mug"}, {"intent": "Sell it"}]
    assert normalise_intent("  Buy the Red Mug?! ") == "buy the red mug"
    assert [c["intent"] for c in dedupe(cands, ["sell it"])] == ["Buy the Red Mug."]


def test_backtick_tasks_parses_every_span():
    reply = "Here:\n1. `Find the cheapest mug in the store`\n2. `Post a comment on the top thread` and `x`"
    assert backtick_tasks(reply) == ["Find the cheapest mug in the store", "Post a comment on the top thread"]


def test_embedded_generator_varies_within_the_family():
    seeds = train_tasks(6, seed=3)
    by_site = {}
    for t in seeds:
        by_site.setdefault(t["sites"][0], []).append({"task_id": t["task_id"], "intent": t["intent"], "config": t})
    out = EmbeddedGenerator(vary_task).generate(by_site, random.Random(0), 3)
    assert len(out) == 3 * len(by_site)
    parents = {t["task_id"]: t for t in seeds}
    for child in out:
        parent = parents[child["parent_task_id"]]
        assert child["family"] == parent["family"] and child["sites"] == parent["sites"]
        assert child["eval"]  # a verifiable evaluator comes along

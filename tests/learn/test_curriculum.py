import json
import random
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from webrl_core.learn.curriculum import (ChatGenerator, EmbeddedGenerator, backtick_tasks, dedupe, filter_by_value,
                                   normalise_intent, top_up, top_up_sites, value_by_site)
from webrl_core.sites import vary_task
from webrl_core.sites.tasks import train_tasks, widen_task


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


def test_embedded_generator_breadth_draws_other_families_of_the_site():
    seeds = train_tasks(12, seed=4)
    by_site = {}
    for t in seeds:
        by_site.setdefault(t["sites"][0], []).append({"task_id": t["task_id"], "intent": t["intent"], "config": t})
    parents = {t["task_id"]: t for t in seeds}
    wide = EmbeddedGenerator(vary_task, widen=widen_task, breadth=1.0).generate(by_site, random.Random(0), 8)
    for child in wide:
        parent = parents[child["parent_task_id"]]
        assert child["sites"] == parent["sites"] and child["family"] != parent["family"] and child["eval"]
    half = EmbeddedGenerator(vary_task, widen=widen_task, breadth=0.5).generate(by_site, random.Random(0), 40)
    other = sum(c["family"] != parents[c["parent_task_id"]]["family"] for c in half)
    assert 0.3 * len(half) < other < 0.7 * len(half)
    # breadth 0 is the within-family generator draw for draw: a run without the knob generates what it did before
    assert (EmbeddedGenerator(vary_task, widen=widen_task, breadth=0.0).generate(by_site, random.Random(1), 5)
            == EmbeddedGenerator(vary_task).generate(by_site, random.Random(1), 5))
    with pytest.raises(ValueError, match="widen"):
        EmbeddedGenerator(vary_task, breadth=0.5)


class _ChatStub(BaseHTTPRequestHandler):
    requests: list = []

    def log_message(self, *a):
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).requests.append({"path": self.path, "body": body, "auth": self.headers.get("Authorization")})
        out = json.dumps({"id": "c", "object": "chat.completion", "created": 0, "model": body["model"], "choices": [
            {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content":
                                                              "1. `Find the cheapest red mug` 2. `Show my last order`"}}]})
        self.send_response(200 if body["model"] == "gen" else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out.encode())


def test_chat_generator_asks_the_endpoint_and_wraps_each_backtick_task():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _ChatStub)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{srv.server_address[1]}/v1"
    try:
        seeds = {"shopping": [{"task_id": "7", "intent": "Buy a mug"}]}
        out = ChatGenerator(url, "gen", turns=1).generate(seeds, random.Random(0), 5)
        assert [t["intent"] for t in out] == ["Find the cheapest red mug", "Show my last order"]
        assert out[0]["parent_task_id"] == "7" and out[0]["sites"] == ["shopping"]
        (req,) = _ChatStub.requests
        assert req["path"] == "/v1/chat/completions" and req["auth"] is None  # no key, no Authorization header
        assert req["body"]["model"] == "gen" and req["body"]["temperature"] == 1.0 and req["body"]["top_p"] == 1.0
        assert "`Buy a mug`" in req["body"]["messages"][0]["content"]
        assert ChatGenerator(url, "gen", api_key="sk-2").complete("x").startswith("1. `Find")
        assert _ChatStub.requests[-1]["auth"] == "Bearer sk-2"
        with pytest.raises(RuntimeError, match=rf"{url}/chat/completions \(model 'nope'\) failed: NotFoundError"):
            ChatGenerator(url, "nope").complete("x")
    finally:
        srv.shutdown()


def test_top_up_takes_turns_between_sites():
    """A saturated critic (every value near 1) must not fill the top-up from one site: the nearest of every site
    first, then the next of each; within a site, nearest first."""
    tasks = [{"task_id": f"m{i}", "intent": f"map {i}", "sites": ["map"]} for i in range(4)] + \
            [{"task_id": f"g{i}", "intent": f"gitlab {i}", "sites": ["gitlab"]} for i in range(3)]
    values = [(0.99990, 0, 0), (0.99991, 0, 0), (0.99992, 0, 0), (0.99993, 0, 0),
              (0.99999, 0, 0), (0.99998, 0, 0), (1.0, 0, 0)]
    kept, dropped = filter_by_value(tasks, values, 0.05, 0.75)
    assert kept == []
    assert [t["task_id"] for t in top_up(kept, dropped, 4, 0.05, 0.75)] == ["m0", "g1", "m1", "g0"]
    assert [t["task_id"] for t in top_up(kept, dropped, 7, 0.05, 0.75)] == ["m0", "g1", "m1", "g0", "m2", "g2", "m3"]


def test_value_by_site_says_where_the_window_cut_each_site():
    tasks = [{"task_id": f"t{i}", "sites": [site]} for i, site in enumerate(["reddit"] * 3 + ["gitlab"] * 2)]
    values = [(0.01, 0.01, 0.02), (0.03, 0.04, 0.03), (0.02, 0.02, 0.05), (0.3, 0.3, 0.4), (0.9, 0.95, 0.9)]
    kept, dropped = filter_by_value(tasks, values, 0.05, 0.75)
    by = value_by_site(kept + dropped)
    assert by["reddit"] == {"n": 3, "median": 0.02, "min": 0.01, "max": 0.03}  # every reddit task below the window
    assert by["gitlab"]["n"] == 2 and by["gitlab"]["median"] == pytest.approx(0.6)
    assert [t["task_id"] for t in kept] == ["t3"]


def test_top_up_sites_keeps_a_site_whose_every_candidate_left_the_window():
    tasks = [{"task_id": f"r{i}", "sites": ["reddit"]} for i in range(4)] + \
            [{"task_id": f"g{i}", "sites": ["gitlab"]} for i in range(3)]
    values = [(v, v, v) for v in (0.001, 0.04, 0.0, 0.02, 0.3, 0.4, 0.99)]
    kept, dropped = filter_by_value(tasks, values, 0.05, 0.75)
    assert {t["task_id"] for t in kept} == {"g0", "g1"}  # reddit is out of the window entirely
    assert top_up_sites(kept, dropped, 0, 0.05, 0.75) == kept  # 0: the paper's window alone
    out = top_up_sites(kept, dropped, 2, 0.05, 0.75)
    added = [t for t in out if t.get("filter_top_up")]
    assert [t["task_id"] for t in added] == ["r1", "r3"]  # reddit's two nearest the window; gitlab already has 2
    assert len({t["task_id"] for t in out}) == len(out)  # no task twice
    assert [t["task_id"] for t in top_up_sites(out, dropped, 2, 0.05, 0.75)] == [t["task_id"] for t in out]

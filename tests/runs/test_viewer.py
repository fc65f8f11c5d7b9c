"""The static trajectory viewer, fed from a real TrajectoryStore and from plain dicts."""

from __future__ import annotations

import json
from html.parser import HTMLParser

import pytest

from webrl_core.runs.viewer import write_viewer

EVIL = "<script>alert('x')</script><div id=\"7\">Buy</div>"


def episode(eid: str, phase: int, success: bool | None, n: int, **kw) -> dict:
    return {"episode_id": eid, "task_id": f"t-{eid}", "phase": phase, "policy_id": "pol", "purpose": "rollout",
            "status": "done", "final_answer": "42 & <b>", "env_score": 1.0 if success else 0.0,
            "orm_score": 0.75, "success": success, "n_steps": n, "started_at": 1.0, "wall_s": 3.5, "policy_s": 1.25,
            "env_s": 2.0, "error": None, "intent": f"Find the <price> of item {eid}", "site": "shopping", "seed": 0,
            **kw}


def steps_for(eid: str, phase: int, n: int) -> list[dict]:
    return [{"episode_id": eid, "idx": i, "phase": phase, "prompt": f"prompt {i} {EVIL}", "html": f"obs {i} {EVIL}",
             "response": f"# Element: the Buy button\ndo(action=\"Click\", element=\"{i}\")",
             "action": json.dumps({"action": "Click", "element": str(i)}), "url": f"http://127.0.0.1:1/p?a={i}&b=2",
             "reward": 0.0, "done": i == n - 1, "mc_return": 0.9 ** (n - 1 - i), "policy_s": 0.1 * (i + 1),
             "action_s": 0.02, "obs_s": 0.03, "error": None} for i in range(n)]


class _Collect(HTMLParser):
    """Collects tags and the text inside <details> and <script>."""

    def __init__(self):
        super().__init__()
        self.tags, self.depth, self.details_text, self.scripts, self.links = [], 0, [], 0, []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self.depth += tag == "details"
        self.scripts += tag == "script"
        self.links += [v for k, v in attrs if k in ("href", "src")]

    def handle_endtag(self, tag):
        self.depth -= tag == "details"

    def handle_data(self, data):
        if self.depth:
            self.details_text.append(data)


def parse(path) -> _Collect:
    p = _Collect()
    p.feed(path.read_text())
    return p


@pytest.fixture
def store(tmp_path):
    from webrl_core.runs.store import TrajectoryStore

    st = TrajectoryStore(tmp_path / "run")
    st.write_episode(episode("ep-a", 1, True, 2), steps_for("ep-a", 1, 2))
    st.write_episode(episode("ep/b:1", 1, False, 3, status="max_steps", error="timeout <x>"), steps_for("ep/b:1", 1, 3))
    st.write_episode(episode("ep-c", 2, None, 1), steps_for("ep-c", 2, 1))
    shots = tmp_path / "run" / "screenshots" / "ep-a"
    shots.mkdir(parents=True)
    (shots / "1.png").write_bytes(b"\x89PNG\r\n\x1a\nfake")
    return st


def test_pages_from_a_store_are_escaped_and_linked(store, tmp_path):
    index = write_viewer(store, tmp_path / "viewer")
    root = parse(index)
    assert root.links == ["phase_1/index.html", "phase_2/index.html"]
    p1 = tmp_path / "viewer" / "phase_1"
    idx = parse(p1 / "index.html")
    assert idx.links == ["../index.html", "ep-a.html", "ep_b_1.html"]
    html_a = (p1 / "ep-a.html").read_text()
    page = parse(p1 / "ep-a.html")
    assert page.scripts == 0 and "<script>" not in html_a and "&lt;script&gt;" in html_a
    # observation and prompt sit in collapsible <details>, one per step each, text intact after unescaping
    assert page.tags.count("details") == 2 * 2 + 1  # + the screenshot of step 1
    assert any(EVIL in t for t in page.details_text)
    assert "img/ep-a_1.png" in page.links and (p1 / "img" / "ep-a_1.png").read_bytes().startswith(b"\x89PNG")
    assert "Find the &lt;price&gt; of item ep-a" in html_a and "42 &amp; &lt;b&gt;" in html_a
    assert '&#34;Click&#34;' in html_a or "&quot;Click&quot;" in html_a  # the parsed action JSON
    assert "a=1&amp;b=2" in html_a  # the step URL
    html_b = (p1 / "ep_b_1.html").read_text()
    assert "timeout &lt;x&gt;" in html_b and html_b.count('class="step"') == 3 and "max_steps" in html_b
    idx_text = (p1 / "index.html").read_text()
    assert 'class="ok">yes' in idx_text and 'class="fail">no' in idx_text
    assert "1 successes" in idx_text


def test_phase_filter_and_unknown_success(store, tmp_path):
    write_viewer(store, tmp_path / "v2", phase=2)
    assert not (tmp_path / "v2" / "phase_1").exists()
    text = (tmp_path / "v2" / "phase_2" / "index.html").read_text()
    assert 'class="na">-' in text and "ep-c.html" in text


def test_plain_dicts_and_explicit_screenshot(tmp_path):
    shot = tmp_path / "s.png"
    shot.write_bytes(b"\x89PNG\r\n\x1a\nx")
    steps = steps_for("e1", 0, 1)
    steps[0]["screenshot"] = str(shot)
    index = write_viewer({"episodes": [episode("e1", 0, True, 1)], "steps": steps}, tmp_path / "v")
    assert "phase_0/index.html" in parse(index).links
    assert (tmp_path / "v" / "phase_0" / "img" / "e1_0.png").exists()
    with pytest.raises(TypeError, match="TrajectoryStore"):
        write_viewer([1, 2], tmp_path / "v3")

"""Static HTML trajectory viewer: one page per episode, one index per phase, one top index.

Layout written by :func:`write_viewer` under ``out_dir``::

    index.html                      phases with episode counts and success rates
    phase_<p>/index.html            table of the phase's episodes (success, scores, steps, link)
    phase_<p>/<episode_id>.html     intent, task, status, scores, and per step: raw response, parsed action, URL,
                                    timings, the prompt and observation (collapsed) and the screenshot if one exists
    phase_<p>/img/<episode>_<i>.png copied screenshots, so the folder is self-contained

Every value is HTML-escaped by Jinja2's autoescape (observations are markup). Input is a ``TrajectoryStore`` (read
through ``.episodes(phase)`` / ``.steps(phase)``) or plain lists of episode and step dicts (the store's row
contract). A step's screenshot is ``step["screenshot"]`` if set, else ``<screenshot_dir>/<episode_id>/<idx>.png``
(``screenshot_dir`` defaults to ``<run_dir>/screenshots`` for a store).
"""

from __future__ import annotations

import json
import re
import shutil
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterable

from jinja2 import Environment

_ENV = Environment(autoescape=True, trim_blocks=True, lstrip_blocks=True)

_STYLE = """<style>
body{font-family:system-ui,sans-serif;margin:1.5em;max-width:1200px}
table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:3px 8px;text-align:left;vertical-align:top}
.ok{color:#080;font-weight:bold}.fail{color:#b00;font-weight:bold}.na{color:#888}
pre{white-space:pre-wrap;word-break:break-word;background:#f6f6f6;padding:6px;max-height:40em;overflow:auto}
.step{border-top:2px solid #888;margin-top:1em;padding-top:.5em}img{max-width:100%;border:1px solid #ccc}
</style>"""

_ROOT = _ENV.from_string("""<!doctype html><html><head><meta charset="utf-8"><title>webrl trajectories</title>
""" + _STYLE + """</head><body><h1>webrl trajectories</h1>
<table><tr><th>phase</th><th>episodes</th><th>successes</th><th>success rate</th></tr>
{% for p in phases %}<tr><td><a href="{{ p.href }}">{{ p.phase }}</a></td><td>{{ p.n }}</td><td>{{ p.wins }}</td>
<td>{{ p.rate }}</td></tr>
{% endfor %}</table></body></html>
""")

_INDEX = _ENV.from_string("""<!doctype html><html><head><meta charset="utf-8"><title>phase {{ phase }}</title>
""" + _STYLE + """</head><body><p><a href="../index.html">all phases</a></p><h1>Phase {{ phase }}</h1>
<p>{{ episodes|length }} episodes, {{ wins }} successes</p>
<table><tr><th>episode</th><th>task</th><th>site</th><th>purpose</th><th>status</th><th>success</th><th>env_score</th>
<th>orm_score</th><th>steps</th><th>wall s</th><th>intent</th></tr>
{% for e in episodes %}<tr><td><a href="{{ e.href }}">{{ e.episode_id }}</a></td><td>{{ e.task_id }}</td>
<td>{{ e.site }}</td><td>{{ e.purpose }}</td><td>{{ e.status }}</td><td class="{{ e.cls }}">{{ e.success_text }}</td>
<td>{{ e.env_score_text }}</td><td>{{ e.orm_score_text }}</td><td>{{ e.n_steps }}</td><td>{{ e.wall_text }}</td>
<td>{{ e.intent }}</td></tr>
{% endfor %}</table></body></html>
""")

_EPISODE = _ENV.from_string("""<!doctype html><html><head><meta charset="utf-8"><title>{{ e.episode_id }}</title>
""" + _STYLE + """</head><body><p><a href="index.html">phase {{ e.phase }}</a></p>
<h1>{{ e.intent }}</h1>
<table>
<tr><th>episode</th><td>{{ e.episode_id }}</td></tr><tr><th>task</th><td>{{ e.task_id }}</td></tr>
<tr><th>site</th><td>{{ e.site }}</td></tr><tr><th>policy</th><td>{{ e.policy_id }}</td></tr>
<tr><th>purpose</th><td>{{ e.purpose }}</td></tr><tr><th>status</th><td>{{ e.status }}</td></tr>
<tr><th>success</th><td class="{{ e.cls }}">{{ e.success_text }}</td></tr>
<tr><th>env_score</th><td>{{ e.env_score_text }}</td></tr><tr><th>orm_score</th><td>{{ e.orm_score_text }}</td></tr>
<tr><th>final answer</th><td>{{ e.final_answer }}</td></tr>
<tr><th>steps</th><td>{{ e.n_steps }}</td></tr>
<tr><th>time</th><td>wall {{ e.wall_text }} s, policy {{ e.policy_text }} s, env {{ e.env_text }} s</td></tr>
{% if e.error %}<tr><th>error</th><td class="fail">{{ e.error }}</td></tr>{% endif %}
</table>
{% for s in steps %}<div class="step"><h3>Step {{ s.idx }}</h3>
<p><b>URL</b> {{ s.url }}</p>
<p><b>Response</b></p><pre>{{ s.response }}</pre>
<p><b>Action</b></p><pre>{{ s.action_text }}</pre>
<p><b>reward</b> {{ s.reward }} &middot; <b>done</b> {{ s.done }} &middot; <b>mc_return</b> {{ s.mc_return }}
&middot; <b>policy</b> {{ s.policy_text }} s &middot; <b>action</b> {{ s.action_s_text }} s
&middot; <b>observation</b> {{ s.obs_text }} s</p>
{% if s.error %}<p class="fail">{{ s.error }}</p>{% endif %}
{% if s.img %}<details open><summary>screenshot</summary><img src="{{ s.img }}" alt="step {{ s.idx }}"></details>{% endif %}
<details><summary>observation ({{ s.html_len }} chars)</summary><pre>{{ s.html }}</pre></details>
<details><summary>prompt ({{ s.prompt_len }} chars)</summary><pre>{{ s.prompt }}</pre></details>
</div>
{% endfor %}</body></html>
""")


def _num(v: Any, fmt: str = "{:.3f}") -> str:
    return "-" if v is None else fmt.format(v)


def _safe_name(name: str) -> str:
    """A file name for an episode id (ids may hold "/" or ":")."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", str(name))[:150] or "episode"


def _episode_view(e: dict) -> dict:
    success = e.get("success")
    return {**e, "href": f"{_safe_name(e['episode_id'])}.html",
            "cls": "na" if success is None else ("ok" if success else "fail"),
            "success_text": "-" if success is None else ("yes" if success else "no"),
            "env_score_text": _num(e.get("env_score")), "orm_score_text": _num(e.get("orm_score")),
            "wall_text": _num(e.get("wall_s"), "{:.1f}"), "policy_text": _num(e.get("policy_s"), "{:.1f}"),
            "env_text": _num(e.get("env_s"), "{:.1f}")}


def _action_text(action: Any) -> str:
    if action is None:
        return ""
    try:  # pretty-print the stored JSON string
        return json.dumps(json.loads(action), indent=1) if isinstance(action, str) else json.dumps(action, indent=1)
    except (TypeError, ValueError):
        return str(action)


def _step_view(s: dict, img: str | None) -> dict:
    html, prompt = s.get("html") or "", s.get("prompt") or ""
    return {**s, "img": img, "action_text": _action_text(s.get("action")), "html": html, "html_len": len(html),
            "prompt": prompt, "prompt_len": len(prompt), "policy_text": _num(s.get("policy_s")),
            "action_s_text": _num(s.get("action_s")), "obs_text": _num(s.get("obs_s"))}


def render_episode(episode: dict, steps: list[dict], images: dict[int, str] | None = None) -> str:
    """HTML of one episode page; ``images`` maps step idx to an image src relative to the page."""
    images = images or {}
    steps = sorted(steps, key=lambda s: s.get("idx", 0))
    return _EPISODE.render(e=_episode_view(episode), steps=[_step_view(s, images.get(s.get("idx"))) for s in steps])


def render_phase_index(phase: Any, episodes: list[dict]) -> str:
    views = [_episode_view(e) for e in episodes]
    return _INDEX.render(phase=phase, episodes=views, wins=sum(bool(e.get("success")) for e in episodes))


def _load(source: Any, phase: int | None) -> tuple[list[dict], list[dict], Path | None]:
    if isinstance(source, dict):  # {"episodes": [...], "steps": [...]}
        eps, steps = list(source.get("episodes", [])), list(source.get("steps", []))
        if phase is not None:
            eps = [e for e in eps if e.get("phase") == phase]
        return eps, steps, None
    if hasattr(source, "episodes") and hasattr(source, "steps"):
        run_dir = Path(source.root).parent if hasattr(source, "root") else None
        return source.episodes(phase), source.steps(phase), run_dir
    raise TypeError(f"write_viewer: expected a TrajectoryStore or {{'episodes': [...], 'steps': [...]}}, "
                    f"got {type(source).__name__}")


def write_viewer(store: Any, out_dir: str | Path, phase: int | None = None,
                 screenshot_dir: str | Path | None = None, progress: bool = False) -> Path:
    """Write the viewer for ``phase`` (all phases if None); returns ``out_dir/index.html``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    episodes, steps, run_dir = _load(store, phase)
    if screenshot_dir is None and run_dir is not None:
        screenshot_dir = run_dir / "screenshots"
    by_ep: dict[str, list[dict]] = defaultdict(list)
    for s in steps:
        by_ep[s["episode_id"]].append(s)
    by_phase: dict[Any, list[dict]] = defaultdict(list)
    for e in episodes:
        by_phase[e.get("phase")].append(e)

    items: Iterable = sorted(episodes, key=lambda e: (str(e.get("phase")), str(e["episode_id"])))
    if progress:
        from webrl_core.logs import track

        items = track(list(items), description="writing episode pages")
    for e in items:
        folder = out / f"phase_{e.get('phase')}"
        folder.mkdir(parents=True, exist_ok=True)
        images = {}
        for s in by_ep.get(e["episode_id"], []):
            src = s.get("screenshot")
            if not src and screenshot_dir is not None:
                src = Path(screenshot_dir) / str(e["episode_id"]) / f"{s.get('idx')}.png"
            if src and Path(src).is_file():
                name = f"img/{_safe_name(e['episode_id'])}_{s.get('idx')}{Path(src).suffix or '.png'}"
                (folder / "img").mkdir(exist_ok=True)
                shutil.copyfile(src, folder / name)
                images[s.get("idx")] = name
        (folder / f"{_safe_name(e['episode_id'])}.html").write_text(
            render_episode(e, by_ep.get(e["episode_id"], []), images), encoding="utf-8")

    rows = []
    for p in sorted(by_phase, key=str):
        eps = sorted(by_phase[p], key=lambda e: str(e["episode_id"]))
        (out / f"phase_{p}").mkdir(parents=True, exist_ok=True)
        (out / f"phase_{p}" / "index.html").write_text(render_phase_index(p, eps), encoding="utf-8")
        wins = sum(bool(e.get("success")) for e in eps)
        rows.append({"phase": p, "href": f"phase_{p}/index.html", "n": len(eps), "wins": wins,
                     "rate": f"{wins / len(eps):.1%}" if eps else "-"})
    index = out / "index.html"
    index.write_text(_ROOT.render(phases=rows), encoding="utf-8")
    return index

"""WebRL's text observation: simplified HTML in which interactive elements carry numeric ids.

Contract (the official observation: VAB-WebArena-Lite ``new/html_tools``, whose ``scripts/label.js`` numbers
elements with ``data-label-id``), produced here by ONE in-page pass (``observation.js``):

* the page first settles: Playwright's load state, no in-flight fetch/XHR (tracked per page), then the DOM
  must stay quiet for ``QUIET_MS``; every wait is bounded by ``settle_timeout_ms`` (no fixed sleeps);
* interactive elements (a[href], button, input, select, textarea, summary, onclick, clickable ARIA roles,
  contenteditable, jsaction click, the top of a ``cursor:pointer`` region) that are visible in the viewport
  get ``data-label-id`` = 0, 1, 2, ... in DOM order; only the outermost clickable is numbered, except that
  form controls and links inside a clickable container keep their own id;
* script/style/comments and invisible nodes are dropped (with ``viewport_only``: nodes outside the viewport);
* a node renders as ``<tag id="N" k="v" ...> text children </tag>`` with ``id`` only on interactive nodes and
  only whitelisted attributes (title, value, type, placeholder, selected, data-value, data-text, data-testid,
  data-label, data-status, and data-bbox when ``keep_bbox``). Live form state is shown: inputs carry their
  current ``value``, checkboxes/radios ``data-status="checked"|"not-checked"``, a select carries
  ``data-value`` = the selected option's text and lists its options, the selected one with
  ``data-status="selected"``. An interactive node without text is named by ``title`` (from aria-label/alt);
* whitespace is collapsed, each text run is cut to 500 characters, ``& < >`` in text and ``& " <`` in
  attribute values are written as HTML entities; a wrapper with no id, attributes or own text and a single
  child is replaced by that child.

``parse_observation_elements`` reads that text back into ``ObsElement``s (the oracle policies use it to
find ids by text, placeholder or title).
"""

from __future__ import annotations

import asyncio
import re
import time
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path

OBS_JS = (Path(__file__).with_name("observation.js")).read_text()
MAX_TEXT = 500
QUIET_MS = 40  # the DOM must not change for this long before the page counts as settled

_VOID = {"input", "img", "hr", "area", "svg", "canvas", "iframe"}


@dataclass
class Observation:
    """What the agent sees after reset/step. ``html`` is the prompt text (an ``[error] ...`` line first when the
    previous action failed)."""

    html: str
    url: str
    n_elements: int = 0
    title: str = ""
    error: str | None = None
    obs_s: float = 0.0


@dataclass
class ObsElement:
    id: str            # the numeric id as a string ("" for elements without one)
    tag: str
    text: str          # all text inside the element, whitespace-collapsed
    attrs: dict[str, str] = field(default_factory=dict)
    parent: int | None = None   # index of the enclosing element in the parsed list (None at the top)


class RequestTracker:
    """Counts a page's in-flight fetch/XHR/document requests so settling can wait for the network."""

    _TYPES = {"fetch", "xhr", "document"}

    def __init__(self, page) -> None:
        self.inflight: set = set()
        page.on("request", self._start)
        page.on("requestfinished", self._end)
        page.on("requestfailed", self._end)

    def _start(self, req) -> None:
        if req.resource_type in self._TYPES:
            self.inflight.add(req)

    def _end(self, req) -> None:
        self.inflight.discard(req)

    async def idle(self, timeout_s: float) -> None:
        end = time.perf_counter() + timeout_s
        while self.inflight and time.perf_counter() < end:
            await asyncio.sleep(0.01)


async def settle(page, timeout_ms: int, tracker: RequestTracker | None = None) -> None:
    """Wait (bounded) for the document to load and for pending fetch/XHR to finish."""
    if timeout_ms <= 0:
        return
    try:
        await page.wait_for_load_state("load", timeout=timeout_ms)
    except Exception:  # a slow subresource must not block the agent; the DOM check follows
        pass
    if tracker is not None:
        await tracker.idle(timeout_ms / 1000)


async def extract(page, *, keep_bbox: bool = False, viewport_only: bool = True, settle_timeout_ms: int = 3000,
                  tracker: RequestTracker | None = None, retries: int = 3) -> Observation:
    """Settle the page and return its simplified HTML (one page.evaluate)."""
    t0 = time.perf_counter()
    opts = {"keepBbox": keep_bbox, "maxText": MAX_TEXT, "viewportOnly": viewport_only,
            "quietMs": QUIET_MS if settle_timeout_ms > 0 else 0, "settleMs": settle_timeout_ms}
    last: Exception | None = None
    for _ in range(retries):
        await settle(page, settle_timeout_ms, tracker)
        try:
            out = await page.evaluate(OBS_JS, opts)
            return Observation(html=out["html"], url=out["url"], n_elements=out["nLabels"], title=out["title"],
                               obs_s=time.perf_counter() - t0)
        except Exception as e:  # a navigation destroyed the context mid-evaluate: wait for the new document
            if "context was destroyed" not in str(e) and "navigat" not in str(e).lower():
                raise
            last = e
    raise RuntimeError(f"observation failed after {retries} tries: {last}")


# ---------------------------------------------------------------------------------------------
# reading an observation back

class _ObsParser(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.elements: list[ObsElement] = []
        self.stack: list[tuple[ObsElement, list[str], int]] = []  # (element, text parts, index)

    def _new(self, tag, attrs) -> ObsElement:
        parent = self.stack[-1][2] if self.stack else None
        el = ObsElement(id="", tag=tag, text="", attrs={k: (v or "") for k, v in attrs}, parent=parent)
        el.id = el.attrs.pop("id", "")
        self.elements.append(el)
        return el

    def handle_starttag(self, tag, attrs):
        el = self._new(tag, attrs)
        if tag not in _VOID:
            self.stack.append((el, [], len(self.elements) - 1))

    def handle_startendtag(self, tag, attrs):
        self._new(tag, attrs)

    def handle_endtag(self, tag):
        # close up to the matching open tag (tolerates a cut-off or slightly broken observation)
        for i in range(len(self.stack) - 1, -1, -1):
            if self.stack[i][0].tag == tag:
                while len(self.stack) > i:
                    el, parts, _ = self.stack.pop()
                    el.text = " ".join(" ".join(parts).split())
                    if self.stack:
                        self.stack[-1][1].append(el.text)
                return

    def handle_data(self, data):
        if self.stack:
            self.stack[-1][1].append(data)

    def close(self):
        super().close()
        while self.stack:
            el, parts, _ = self.stack.pop()
            el.text = " ".join(" ".join(parts).split())
            if self.stack:
                self.stack[-1][1].append(el.text)


_ERROR_LINE = re.compile(r"^\[error\][^\n]*\n")


def parse_observation_elements(obs: str) -> list[ObsElement]:
    """All elements of an observation in document order.

    ``text`` is the whitespace-collapsed text of the element and its descendants (entities decoded), so a
    ``<button id="3"> <span> Sign in </span> </button>`` reads as id "3", text "Sign in". ``attrs`` holds
    every other attribute (placeholder, value, title, data-status, ...). Elements without an id have
    ``id == ""``; use ``labelled_elements`` for the interactive ones. A leading ``[error] ...`` line and a
    truncated tail (the prompt budget cuts observations) are tolerated.
    """
    p = _ObsParser()
    p.feed(_ERROR_LINE.sub("", obs))
    p.close()
    return p.elements


def labelled_elements(obs: str) -> list[ObsElement]:
    """The interactive elements (those with a numeric id) of an observation."""
    return [e for e in parse_observation_elements(obs) if e.id.isdigit()]


def find_element(obs: str, text: str | None = None, *, tag: str | None = None, exact: bool = False,
                 case_sensitive: bool = False, **attrs: str) -> ObsElement | None:
    """First labelled element matching all given conditions (case-insensitive unless ``case_sensitive``).

    ``text`` matches the element's text (substring unless ``exact``), or its placeholder/title/value when it
    has no text; keyword ``attrs`` (use ``data_status=...`` for ``data-status``) must be substrings of the
    attribute values.
    """
    def norm(s: str) -> str:
        s = " ".join(s.split())
        return s if case_sensitive else s.lower()

    for el in labelled_elements(obs):
        if tag and el.tag != tag:
            continue
        if text is not None:
            names = [el.text] + [el.attrs.get(k, "") for k in ("placeholder", "title", "value", "data-label")]
            want = norm(text)
            ok = any((norm(n) == want) if exact else (want in norm(n)) for n in names if n)
            if not ok:
                continue
        if any(norm(v) not in norm(el.attrs.get(k.replace("_", "-"), "")) for k, v in attrs.items()):
            continue
        return el
    return None

"""The families' shared parts: the oracle toolkit (reading the current page, writing responses), the
``Family`` base class and its registry, the WebArena evaluator builders."""

from __future__ import annotations

import hashlib
import json
from abc import ABC, abstractmethod
from dataclasses import dataclass
from urllib.parse import parse_qs, urlsplit

from webrl_core.env.observation import find_element, labelled_elements, parse_observation_elements


# --------------------------------------------------------------------------- oracle toolkit

@dataclass
class PageView:
    """What an oracle looks at: the current URL (split) and observation."""

    url: str
    html: str
    step: int = 0

    @property
    def path(self) -> str:
        return urlsplit(self.url).path.rstrip("/") or "/"

    @property
    def query(self) -> dict[str, str]:
        return {k: v[-1] for k, v in parse_qs(urlsplit(self.url).query).items()}

    def text(self) -> str:
        els = parse_observation_elements(self.html)
        return " ".join(e.text for e in els if e.parent is None)


def q(s: str) -> str:
    """A Python string literal the action parser accepts."""
    return json.dumps(s, ensure_ascii=False)


def do(action: str, el=None, argument: str | None = None, what: str | None = None) -> str:
    lines = []
    if el is not None:
        desc = what or el.text or el.attrs.get("placeholder") or el.attrs.get("title") or el.tag
        lines.append(f"# Element: {desc[:80]}")
    args = [f"action={q(action)}"]
    if argument is not None:
        args.append(f"argument={q(argument)}")
    if el is not None:
        args.append(f"element={q(el.id)}")
    lines.append(f"do({', '.join(args)})")
    return "\n".join(lines)


def finish(message: str, note: str | None = None) -> str:
    return (f"# Note: {note}\n" if note else "") + f"exit(message={q(message)})"


def scroll_or_fail(page: PageView, why: str) -> str:
    # the target is not among the visible elements: scroll once, then give up with a clear note
    if page.step < 12:
        return f"# Note: {why}; scrolling to look for it\ndo(action=\"Scroll Down\")"
    return finish("I could not complete the task.", why)


def link(page: PageView, text: str, exact: bool = True):
    return find_element(page.html, text, tag="a", exact=exact)


def button(page: PageView, text: str):
    return find_element(page.html, text, tag="button", exact=True)


def field(page: PageView, placeholder: str, tag: str | None = None):
    for el in labelled_elements(page.html):
        if el.attrs.get("placeholder", "").lower() == placeholder.lower() and (tag is None or el.tag == tag):
            return el
    return None


def select_with(page: PageView, option: str):
    """The select element that offers an option with this text."""
    els = parse_observation_elements(page.html)
    for i, el in enumerate(els):
        if el.tag == "select" and el.id.isdigit():
            opts = [o.text.lower() for o in els[i + 1:] if o.tag == "option" and o.parent == i]
            if option.lower() in opts:
                return el
    return None


def selected_text(el) -> str:
    return el.attrs.get("data-value", "") if el is not None else ""


def row_link(page: PageView, row_text: str, link_text: str):
    """The link ``link_text`` inside the table row / list item whose text holds ``row_text``."""
    els = parse_observation_elements(page.html)
    for el in els:
        if not (el.id.isdigit() and el.tag == "a" and el.text.strip().lower() == link_text.lower()):
            continue
        p = el.parent
        while p is not None:
            if els[p].tag in ("tr", "li") and row_text.lower() in els[p].text.lower():
                return el
            p = els[p].parent
    return None


def search_then_click(page: PageView, query: str, placeholder: str, target: str, exact: bool = True) -> str:
    """Click the link ``target`` if it is on the page, else search for ``query`` (or page on)."""
    el = link(page, target, exact)
    if el is not None:
        return do("Click", el)
    box = field(page, placeholder)
    if box is not None and box.attrs.get("value", "").lower() != query.lower():
        return do("Search", box, query)
    nxt = link(page, "Next")
    if nxt is not None:
        return do("Click", nxt)
    if box is not None:
        return do("Search", box, query)
    return scroll_or_fail(page, f"no search box and no link '{target}'")


def click_link(page: PageView, text: str, exact: bool = True) -> str:
    el = link(page, text, exact)
    return do("Click", el) if el is not None else scroll_or_fail(page, f"link '{text}' not visible")


# --------------------------------------------------------------------------- family registry

class Family(ABC):
    """A task family: its site and phrasings, its instantiations, its evaluator and its scripted expert."""

    name: str                                  # "<site>.<what>": the ``family`` field of its tasks
    site: str
    start_url: str                             # the site's URL placeholder: every task starts on its home page
    templates: list[str]                       # intent phrasings; str.format(**inst); "<group>|..." with template_key
    test_quota: int                            # how many of its instantiations are held out for the test set
    template_key: str | None = None            # inst key that selects the phrasing group (see ``phrasings``)

    @abstractmethod
    def instances(self, d: dict) -> list[dict]:
        """Every instantiation the seeded data ``d`` (``data.site_data``) supports, in a fixed order."""

    @abstractmethod
    def evaluator(self, inst: dict, d: dict) -> dict:
        """The ``eval`` config (WebArena format) that scores a task of this instantiation."""

    @abstractmethod
    def oracle(self, inst: dict, page: PageView) -> str:
        """The scripted expert's next response on ``page``."""

    def build(self, inst: dict, d: dict) -> dict:
        """The task config's ``start_url`` and ``eval`` for one instantiation."""
        return {"start_url": self.start_url, "eval": self.evaluator(inst, d)}

    def phrasings(self, inst: dict) -> list[str]:
        if self.template_key is None:
            return self.templates
        return [t.split("|", 1)[1] for t in self.templates if t.split("|", 1)[0] == str(inst[self.template_key])]


FAMILIES: dict[str, Family] = {}
"""family name -> the family; in definition order, which fixes the test set and ``intent_template_id``."""


def register(cls: type[Family]) -> type[Family]:
    """Class decorator: add an instance of the family class to ``FAMILIES``."""
    if cls.name in FAMILIES:
        raise ValueError(f"task family {cls.name!r} is defined twice")
    FAMILIES[cls.name] = cls()
    return cls


def ev_string(answer: str | list[str], how: str = "must_include") -> dict:
    ref = answer if isinstance(answer, list) else [answer]
    return {"eval_types": ["string_match"], "reference_answers": {how: ref if how != "exact_match" else ref[0]},
            "reference_url": None, "program_html": [], "reference_answer_raw_annotation": ", ".join(ref)}


def ev_url(url: str, note: str = "EXACT") -> dict:
    return {"eval_types": ["url_match"], "reference_answers": None, "reference_url": url, "program_html": [],
            "url_note": note}


def ev_html(*targets: tuple[str, str, dict]) -> dict:
    return {"eval_types": ["program_html"], "reference_answers": None, "reference_url": None,
            "program_html": [{"url": u, "locator": loc, "required_contents": rc} for u, loc, rc in targets]}


def stable_hash(obj) -> int:
    return int(hashlib.sha1(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:12], 16)

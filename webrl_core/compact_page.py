"""A compact text rendering of WebRL's simplified HTML, for small models (``prompt.observation: compact``).

The simplified HTML (``env.observation``) spends most of its tokens on markup: every node opens and closes a tag,
table cells render as ``<td> ... </td>``, a select lists each ``<option>`` element. A 135M model reads the same
page from far fewer tokens when each block is one line and each interactive element is its id in brackets:

* block elements (``BLOCK_TAGS``: body, header, nav, main, div, p, ul, li, tr, h1-h6, form, ...) end the line, so
  a list item, a paragraph or a table row is one line; inline content (spans, labels, cells) flows on it;
* a table row's cells are joined with `` | `` (``<tr><td>a</td><td>b</td></tr>`` -> ``a | b``); headings start
  with ``#``;
* an element with an id renders as ``[N]`` then what identifies it, once:
  - a link or clickable: its text (``[5] byteblaze / api-gateway``); without text its title;
  - ``button``: ``[N] button <text>``;
  - ``input``/``textarea``: ``[N] input`` + the type when not text, the placeholder in quotes, ``value="..."``
    when it holds one, ``checked``/``not checked`` for checkboxes and radios;
  - ``select``: ``[N] select "<selected>"`` and ``options: a | b | c`` (each option's text once);
* text is whitespace-collapsed and entities decoded; a line that repeats the previous one is dropped.

``id_after=True`` (``prompt.observation: compact_id_after``) writes each id after what identifies the element
(``byteblaze / api-gateway [5]``, ``button Go [2]``, ``input "Search" [1]``, ``select "Guest" [4] options: ...``).
An actor names the element first (``# Element: movies``) and writes its id after, so in this order the id is the
token that follows the name it just wrote; in the ``[N] text`` order it is the token before. Measured on SmolLM2-135M
(docs/notebook/grounding.md): at 0.8 epoch alone it reads ids no better than ``[N] text``; with the list shuffle
(``bootstrap.sft_list_shuffle``) at 2 epochs, 88.3% exact next action against 81.7%, so the demos use it.

Every id of the HTML appears exactly once, so an action's ``element="N"`` means the same element in both
renderings (``tests/test_compact_page.py`` checks it on every held-out task's oracle steps). The rendering is a
pure function of the HTML string: stored observations stay the simplified HTML, and any stage can re-render
them (rollout, critic, replay and training see byte-identical prompts, ``prompts.build_prompt``).
"""

from __future__ import annotations

import re
from html.parser import HTMLParser

BLOCK_TAGS = frozenset({"body", "header", "nav", "main", "footer", "section", "article", "aside", "div", "p", "ul",
                        "ol", "li", "tr", "table", "thead", "tbody", "tfoot", "form", "fieldset", "dl", "dt", "dd",
                        "h1", "h2", "h3", "h4", "h5", "h6", "hr", "pre", "blockquote", "details", "figure"})
HEADINGS = frozenset({"h1", "h2", "h3", "h4", "h5", "h6"})
CELLS = frozenset({"td", "th"})
FIELDS = frozenset({"input", "textarea"})
VOID = frozenset({"input", "img", "hr", "area"})
_ERROR_LINE = re.compile(r"^(\[error\][^\n]*)\n")


class _Compact(HTMLParser):
    def __init__(self, id_after: bool = False) -> None:
        super().__init__(convert_charrefs=True)
        self.id_after = id_after
        self.lines: list[str] = []
        self.parts: list[str] = []     # pieces of the line being built
        self.cells = 0                 # cells opened on the current table row
        self.flushes = 0               # lines ended so far (a labelled element's text is one line's parts)
        self.stack: list[str] = []     # open tags
        self.select: dict | None = None  # the open <select>: id, options, selected
        # (tag, len(parts) at open, title, id, lines at open) of the open elements with an id
        self.labelled: list[tuple[str, int, str, str, int]] = []
        self.texts: dict[str, str] = {}  # id -> what identifies the element (element_texts)

    # -- lines ---------------------------------------------------------------------------------------------------
    def _flush(self) -> None:
        line = " ".join(" ".join(self.parts).split())
        self.parts, self.cells = [], 0
        self.flushes += 1
        if line and line.strip("| ") and (not self.lines or self.lines[-1] != line):
            self.lines.append(line)

    def _put(self, text: str) -> None:
        text = " ".join(text.split())
        if text:
            self.parts.append(text)

    # -- parser hooks --------------------------------------------------------------------------------------------
    def handle_starttag(self, tag, attrs):
        a = {k: (v or "") for k, v in attrs}
        if self.select is not None:  # inside a select: only options matter
            if tag == "option":
                self.select["option"] = []
                if a.get("data-status") == "selected" or "selected" in a:
                    self.select["chosen"] = True
            return
        if tag in BLOCK_TAGS:
            self._flush()
        if tag in HEADINGS:
            self.parts.append("#")
        if tag in CELLS:
            if self.cells:
                self.parts.append("|")
            self.cells += 1
        el_id = a.get("id", "")
        if tag == "select":
            self.select = {"id": el_id, "value": a.get("data-value", ""), "options": [], "option": None}
            return
        if tag in FIELDS:
            self._field(tag, el_id, a)
            return
        if el_id:
            if not self.id_after:
                self.parts.append(f"[{el_id}]" + (" button" if tag == "button" else ""))
            elif tag == "button":
                self.parts.append("button")  # its id follows its text, at the end tag
            self.labelled.append((tag, len(self.parts), a.get("title", ""), el_id, self.flushes))
        if tag not in VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag, attrs):
        self.handle_starttag(tag, attrs)
        if tag not in VOID and tag not in FIELDS and tag != "select" and self.stack and self.stack[-1] == tag:
            self.handle_endtag(tag)

    def _field(self, tag: str, el_id: str, a: dict[str, str]) -> None:
        kind = (a.get("type") or "text").lower()
        bits = ["" if self.id_after or not el_id else f"[{el_id}]", "input" if tag == "input" else "textarea"]
        if kind not in ("text", "") and tag == "input":
            bits.append(kind)
        for key in ("placeholder", "title"):
            if a.get(key):
                bits.append(f'"{a[key]}"')
                break
        if a.get("value") and kind not in ("checkbox", "radio", "submit", "button"):
            bits.append(f'value="{a["value"]}"')
        elif kind in ("submit", "button") and a.get("value"):
            bits.append(a["value"])
        status = a.get("data-status")
        if status in ("checked", "not-checked"):
            bits.append(status.replace("-", " "))
        if el_id and (a.get("placeholder") or a.get("title")):
            self.texts[el_id] = a.get("placeholder") or a["title"]
        if self.id_after and el_id:
            bits.append(f"[{el_id}]")
        self.parts.append(" ".join(b for b in bits if b))
        if tag == "textarea":
            self.stack.append(tag)

    def handle_endtag(self, tag):
        if self.select is not None:
            if tag == "option" and self.select["option"] is not None:
                text = " ".join(" ".join(self.select["option"]).split())
                self.select["options"].append(text)
                if self.select.pop("chosen", False) and not self.select["value"]:
                    self.select["value"] = text
                self.select["option"] = None
            elif tag == "select":
                s, self.select = self.select, None
                self.parts.append(f'{self._select_head(s)} options: ' + " | ".join(o for o in s["options"] if o))
            return
        if tag not in self.stack:
            return
        while self.stack:
            open_tag = self.stack.pop()
            if self.labelled and self.labelled[-1][0] == open_tag:
                _, start, title, el_id, flushes = self.labelled.pop()
                if len(self.parts) == start and title:  # nothing inside: the title names it
                    self.parts.append(title)
                if flushes == self.flushes:  # its text did not span lines
                    self.texts[el_id] = " ".join(" ".join(self.parts[start:]).split())
                if self.id_after:
                    self.parts.append(f"[{el_id}]")
            if open_tag in BLOCK_TAGS:
                self._flush()
            if open_tag == tag:
                break

    def _select_head(self, s: dict) -> str:
        if not s["id"]:
            return f'select "{s["value"]}"'
        return f'select "{s["value"]}" [{s["id"]}]' if self.id_after else f'[{s["id"]}] select "{s["value"]}"'

    def handle_data(self, data):
        if self.select is not None:
            if self.select["option"] is not None:
                self.select["option"].append(data)
            return
        if self.stack and self.stack[-1] == "textarea":
            return  # a textarea's text is its value, shown by the field itself
        self._put(data)

    def close(self):
        super().close()
        if self.select is not None:  # cut-off observation inside a select
            self.parts.append(self._select_head(self.select))
            self.select = None
        self._flush()


def _parsed(html: str, id_after: bool) -> tuple[_Compact, list[str]]:
    """The parser after the page (a leading ``[error] ...`` line set aside), and that line as a list of 0 or 1."""
    m = _ERROR_LINE.match(html)
    p = _Compact(id_after)
    p.feed(html[m.end():] if m else html)
    p.close()
    return p, [m.group(1)] if m else []


def compact_page(html: str, id_after: bool = False) -> str:
    """The compact rendering of one simplified-HTML observation (module docstring); a leading ``[error] ...``
    line is kept as the first line. ``id_after``: each id after the element's text instead of before it."""
    p, error = _parsed(html, id_after)
    return "\n".join(error + p.lines)


def element_texts(html: str) -> dict[str, str]:
    """What identifies each element with an id, as the compact rendering writes it: a link's or button's text (its
    title when empty), a field's placeholder (or title). Elements whose text spans lines and selects are left out."""
    return _parsed(html, id_after=True)[0].texts

"""Context-aware task proposer: a phase's tasks written from each website's own context, not from failures.

PAE (Proposer-Agent-Evaluator, Zhou et al. 2024, amazon-science/PAE; its proposer is
``scripts/propose_tasks_from_names_webvoyager.py``) asks an LLM, per website, for diverse tasks whose outcome can be
checked objectively and that take a few (3-7) steps, given the website's name and one example task, and reads the
tasks after an ``Output:`` marker of the reply; its context-aware variant also shows the model the website itself.
Here a site's context is a ``SiteContext``: its name (the start page's title), a description (``SITE_DESCRIPTIONS``)
and the entities its pages show (``read_site``: the start page and the pages linked from it, fetched over HTTP from
the sites the stage serves; an entity is the text of a link, a table cell or a select option in the page's main
content). Two proposers turn contexts into task configs:

- ``EmbeddedProposer`` (the embedded sites, no LLM): for every task family of the site, the training-pool
  instantiations whose named things (``ENTITY_KEYS``: the product, forum and post, project and file, place ...) all
  appear among the entities read from the pages; it takes them in turns over the families, so every family the pages
  ground is covered. Each task is a regular family task with its evaluator, so the sites score it; a held-out test
  instantiation is never proposed. Entities no family can use (issue titles, user names) are left out rather than
  proposed as tasks nobody can score.
- ``LLMProposer`` (``curriculum.base_url``: an OpenAI-compatible endpoint; ``curriculum.hf_model``: a local model;
  the completion is ``ChatGenerator.complete`` / ``HFGenerator.complete``): a PAE-style prompt (``PROPOSAL_PROMPT``,
  our wording) with the site's name, description, the entities its start page shows and, on the embedded sites, one
  example task; ``parse_proposals`` reads the reply. Its tasks start on the site's start page and have no reference
  answer: the sites' evaluators cannot score them, so they carry ``judge_only: true`` (and the dummy evaluator of
  every LLM-written task, ``make_generated_task_config``) for PAE's judge (``reward.source: judge``) or the ORM.

``proposal_stats``: per site the tasks proposed, the families covered and the entities and pages read; the tasks
marked judge-only.
"""

from __future__ import annotations

import json
import math
import random
import re
from dataclasses import dataclass, field
from html.parser import HTMLParser
from typing import Any, Protocol
from urllib.parse import urljoin, urlsplit

import httpx

from webrl_core.env.placeholders import SITE_PLACEHOLDER
from webrl_core.env.webarena import make_generated_task_config
from webrl_core.learn.curriculum import backtick_tasks, normalise_intent
from webrl_core.sites.families import FAMILIES
from webrl_core.sites.tasks import families_of, make_task, train_instances

SITE_DESCRIPTIONS = {
    "shopping": "an online store: a signed-in customer browses categories, searches products, reads their reviews, "
                "fills a cart, checks out and looks up past orders",
    "shopping_admin": "the admin panel of an online store: the product catalog with prices and stock, sales orders "
                      "and their status, customer accounts and monthly sales reports",
    "gitlab": "a code hosting site like GitLab: projects with their files, issues, merge requests and members",
    "reddit": "a discussion forum like Reddit (Postmill): forums of posts that users vote on and comment on",
    "map": "a map site like OpenStreetMap: places by category with their address and opening hours, and directions "
           "between two places by car, bicycle or on foot",
}
"""What each website is, in a sentence (the "description" of PAE's context-aware proposer)."""

ENTITY_KEYS = {
    "shopping.product_price": ("product",), "shopping.review_count": ("product",),
    "shopping.category_nav": ("category",), "shopping.add_to_cart": ("product",),
    "shopping.order_status": ("number",), "shopping.checkout": ("product",),
    "shopping_admin.product_stock": ("product",), "shopping_admin.update_price": ("product",),
    "shopping_admin.order_customer": ("number",), "shopping_admin.customer_nav": ("name",),
    "shopping_admin.sales_report": ("month",), "shopping_admin.order_status_update": ("number",),
    "reddit.forum_nav": ("forum",), "reddit.post_author": ("forum", "title"), "reddit.vote": ("forum", "title"),
    "reddit.comment": ("forum", "title"), "reddit.submit": ("forum",),
    "gitlab.open_issue_count": ("project",), "gitlab.mr_nav": ("project",), "gitlab.create_issue": ("project",),
    "gitlab.add_member": ("project",), "gitlab.file_lines": ("project", "path"),
    "map.place_address": ("place",), "map.place_nav": ("place",), "map.place_hours": ("place",),
    "map.distance": ("a", "b"), "map.travel_time": ("a", "b"),
}
"""family -> the instantiation keys that name a thing the site shows (a product, a forum and a post title ...). The
other keys are what the task asks for (a new price, a comment's text, a role): those are the family's own, not read
from pages. Kept here, not on the family classes, so that the families' code (which every rollout stage runs, and
which keys their cached results) is untouched; tests/learn/test_proposer.py checks that it names every family."""

PROPOSAL_PROMPT = """You write practice tasks for a web agent. The agent uses a web browser and starts every task on \
the start page of one website.

Website: {name}
About it: {description}
What its start page shows:
{entities}
{example}
Write {n} tasks for this website. Each task should:
- be something a real user of this website could want done;
- take about 3 to 7 browser actions (clicks, typing, choosing options) from the start page;
- have a result anyone can check afterwards: an answer read off a page of the website, or a change the website shows;
- name concrete things the website shows (from the list above where they fit), not invented ones;
- ask for something different from the other tasks.

Reply with a line "Output:", then the tasks, one per line, each line starting with "- "."""

CHROME_TAGS = frozenset({"header", "nav", "aside", "footer"})
"""The page's chrome: its menu links are no entities (but are followed as links)."""
NAMED_TAGS = frozenset({"a", "td", "option"})
"""Elements whose text may name an entity: links, table cells, select options."""
SKIP_PATHS = ("/logout", "/login", "/static/")
"""Paths never fetched: signing out would end the session the next pages need."""


# --------------------------------------------------------------------------- reading a site's pages

class _PageReader(HTMLParser):
    """One page's title, link targets (all of them) and named texts (``NAMED_TAGS`` outside ``CHROME_TAGS``)."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.title, self.links, self.texts = "", [], []
        self._chrome, self._in_title = 0, False
        self._open: list[list] = []  # [tag, text parts, skip it: a pager link or holding a named element]

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag in CHROME_TAGS:
            self._chrome += 1
        if tag == "title":
            self._in_title = True
        if tag == "a" and a.get("href"):
            self.links.append(a["href"])
        if tag in NAMED_TAGS:
            # "?page=2" links page a listing: "Next" is no entity
            self._open.append([tag, [], tag == "a" and a.get("href", "").startswith("?")])

    def handle_endtag(self, tag: str) -> None:
        if tag in CHROME_TAGS:
            self._chrome = max(0, self._chrome - 1)
        if tag == "title":
            self._in_title = False
        for i in range(len(self._open) - 1, -1, -1):
            if self._open[i][0] == tag:
                _, parts, skip = self._open.pop(i)
                if not self._chrome and not skip:
                    self.texts.append(" ".join("".join(parts).split()))
                if i:  # a cell holding a link names what the link names: count the name once
                    self._open[i - 1][2] = True
                break

    def handle_data(self, data: str) -> None:
        if self._in_title:
            self.title += data
        for _, parts, _ in self._open:
            parts.append(data)


def _entity(text: str) -> str | None:
    """``text`` as an entity name, or None: a name has a letter (an order number: 4+ digits, "#" dropped)."""
    t = text.strip().lstrip("#").strip()
    if not 2 <= len(t) <= 120:
        return None
    if any(c.isalpha() for c in t) or (t.isdigit() and len(t) >= 4):
        return t
    return None


def page_entities(html: str) -> tuple[str, list[str], list[str]]:
    """(title, link targets, entity names) of one page. A text repeated 3+ times on the page is a row's action or a
    column's value ("Edit", "View Order", a status), not a name."""
    reader = _PageReader()
    reader.feed(html)
    reader.close()
    counts: dict[str, int] = {}
    for t in reader.texts:
        counts[t] = counts.get(t, 0) + 1
    names = []
    for t in reader.texts:
        e = _entity(t) if counts[t] < 3 else None
        if e is not None and e not in names:
            names.append(e)
    return " ".join(reader.title.split()), reader.links, names


@dataclass
class SiteContext:
    """What a proposer knows of a website: its name, description, the start page's entities, and every entity read
    with the path of the first page that shows it (``pages``: path -> HTML, in reading order)."""

    site: str
    name: str
    description: str
    start_entities: list[str]
    entities: dict[str, str] = field(default_factory=dict)  # entity -> path of the first page showing it
    pages: dict[str, str] = field(default_factory=dict)

    def lookup(self) -> dict[str, tuple[str, str]]:
        """casefolded name -> (entity, page path); an entity "owner / name" (a project's link) also names its parts."""
        out: dict[str, tuple[str, str]] = {}
        for e, path in self.entities.items():
            for variant in [e, *(p.strip() for p in e.split(" / ") if " / " in e)]:
                out.setdefault(variant.casefold(), (variant, path))
        return out


def _same_site_path(base_url: str, href: str) -> str | None:
    """The path (+ query) of ``href`` when it is a page of the site at ``base_url`` worth fetching, else None."""
    if href.startswith(("?", "#", "javascript:", "mailto:")):
        return None
    url = urlsplit(urljoin(base_url + "/", href))
    if url.netloc != urlsplit(base_url).netloc or url.path.startswith(SKIP_PATHS):
        return None
    return (url.path or "/") + (f"?{url.query}" if url.query else "")


def read_site(site: str, base_url: str, cookies: dict[str, str] | None = None, max_pages: int = 24,
              max_depth: int = 2, timeout_s: float = 30.0) -> SiteContext:
    """Fetch the start page of ``site`` (served at ``base_url``) and the pages it links to, breadth first (links in
    page order, up to ``max_depth`` links away, ``max_pages`` pages in all), and read their entities. Paths, not
    URLs, are recorded: the served port changes between runs, the context must not."""
    base = base_url.rstrip("/")
    ctx = SiteContext(site, site, SITE_DESCRIPTIONS.get(site, site), [])
    queue, seen = [("/", 0)], {"/"}
    with httpx.Client(cookies=cookies or {}, follow_redirects=True, timeout=timeout_s) as client:
        while queue and len(ctx.pages) < max_pages:
            path, depth = queue.pop(0)
            r = client.get(base + path)
            if r.status_code != 200 or "html" not in r.headers.get("content-type", ""):
                if path == "/":
                    raise RuntimeError(f"proposer: the start page of {site} ({base}/) answered HTTP {r.status_code}")
                continue
            title, links, names = page_entities(r.text)
            ctx.pages[path] = r.text
            if path == "/":
                ctx.name, ctx.start_entities = title or site, names
            for e in names:
                ctx.entities.setdefault(e, path)
            if depth < max_depth:
                for href in links:
                    nxt = _same_site_path(base, href)
                    if nxt is not None and nxt not in seen:
                        seen.add(nxt)
                        queue.append((nxt, depth + 1))
    return ctx


def _cookies_of(hooks: Any, site: str, session: str) -> dict[str, str]:
    """The cookies a browser of the run would send to ``site``: the embedded sites' episode and login cookies, or
    the login of real WebArena's storage-state file (none when it is missing: the start page is read anonymously)."""
    if hasattr(hooks, "login_cookies"):
        return {c["name"]: c["value"] for c in hooks.login_cookies([site], session)}
    try:
        state = hooks.storage_state_for({"task_id": session, "sites": [site], "require_login": True})
    except (FileNotFoundError, ValueError):
        return {}
    if not state:
        return {}
    with open(state) as fh:
        return {c["name"]: c["value"] for c in json.load(fh).get("cookies", [])}


def read_sites(hooks: Any, sites: list[str], max_pages: int = 24) -> dict[str, SiteContext]:
    """``read_site`` for each of ``sites`` through the site hooks of a stage (``site_session``): their URLs and
    logins. On the embedded sites the reads use their own episode database, dropped afterwards."""
    urls = hooks.url_map()
    out = {}
    for site in sites:
        session = f"proposer-{site}"
        try:
            out[site] = read_site(site, urls[SITE_PLACEHOLDER[site]], _cookies_of(hooks, site, session), max_pages)
        finally:
            if hasattr(hooks, "end_episode"):
                hooks.end_episode(session)
    return out


def hooks_sites(hooks: Any, candidates: tuple[str, ...]) -> list[str]:
    """The sites of ``candidates`` the hooks serve (all five embedded ones; the configured real ones)."""
    served = hooks.url_map()
    return [s for s in candidates if SITE_PLACEHOLDER[s] in served]


def split_tasks(n: int, sites: list[str], rng: random.Random) -> dict[str, int]:
    """``n`` tasks spread evenly over ``sites``; the remainder goes to sites ``rng`` draws (a different few each
    phase, so a small budget does not leave the same site out every time)."""
    if not sites:
        return {}
    base, extra = divmod(n, len(sites))
    lucky = set(rng.sample(sites, extra))
    return {s: base + (s in lucky) for s in sites}


class Proposer(Protocol):
    name: str

    def propose(self, contexts: dict[str, SiteContext], n_per_site: dict[str, int], rng: random.Random
                ) -> list[dict]: ...


# --------------------------------------------------------------------------- the embedded proposer

def grounded_instances(ctx: SiteContext, data_seed: int = 0) -> dict[str, list[tuple[dict, list[dict]]]]:
    """family -> [(instantiation, its entities)] for every family of ``ctx.site``: the training-pool
    instantiations whose named things (``ENTITY_KEYS``) all appear among the entities read from the pages;
    an entity is ``{"key", "value", "page"}`` (the page path that shows it)."""
    lookup = ctx.lookup()
    out = {}
    for fam in families_of(ctx.site):
        rows = []
        for inst in train_instances(fam, data_seed):
            hits = [(k, lookup.get(str(inst[k]).casefold())) for k in ENTITY_KEYS[fam.name]]
            if all(h is not None for _, h in hits):
                rows.append((inst, [{"key": k, "value": str(inst[k]), "page": h[1]} for k, h in hits]))
        out[fam.name] = rows
    return out


@dataclass
class EmbeddedProposer:
    """Family tasks instantiated with the entities the site's pages show, taken in turns over ALL of the site's
    families (module docstring); every task has its family's evaluator."""

    data_seed: int = 0
    name: str = "embedded"

    def propose(self, contexts: dict[str, SiteContext], n_per_site: dict[str, int], rng: random.Random
                ) -> list[dict]:
        out = []
        for site in sorted(contexts):
            pools = {f: rows[:] for f, rows in grounded_instances(contexts[site], self.data_seed).items() if rows}
            order = sorted(pools)
            rng.shuffle(order)  # which families lead when the budget is smaller than the family count
            made = 0
            while made < n_per_site.get(site, 0) and order:
                for fname in list(order):
                    if made >= n_per_site[site]:
                        break
                    rows = pools[fname]
                    inst, entities = rows.pop(rng.randrange(len(rows)))  # an instantiation at most once a phase
                    if not rows:
                        order.remove(fname)
                    fam = FAMILIES[fname]
                    task = make_task(fam, inst, rng.randrange(len(fam.phrasings(inst))), "train", "", self.data_seed)
                    task["proposal"] = {"by": self.name, "entities": entities}
                    out.append(task)
                    made += 1
        return out


# --------------------------------------------------------------------------- the LLM proposer

_THINK = re.compile(r"<think>.*?(</think>|$)", re.S | re.I)
_MARKER = re.compile(r"\boutput\s*\**\s*:", re.I)
_BULLET = re.compile(r"^\s*(?:[-*\u2022]|\d+\s*[.)]|task\s*\d+\s*[:.)-])\s*", re.I)


def _json_tasks(text: str) -> list[str] | None:
    """The tasks of a JSON list in ``text`` (strings, or objects with a task/intent/instruction), else None."""
    start, end = text.find("["), text.rfind("]")
    if start < 0 or end <= start:
        return None
    try:
        items = json.loads(text[start:end + 1])
    except ValueError:
        return None
    if not isinstance(items, list):
        return None
    out = []
    for it in items:
        if isinstance(it, dict):
            it = next((it[k] for k in ("task", "intent", "instruction", "description") if isinstance(it.get(k), str)),
                      None)
        if isinstance(it, str):
            out.append(it)
    return out


def _line_tasks(text: str) -> list[str]:
    """One task per line; when some lines are bulleted or numbered, only those (the rest is the model's prose)."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    marked = [ln for ln in lines if _BULLET.match(ln)]
    return [_BULLET.sub("", ln, count=1) for ln in (marked or lines)]


def parse_proposals(reply: str) -> list[str]:
    """The tasks of a proposer's reply: what follows its last ``Output:`` marker (PAE's rule; the whole reply
    without one, a reasoning model's <think> block dropped), read as a JSON list, else as backtick-enclosed tasks,
    else one task per (bulleted) line; cleaned of quotes and emphasis, 8-400 characters, no header lines ending in
    ":", de-duplicated."""
    text = _THINK.sub("", reply or "")
    marks = list(_MARKER.finditer(text))
    if marks:
        text = text[marks[-1].end():]
    found = _json_tasks(text)
    if found is None:
        found = backtick_tasks(text) or _line_tasks(text)
    out, seen = [], set()
    for t in found:
        t = " ".join(str(t).split()).strip("*_`\"' ")
        key = normalise_intent(t)
        if 8 <= len(t) <= 400 and not t.endswith(":") and any(c.isalpha() for c in t) and key not in seen:
            seen.add(key)
            out.append(t)
    return out


def proposal_prompt(ctx: SiteContext, n: int, example: str | None = None, max_entities: int = 30) -> str:
    """``PROPOSAL_PROMPT`` for ``ctx``: its name, description, the first ``max_entities`` entities of its start
    page, and one example task when there is one (PAE shows one per website)."""
    shown = "\n".join(f"- {e}" for e in ctx.start_entities[:max_entities]) or "- (nothing readable)"
    ex = f"\nAn example of a task on this website:\n- {example}\n" if example else ""
    return PROPOSAL_PROMPT.format(name=ctx.name, description=ctx.description, entities=shown, example=ex, n=n)


class Completer(Protocol):
    name: str
    turns: int

    def complete(self, prompt: str) -> str: ...


@dataclass
class LLMProposer:
    """PAE's proposer through a completion backend (``ChatGenerator`` / ``HFGenerator``): ``llm.turns`` calls per
    site, each asking for its share of the site's tasks; the tasks are judge-only (module docstring). ``examples``:
    site -> an example task for the prompt (the embedded sites have family tasks to show; real ones none)."""

    llm: Completer
    examples: dict[str, str] = field(default_factory=dict)
    max_entities: int = 30

    @property
    def name(self) -> str:
        return self.llm.name

    def propose(self, contexts: dict[str, SiteContext], n_per_site: dict[str, int], rng: random.Random
                ) -> list[dict]:
        out = []
        for site in sorted(contexts):
            n = n_per_site.get(site, 0)
            if n <= 0:
                continue
            ctx, made, seen = contexts[site], [], set()
            ask = max(1, math.ceil(n / max(1, self.llm.turns)))
            for _ in range(max(1, self.llm.turns)):
                reply = self.llm.complete(proposal_prompt(ctx, ask, self.examples.get(site), self.max_entities))
                for t in parse_proposals(reply):
                    if normalise_intent(t) not in seen:
                        seen.add(normalise_intent(t))
                        made.append(t)
                if len(made) >= n:
                    break
            for intent in made[:n]:
                task = make_generated_task_config(task_id="", site=site, intent=intent)
                mentioned = [e for e in ctx.start_entities if e.casefold() in intent.casefold()]
                task["proposal"] = {"by": self.name, "entities": mentioned}
                task["judge_only"] = True  # no reference answer: only a judge (or the ORM) can label its episodes
                out.append(task)
        return out


def example_tasks(sites: list[str], rng: random.Random, data_seed: int = 0) -> dict[str, str]:
    """site -> the intent of one training task of a random family of the embedded site (the prompt's example)."""
    out = {}
    for site in sites:
        fams = families_of(site)
        if fams:
            fam = rng.choice(fams)
            inst = rng.choice(train_instances(fam, data_seed))
            out[site] = make_task(fam, inst, 0, "train", "", data_seed)["intent"]
    return out


# --------------------------------------------------------------------------- stats

def proposal_stats(tasks: list[dict], contexts: dict[str, SiteContext]) -> dict[str, int]:
    """For the phase summary: ``proposed_<site>`` tasks, ``proposed_families_<site>`` families covered,
    ``proposed_entities_<site>`` / ``proposed_pages_<site>`` entities and pages read, ``proposed_families`` in all
    and ``proposed_judge_only`` (tasks only a judge can label)."""
    out: dict[str, int] = {"proposed_families": len({t["family"] for t in tasks if t.get("family")}),
                           "proposed_judge_only": sum(1 for t in tasks if t.get("judge_only"))}
    for site, ctx in sorted(contexts.items()):
        mine = [t for t in tasks if t["sites"][0] == site]
        out[f"proposed_{site}"] = len(mine)
        out[f"proposed_families_{site}"] = len({t["family"] for t in mine if t.get("family")})
        out[f"proposed_entities_{site}"] = len(ctx.entities)
        out[f"proposed_pages_{site}"] = len(ctx.pages)
    return out

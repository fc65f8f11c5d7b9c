"""Task families of the forum (Postmill-like): one class per family, registered in definition order."""

from __future__ import annotations

from webrl_core.env.observation import find_element, parse_observation_elements
from webrl_core.sites.families.base import (button, click_link, do, ev_html, ev_string, ev_url, Family, field,
                                            finish, PageView, register, scroll_or_fail, select_with, selected_text)


class RedditFamily(Family):
    """A family of the forum; its tasks start on the home page."""

    site, start_url = "reddit", "__REDDIT__"


def _front_posts(d, per_page=10):
    """Posts on page 1 of their forum (newest first), which the forum page shows without paging."""
    out = []
    for f in d["reddit"]["forums"]:
        posts = sorted((p for p in d["reddit"]["posts"] if p["forum"] == f["name"]), key=lambda p: -p["id"])
        out += posts[:per_page]
    return out


def _to_forum(page: PageView, forum: str) -> str | None:
    if page.path == f"/f/{forum}":
        return None
    if page.path == "/forums":
        return click_link(page, forum)
    return click_link(page, "Forums")


def _to_post(page: PageView, forum: str, title: str) -> str | None:
    h1 = [e for e in parse_observation_elements(page.html) if e.tag == "h1"]
    if page.path.startswith(f"/f/{forum}/") and h1 and h1[0].text == title:
        return None
    return _to_forum(page, forum) or click_link(page, title)


@register
class RedditForumNav(RedditFamily):
    """Open a forum (url_match)."""

    name = "reddit.forum_nav"
    templates = ["Go to the {forum} forum.", "Open the forum about {forum}."]
    test_quota = 3

    def instances(self, d):
        return [{"forum": f["name"]} for f in d["reddit"]["forums"]]

    def evaluator(self, inst, d):
        return ev_url(f"__REDDIT__/f/{inst['forum']}")

    def oracle(self, inst, page):
        return _to_forum(page, inst["forum"]) or finish("Done", f"This is f/{inst['forum']}")


@register
class RedditPostAuthor(RedditFamily):
    """Ask who posted a submission; read it from the forum listing (string_match)."""

    name = "reddit.post_author"
    templates = ["Who posted '{title}' in the {forum} forum?",
                 "In f/{forum}, what is the username of the author of '{title}'?"]
    test_quota = 5

    def instances(self, d):
        return [{"forum": p["forum"], "title": p["title"]} for p in _front_posts(d)]

    def evaluator(self, inst, d):
        p = next(p for p in d["reddit"]["posts"] if p["title"] == inst["title"])
        return ev_string(p["author"])

    def oracle(self, inst, page):
        nxt = _to_forum(page, inst["forum"])
        if nxt:
            return nxt
        els = parse_observation_elements(page.html)
        for e in els:
            if e.tag == "li" and inst["title"] in e.text and " by " in e.text:
                author = e.text.split(" by ")[-1].split(" in f/")[0]
                return finish(author, f"The listing says by {author}")
        return scroll_or_fail(page, "post not visible")


@register
class RedditVote(RedditFamily):
    """Upvote or downvote a submission (program_html on the post page)."""

    name = "reddit.vote"
    templates = ["1|Upvote the post '{title}' in f/{forum}.",
                 "1|Give an upvote to '{title}' in the {forum} forum.",
                 "-1|Downvote the post '{title}' in f/{forum}."]
    test_quota = 4
    template_key = "dir"

    def instances(self, d):
        return [{"forum": p["forum"], "title": p["title"], "dir": v}
                for p in _front_posts(d) for v in (1, -1)]

    def evaluator(self, inst, d):
        p = next(p for p in d["reddit"]["posts"] if p["title"] == inst["title"])
        return ev_html(
            (f"__REDDIT__/f/{p['forum']}/{p['id']}", "document.querySelector('#post-vote').dataset.voted",
             {"exact_match": str(inst["dir"])}))

    def oracle(self, inst, page):
        nxt = _to_post(page, inst["forum"], inst["title"])
        if nxt:
            return nxt
        if f"You {'up' if inst['dir'] == 1 else 'down'}voted this post" in page.text():
            return finish("Done", "The vote is recorded")
        b = find_element(page.html, "Upvote" if inst["dir"] == 1 else "Downvote", tag="button", exact=True)
        return do("Click", b) if b else scroll_or_fail(page, "no vote button")


@register
class RedditComment(RedditFamily):
    """Comment on a submission (program_html on the post page)."""

    name = "reddit.comment"
    templates = ["Reply to the post '{title}' in f/{forum} with \"{text}\".",
                 "Comment \"{text}\" on '{title}' in the {forum} forum."]
    test_quota = 4

    def instances(self, d):
        texts = ["Great point, thanks!", "I learned something new today.", "Could you share a source?",
                 "Following this thread.", "Same here, welcome aboard."]
        return [{"forum": p["forum"], "title": p["title"], "text": t} for p in _front_posts(d) for t in texts]

    def evaluator(self, inst, d):
        p = next(p for p in d["reddit"]["posts"] if p["title"] == inst["title"])
        return ev_html(
            (f"__REDDIT__/f/{p['forum']}/{p['id']}", "document.querySelector('#comments').outerText",
             {"must_include": [f"MarvelsGrantMan136: {inst['text']}"]}))

    def oracle(self, inst, page):
        nxt = _to_post(page, inst["forum"], inst["title"])
        if nxt:
            return nxt
        if f"MarvelsGrantMan136: {inst['text']}" in page.text().replace(" :", ":"):
            return finish("Done", "The comment is posted")
        box = field(page, "Write a comment")
        if box is None:
            return scroll_or_fail(page, "no comment box")
        if box.attrs.get("value", "") != inst["text"]:
            return do("Type", box, inst["text"], "Comment box")
        return do("Click", button(page, "Post"))


@register
class RedditSubmit(RedditFamily):
    """Create a submission in a forum (program_html on the forum page)."""

    name = "reddit.submit"
    templates = ["Create a post titled '{title}' in the {forum} forum.",
                 "Submit a new post to f/{forum} with the title '{title}'."]
    test_quota = 4

    def instances(self, d):
        titles = ["Weekly discussion thread", "Share your recent wins", "Beginner questions welcome here",
                  "What are you working on this month?", "Rate my setup"]
        return [{"forum": f["name"], "title": t} for f in d["reddit"]["forums"] for t in titles]

    def evaluator(self, inst, d):
        return ev_html(
            (f"__REDDIT__/f/{inst['forum']}", "document.querySelector('.posts').outerText",
             {"must_include": [inst["title"]]}))

    def oracle(self, inst, page):
        h1 = [e for e in parse_observation_elements(page.html) if e.tag == "h1"]
        if page.path.startswith(f"/f/{inst['forum']}/") and h1 and h1[0].text == inst["title"]:
            return finish("Done", "The post is created")
        if page.path != "/submit":
            return click_link(page, "Submit")
        title = field(page, "Title")
        if title is None:
            return scroll_or_fail(page, "no title field")
        if title.attrs.get("value", "") != inst["title"]:
            return do("Type", title, inst["title"], "Title")
        sel = select_with(page, inst["forum"])
        if sel is not None and selected_text(sel) != inst["forum"]:
            return do("Select Dropdown Option", sel, inst["forum"], "Forum")
        return do("Click", button(page, "Create submission"))

"""Task families of the code host (GitLab-like): one class per family, registered in definition order."""

from __future__ import annotations

from webrl_core.env.observation import find_element, parse_observation_elements
from webrl_core.sites.data import GL_USERS
from webrl_core.sites.families.base import (button, click_link, do, ev_html, ev_string, ev_url, Family, field,
                                            finish, PageView, register, scroll_or_fail, select_with, selected_text)


class GitlabFamily(Family):
    """A family of the code-hosting site; its tasks start on the home page."""

    site, start_url = "gitlab", "__GITLAB__"


def _proj(d, name):
    return next(p for p in d["gitlab"]["projects"] if p["name"] == name)


def _to_project(page: PageView, project: str) -> str | None:
    """None on the project's overview page, else the next action to get there."""
    h1 = [e for e in parse_observation_elements(page.html) if e.tag == "h1"]
    parts = page.path.strip("/").split("/")
    if len(parts) == 2 and parts[1] == project and h1 and h1[0].text == project:
        return None
    if len(parts) >= 2 and parts[1] == project:  # inside the project: use its side menu
        return click_link(page, "Project overview")
    el = find_element(page.html, f"/ {project}", tag="a")
    el = el if el is not None and el.text.endswith(f"/ {project}") else None
    if el is not None:
        return do("Click", el)
    box = field(page, "Search projects")
    return do("Search", box, project) if box else scroll_or_fail(page, "no project search")


def _in_project(page: PageView, project: str, menu: str, suffix: str) -> str | None:
    parts = page.path.strip("/").split("/")
    if len(parts) >= 2 and parts[1] == project and page.path.endswith(suffix):
        return None
    if len(parts) >= 2 and parts[1] == project:
        return click_link(page, menu)
    return _to_project(page, project)


@register
class GitlabOpenIssueCount(GitlabFamily):
    """Ask how many open issues a project has; read it from its overview (string_match)."""

    name = "gitlab.open_issue_count"
    templates = ["How many open issues does the {project} project have?",
                 "Count the open issues of {project}."]
    test_quota = 7

    def instances(self, d):
        return [{"project": p["name"]} for p in d["gitlab"]["projects"]]

    def evaluator(self, inst, d):
        pid = _proj(d, inst["project"])["id"]
        n = sum(1 for i in d["gitlab"]["issues"] if i["project_id"] == pid and i["state"] == "opened")
        return ev_string(str(n))

    def oracle(self, inst, page):
        nxt = _to_project(page, inst["project"])
        if nxt:
            return nxt
        t = page.text()
        n = t.split(" open issues")[0].split()[-1]
        return finish(n, f"The overview shows {n} open issues")


@register
class GitlabMergeRequestsNav(GitlabFamily):
    """Open a project's merge requests (url_match)."""

    name = "gitlab.mr_nav"
    templates = ["Open the merge requests of {project}.",
                 "Show me the open merge requests in the {project} repository."]
    test_quota = 7

    def instances(self, d):
        return [{"project": p["name"]} for p in d["gitlab"]["projects"]]

    def evaluator(self, inst, d):
        p = _proj(d, inst["project"])
        return ev_url(f"__GITLAB__/{p['namespace']}/{p['name']}/-/merge_requests")

    def oracle(self, inst, page):
        return (_in_project(page, inst["project"], "Merge requests", "/-/merge_requests")
                or finish("Done", "These are the merge requests"))


@register
class GitlabCreateIssue(GitlabFamily):
    """Create an issue in a project (program_html on its issue list)."""

    name = "gitlab.create_issue"
    templates = ["Create an issue titled '{title}' in the {project} project.",
                 "Open a new issue in {project} called '{title}'."]
    test_quota = 7

    def instances(self, d):
        titles = ["Update the installation guide", "Crash on empty input", "Add a dark theme",
                  "Support Python 3.12", "Broken link in the docs"]
        return [{"project": p["name"], "title": t} for p in d["gitlab"]["projects"] for t in titles]

    def evaluator(self, inst, d):
        p = _proj(d, inst["project"])
        return ev_html(
            (f"__GITLAB__/{p['namespace']}/{p['name']}/-/issues", "document.querySelector('.issues').outerText",
             {"must_include": [inst["title"]]}))

    def oracle(self, inst, page):
        parts = page.path.strip("/").split("/")
        if "/-/issues/" in page.path and parts[-1].isdigit() and inst["title"] in page.text():
            return finish("Done", "The issue is created")
        if page.path.endswith("/-/issues/new"):
            title = field(page, "Title")
            if title is None:
                return scroll_or_fail(page, "no title field")
            if title.attrs.get("value", "") != inst["title"]:
                return do("Type", title, inst["title"], "Title")
            return do("Click", button(page, "Create issue"))
        return _in_project(page, inst["project"], "Issues", "/-/issues") or click_link(page, "New issue")


@register
class GitlabAddMember(GitlabFamily):
    """Add a user to a project with a role (program_html on its members page)."""

    name = "gitlab.add_member"
    templates = ["Add {user} to the {project} project as {role}.",
                 "Invite {user} to {project} with the {role} role."]
    test_quota = 6

    def instances(self, d):
        out = []
        for p in d["gitlab"]["projects"]:
            have = {m["username"] for m in d["gitlab"]["members"] if m["project_id"] == p["id"]}
            for u in GL_USERS:
                if u not in have:
                    out += [{"project": p["name"], "user": u, "role": r} for r in ("Reporter", "Developer")]
        return out

    def evaluator(self, inst, d):
        p = _proj(d, inst["project"])
        loc = f"document.querySelector('[data-member=\"{inst['user']}\"] .role').outerText"
        return ev_html(
            (f"__GITLAB__/{p['namespace']}/{p['name']}/-/project_members", loc, {"exact_match": inst["role"]}))

    def oracle(self, inst, page):
        nxt = _in_project(page, inst["project"], "Members", "/-/project_members")
        if nxt:
            return nxt
        if f"@{inst['user']} was added as {inst['role']}" in page.text():
            return finish("Done", f"{inst['user']} is now a {inst['role']}")
        box = field(page, "Search for a user")
        if box is None:
            return scroll_or_fail(page, "no user field")
        if box.attrs.get("value", "") != inst["user"]:
            return do("Type", box, inst["user"], "Username")
        sel = select_with(page, inst["role"])
        if sel is not None and selected_text(sel) != inst["role"]:
            return do("Select Dropdown Option", sel, inst["role"], "Role")
        return do("Click", button(page, "Invite"))


@register
class GitlabFileLines(GitlabFamily):
    """Ask a file's line count; read it from the file page (string_match)."""

    name = "gitlab.file_lines"
    templates = ["How many lines does {path} have in the {project} project?",
                 "What is the line count of the file {path} in {project}?"]
    test_quota = 7

    def instances(self, d):
        names = {p["id"]: p["name"] for p in d["gitlab"]["projects"]}
        return [{"project": names[f["project_id"]], "path": f["path"]} for f in d["gitlab"]["files"]]

    def evaluator(self, inst, d):
        pid = _proj(d, inst["project"])["id"]
        f = next(f for f in d["gitlab"]["files"] if f["project_id"] == pid and f["path"] == inst["path"])
        return ev_string(str(f["lines"]))

    def oracle(self, inst, page):
        if page.path.endswith(f"/-/blob/main/{inst['path']}") and f"/{inst['project']}/" in page.path:
            n = page.text().split(" lines")[0].split()[-1]
            return finish(n, f"The file has {n} lines")
        return _to_project(page, inst["project"]) or click_link(page, inst["path"])

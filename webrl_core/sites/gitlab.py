"""The embedded code-hosting site (GitLab-like): projects, issues, merge requests, members, file browser.

Every page needs the login (cookie ``gitlab_session``). Project URLs follow GitLab's ``/<namespace>/<project>/-/...``.
"""

from __future__ import annotations

import sqlite3
from urllib.parse import urlencode

from starlette.requests import Request
from starlette.routing import Route

from webrl_core.sites.common import SiteApp, form_data, int_arg, login_required, site_kit
from webrl_core.sites.data import GL_ROLES


def project_of(request: Request) -> tuple[sqlite3.Connection, sqlite3.Row | None]:
    """The episode's database and the project named by the URL's ``{ns}/{proj}`` (None if there is none)."""
    con = site_kit(request).db(request)
    p = con.execute("SELECT * FROM projects WHERE namespace=? AND name=?",
                    (request.path_params["ns"], request.path_params["proj"])).fetchone()
    return con, p


def not_found(request: Request):
    return site_kit(request).render(request, "projects.html", status=404, heading="Page not found", rows=[], page=1,
                                    pages=1, qs="", proj=None)


def project_list(request: Request, heading: str, where: str, params: tuple, qs: str = ""):
    kit = site_kit(request)
    con = kit.db(request)
    page = int_arg(request.query_params.get("page"))
    rows, pages = kit.paginate(con, f"SELECT * FROM projects WHERE {where} ORDER BY name", params, page)
    return kit.render(request, "projects.html", heading=heading, rows=rows, page=min(page, pages), pages=pages,
                      qs=qs, proj=None, q=request.query_params.get("q", ""))


@login_required
async def home(request: Request):
    return project_list(request, "Your projects",
                        "id IN (SELECT project_id FROM members WHERE username = ?)", (site_kit(request).user(request),))


@login_required
async def explore(request: Request):
    q = request.query_params.get("q", "").strip().lower()
    return project_list(request, "Explore projects", "lower(name) LIKE ? OR lower(namespace) LIKE ?",
                        (f"%{q}%", f"%{q}%"), qs=urlencode({"q": q}) + "&")


@login_required
async def project(request: Request):
    con, p = project_of(request)
    if p is None:
        return not_found(request)
    one = lambda sql: con.execute(sql, (p["id"],)).fetchone()[0]  # noqa: E731
    files = con.execute("SELECT path FROM files WHERE project_id=? ORDER BY path", (p["id"],)).fetchall()
    return site_kit(request).render(request, "project.html", proj=p, files=files,
                                    n_issues=one("SELECT COUNT(*) FROM issues WHERE project_id=? AND state='opened'"),
                                    n_mrs=one("SELECT COUNT(*) FROM merge_requests WHERE project_id=? "
                                              "AND state='opened'"),
                                    n_members=one("SELECT COUNT(*) FROM members WHERE project_id=?"))


@login_required
async def blob(request: Request):
    con, p = project_of(request)
    f = p and con.execute("SELECT * FROM files WHERE project_id=? AND path=?",
                          (p["id"], request.path_params["path"])).fetchone()
    if not f:
        return not_found(request)
    return site_kit(request).render(request, "blob.html", proj=p, f=f)


@login_required
async def issues(request: Request):
    kit = site_kit(request)
    con, p = project_of(request)
    if p is None:
        return not_found(request)
    state = "closed" if request.query_params.get("state") == "closed" else "opened"
    page = int_arg(request.query_params.get("page"))
    rows, pages = kit.paginate(con, "SELECT * FROM issues WHERE project_id=? AND state=? ORDER BY iid DESC",
                               (p["id"], state), page)
    count = lambda s: con.execute("SELECT COUNT(*) FROM issues WHERE project_id=? AND state=?",  # noqa: E731
                                  (p["id"], s)).fetchone()[0]
    return kit.render(request, "issues.html", proj=p, rows=rows, page=min(page, pages), pages=pages,
                      qs=f"state={state}&", n_open=count("opened"), n_closed=count("closed"))


@login_required
async def issue(request: Request):
    con, p = project_of(request)
    i = p and con.execute("SELECT * FROM issues WHERE project_id=? AND iid=?",
                          (p["id"], request.path_params["iid"])).fetchone()
    if not i:
        return not_found(request)
    return site_kit(request).render(request, "issue.html", proj=p, i=i)


@login_required
async def issue_toggle(request: Request):
    con, p = project_of(request)
    if p is None:
        return not_found(request)
    con.execute("UPDATE issues SET state = CASE state WHEN 'opened' THEN 'closed' ELSE 'opened' END "
                "WHERE project_id=? AND iid=?", (p["id"], request.path_params["iid"]))
    con.commit()
    return site_kit(request).redirect(f"/{p['namespace']}/{p['name']}/-/issues/{request.path_params['iid']}")


@login_required
async def issue_new(request: Request):
    kit = site_kit(request)
    con, p = project_of(request)
    if p is None:
        return not_found(request)
    if request.method == "GET":
        return kit.render(request, "issue_new.html", proj=p)
    form = await form_data(request)
    title = form.get("title", "").strip()
    if not title:
        return kit.render(request, "issue_new.html", status=400, proj=p)
    iid = (con.execute("SELECT MAX(iid) FROM issues WHERE project_id=?", (p["id"],)).fetchone()[0] or 0) + 1
    label = form.get("labels") if form.get("labels") in ("bug", "feature", "docs", "question") else "bug"
    con.execute("INSERT INTO issues(project_id, iid, title, author, state, labels) VALUES (?, ?, ?, ?, 'opened', ?)",
                (p["id"], iid, title, kit.user(request), label))
    con.commit()
    return kit.redirect(f"/{p['namespace']}/{p['name']}/-/issues/{iid}")


@login_required
async def merge_requests(request: Request):
    con, p = project_of(request)
    if p is None:
        return not_found(request)
    state = request.query_params.get("state", "opened")
    state = state if state in ("opened", "merged", "closed") else "opened"
    rows = con.execute("SELECT * FROM merge_requests WHERE project_id=? AND state=? ORDER BY iid DESC",
                       (p["id"], state)).fetchall()
    count = lambda s: con.execute("SELECT COUNT(*) FROM merge_requests WHERE project_id=? AND state=?",  # noqa: E731
                                  (p["id"], s)).fetchone()[0]
    return site_kit(request).render(request, "mrs.html", proj=p, rows=rows, n_open=count("opened"),
                                    n_merged=count("merged"), n_closed=count("closed"))


@login_required
async def merge_request(request: Request):
    con, p = project_of(request)
    m = p and con.execute("SELECT * FROM merge_requests WHERE project_id=? AND iid=?",
                          (p["id"], request.path_params["iid"])).fetchone()
    if not m:
        return not_found(request)
    return site_kit(request).render(request, "mr.html", proj=p, m=m)


@login_required
async def members(request: Request):
    con, p = project_of(request)
    if p is None:
        return not_found(request)
    msg = None
    if request.method == "POST":
        form = await form_data(request)
        name, role = form.get("username", "").strip().lstrip("@"), form.get("role", "")
        if role not in GL_ROLES:
            msg = f"Unknown role {role!r}."
        elif not con.execute("SELECT 1 FROM users WHERE username=?", (name,)).fetchone():
            msg = f"User {name!r} not found."
        else:
            con.execute("INSERT OR REPLACE INTO members VALUES (?, ?, ?)", (p["id"], name, role))
            con.commit()
            msg = f"@{name} was added as {role}."
    rows = con.execute("SELECT * FROM members WHERE project_id=? ORDER BY username", (p["id"],)).fetchall()
    return site_kit(request).render(request, "members.html", proj=p, rows=rows, roles=GL_ROLES, msg=msg)


_PROJECT = "/{ns}/{proj}"
ROUTES = [Route("/", home), Route("/explore", explore), Route(_PROJECT, project),
          Route(_PROJECT + "/-/blob/main/{path:path}", blob), Route(_PROJECT + "/-/issues", issues),
          Route(_PROJECT + "/-/issues/new", issue_new, methods=["GET", "POST"]),
          Route(_PROJECT + "/-/issues/{iid:int}", issue),
          Route(_PROJECT + "/-/issues/{iid:int}/toggle", issue_toggle, methods=["POST"]),
          Route(_PROJECT + "/-/merge_requests", merge_requests),
          Route(_PROJECT + "/-/merge_requests/{iid:int}", merge_request),
          Route(_PROJECT + "/-/project_members", members, methods=["GET", "POST"])]
APP = SiteApp(ROUTES, "gitlab_session", {"byteblaze": "hello1234"}, "__GITLAB__")

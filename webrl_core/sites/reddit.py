"""The embedded forum site (Postmill/reddit-like): forums, posts, comments, votes, submissions, user pages.

Reading works anonymously; voting, commenting and submitting need the forum login (cookie ``forum_session``).
A post's score shown on pages is its seeded score plus the votes cast in this episode.
"""

from __future__ import annotations

from urllib.parse import urlencode

from starlette.requests import Request
from starlette.routing import Route

from webrl_core.sites.common import SiteApp, form_data, int_arg, login_required, site_kit

POSTS_SQL = ("SELECT p.id, p.forum, p.title, p.author, p.created, "
             "p.score + COALESCE((SELECT SUM(dir) FROM votes v WHERE v.post_id = p.id), 0) AS score, "
             "(SELECT COUNT(*) FROM comments c WHERE c.post_id = p.id) AS n_comments FROM posts p")


def listing(request: Request, heading: str, where: str, params: tuple, qs: str = "", **extra):
    """One page of posts (newest first) matching ``where``, rendered with ``list.html`` unless ``template=``."""
    kit = site_kit(request)
    con = kit.db(request)
    page = int_arg(request.query_params.get("page"))
    rows, pages = kit.paginate(con, f"{POSTS_SQL} WHERE {where} ORDER BY p.id DESC", params, page)
    return kit.render(request, extra.pop("template", "list.html"), heading=heading, posts=rows,
                      page=min(page, pages), pages=pages, qs=qs, **extra)


def not_found(request: Request, heading: str):
    return site_kit(request).render(request, "list.html", status=404, heading=heading, posts=[], page=1, pages=1,
                                    qs="", forum=None)


async def front(request: Request):
    return listing(request, "Front page", "1=1", ())


async def forums(request: Request):
    kit = site_kit(request)
    rows = kit.db(request).execute("SELECT f.name, (SELECT COUNT(*) FROM posts p WHERE p.forum = f.name) AS n "
                                   "FROM forums f ORDER BY f.name").fetchall()
    return kit.render(request, "forums.html", forums=rows)


async def forum(request: Request):
    f = site_kit(request).db(request).execute("SELECT * FROM forums WHERE name=?",
                                              (request.path_params["forum"],)).fetchone()
    if f is None:
        return not_found(request, "No such forum")
    return listing(request, f"f/{f['name']}", "p.forum = ?", (f["name"],), forum=f)


async def search(request: Request):
    q = request.query_params.get("q", "").strip()
    words = q.lower().split()[:8] or [""]
    where = " AND ".join("lower(p.title) LIKE ?" for _ in words)
    return listing(request, f"Search results for '{q}'", where, tuple(f"%{w}%" for w in words),
                   qs=urlencode({"q": q}) + "&", q=q, forum=None)


async def post(request: Request):
    kit = site_kit(request)
    con = kit.db(request)
    p = con.execute(f"SELECT * FROM ({POSTS_SQL}) WHERE id=? AND forum=?",
                    (request.path_params["pid"], request.path_params["forum"])).fetchone()
    if p is None:
        return not_found(request, "No such submission")
    body = con.execute("SELECT body FROM posts WHERE id=?", (p["id"],)).fetchone()[0]
    comments = con.execute("SELECT * FROM comments WHERE post_id=? ORDER BY id", (p["id"],)).fetchall()
    user = kit.user(request)
    v = con.execute("SELECT dir FROM votes WHERE username=? AND post_id=?", (user, p["id"])).fetchone()
    return kit.render(request, "post.html", p={**dict(p), "body": body}, comments=comments, voted=v[0] if v else 0)


@login_required
async def vote(request: Request):
    kit = site_kit(request)
    form = await form_data(request)
    d = 1 if form.get("dir") == "1" else -1
    con = kit.db(request)
    pid, user = request.path_params["pid"], kit.user(request)
    old = con.execute("SELECT dir FROM votes WHERE username=? AND post_id=?", (user, pid)).fetchone()
    if old and old[0] == d:  # clicking the same arrow again retracts the vote, as on Postmill
        con.execute("DELETE FROM votes WHERE username=? AND post_id=?", (user, pid))
    else:
        con.execute("INSERT OR REPLACE INTO votes VALUES (?, ?, ?)", (user, pid, d))
    con.commit()
    return kit.redirect(f"/f/{request.path_params['forum']}/{pid}")


@login_required
async def comment(request: Request):
    kit = site_kit(request)
    form = await form_data(request)
    body = form.get("body", "").strip()
    pid = request.path_params["pid"]
    if body:
        con = kit.db(request)
        con.execute("INSERT INTO comments(post_id, author, body) VALUES (?, ?, ?)", (pid, kit.user(request), body))
        con.commit()
    return kit.redirect(f"/f/{request.path_params['forum']}/{pid}")


@login_required
async def submit(request: Request):
    kit = site_kit(request)
    con = kit.db(request)
    forums_ = con.execute("SELECT name FROM forums ORDER BY name").fetchall()
    if request.method == "GET":
        return kit.render(request, "submit.html", forums=forums_, forum=request.query_params.get("forum", ""),
                          error=None)
    form = await form_data(request)
    title, forum_ = form.get("title", "").strip(), form.get("forum", "")
    if not title or forum_ not in {f["name"] for f in forums_}:
        return kit.render(request, "submit.html", status=400, forums=forums_, forum=forum_,
                          error="A title and an existing forum are required.")
    cur = con.execute("INSERT INTO posts(forum, title, author, body, created, score) "
                      "VALUES (?, ?, ?, ?, '2023-12-31', 1)", (forum_, title, kit.user(request),
                                                                form.get("body", "").strip()))
    con.commit()
    return kit.redirect(f"/f/{forum_}/{cur.lastrowid}")


async def user_page(request: Request):
    kit = site_kit(request)
    name = request.path_params["name"]
    n_c = kit.db(request).execute("SELECT COUNT(*) FROM comments WHERE author=?", (name,)).fetchone()[0]
    n_p = kit.db(request).execute("SELECT COUNT(*) FROM posts WHERE author=?", (name,)).fetchone()[0]
    return listing(request, name, "p.author = ?", (name,), template="user.html", username=name, n_posts=n_p,
                   n_comments=n_c)


ROUTES = [Route("/", front), Route("/forums", forums), Route("/search", search),
          Route("/submit", submit, methods=["GET", "POST"]), Route("/user/{name}", user_page),
          Route("/f/{forum}", forum), Route("/f/{forum}/{pid:int}", post),
          Route("/f/{forum}/{pid:int}/vote", vote, methods=["POST"]),
          Route("/f/{forum}/{pid:int}/comment", comment, methods=["POST"])]
APP = SiteApp(ROUTES, "forum_session", {"MarvelsGrantMan136": "test1234"}, "__REDDIT__")

"""The embedded map site (OpenStreetMap-like): place search, place pages, directions with distance and time.

No login (WebArena's map has none). Directions resolve each endpoint to a place (exact name first, then
the first place whose name holds every typed word) and report ``data.route`` (km, minutes).
"""

from __future__ import annotations

import sqlite3
from urllib.parse import urlencode

from starlette.requests import Request
from starlette.routing import Route

from webrl_core.sites.common import SiteApp, int_arg, site_kit
from webrl_core.sites.data import PLACE_KINDS, route

MODES = [("car", "Car"), ("bike", "Bicycle"), ("foot", "Foot")]


def resolve(con: sqlite3.Connection, text: str) -> sqlite3.Row | None:
    text = text.strip().lower()
    if not text:
        return None
    row = con.execute("SELECT * FROM places WHERE lower(name)=?", (text,)).fetchone()
    if row:
        return row
    words = text.split()[:8]
    return con.execute("SELECT * FROM places WHERE " + " AND ".join("lower(name) LIKE ?" for _ in words) +
                       " ORDER BY name LIMIT 1", tuple(f"%{w}%" for w in words)).fetchone()


async def home(request: Request):
    return site_kit(request).render(request, "home.html", categories=sorted(PLACE_KINDS))


async def search(request: Request):
    kit = site_kit(request)
    q = request.query_params.get("q", "").strip()
    words = q.lower().split()[:8] or [""]
    where = " AND ".join("(lower(name) LIKE ? OR lower(category) LIKE ? OR lower(district) LIKE ?)" for _ in words)
    params = tuple(x for w in words for x in (f"%{w}%",) * 3)
    page = int_arg(request.query_params.get("page"))
    rows, pages = kit.paginate(kit.db(request), f"SELECT * FROM places WHERE {where} "
                               "ORDER BY (lower(name) = ?) DESC, name", params + (q.lower(),), page)
    return kit.render(request, "search.html", rows=rows, q=q, page=min(page, pages), pages=pages,
                      qs=urlencode({"q": q}) + "&")


async def place(request: Request):
    kit = site_kit(request)
    p = kit.db(request).execute("SELECT * FROM places WHERE id=?", (request.path_params["pid"],)).fetchone()
    if p is None:
        return kit.render(request, "search.html", status=404, rows=[], page=1, pages=1, qs="")
    return kit.render(request, "place.html", p=p)


async def directions(request: Request):
    kit = site_kit(request)
    qp = request.query_params
    src, dst = qp.get("from", ""), qp.get("to", "")
    mode = qp.get("mode", "car") if qp.get("mode", "car") in dict(MODES) else "car"
    ctx = {"src": src, "dst": dst, "mode": mode, "modes": MODES, "route": None, "error": None}
    if src.strip() and dst.strip():
        con = kit.db(request)
        a, b = resolve(con, src), resolve(con, dst)
        if a is None or b is None:
            ctx["error"] = f"No place found for '{src if a is None else dst}'."
        else:
            ctx.update(a=a, b=b, route=route(dict(a), dict(b), mode), mode_label=dict(MODES)[mode])
    return kit.render(request, "directions.html", **ctx)


ROUTES = [Route("/", home), Route("/search", search), Route("/place/{pid:int}", place),
          Route("/directions", directions)]
APP = SiteApp(ROUTES, None, {}, "__MAP__")

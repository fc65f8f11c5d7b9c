"""The embedded shopping site ("One Stop Market"): search, categories, products, reviews, cart, checkout, orders.

Every page needs the customer login (cookie ``shopping_session``); the cart and the orders belong to the
episode's database copy (see ``common``).
"""

from __future__ import annotations

import sqlite3
from urllib.parse import urlencode

from starlette.requests import Request
from starlette.routing import Route

from webrl_core.sites.common import SiteApp, form_data, int_arg, login_required, site_kit

CUSTOMER = ("emma.lopez@example.com", "Password.123")
WEBARENA_CUSTOMER = ("emma.lopez@gmail.com", "Password.123")  # WebArena's account (`webrl webarena login`)
ADDRESS = "6146 Honey Bluff Parkway, Calder, MI 49628"


def search_sql(q: str) -> tuple[str, tuple]:
    """Products whose name holds every word of q; exact name first, then by name."""
    words = [w for w in q.lower().split() if w][:8]
    where = " AND ".join("lower(name) LIKE ?" for _ in words) or "1=1"
    params = tuple(f"%{w}%" for w in words)
    return (f"SELECT id, name, price FROM products WHERE status='Enabled' AND {where} "
            f"ORDER BY (lower(name) = ?) DESC, name", params + (q.lower().strip(),))


def cart_items(con: sqlite3.Connection) -> list[sqlite3.Row]:
    return con.execute("SELECT c.product_id, c.qty, p.name, p.price FROM cart c JOIN products p "
                       "ON p.id = c.product_id ORDER BY p.name").fetchall()


def not_found(request: Request, heading: str):
    return site_kit(request).render(request, "list.html", status=404, heading=heading, products=[], total=0,
                                    page=1, pages=1, qs="")


@login_required
async def home(request: Request):
    kit = site_kit(request)
    con = kit.db(request)
    cats = con.execute("SELECT * FROM categories ORDER BY id").fetchall()
    feat = con.execute("SELECT id, name, price FROM products WHERE status='Enabled' ORDER BY (id * 37) % 101 "
                       "LIMIT 6").fetchall()
    return kit.render(request, "home.html", categories=cats, products=feat, page=1, pages=1, qs="")


@login_required
async def search(request: Request):
    kit = site_kit(request)
    q = request.query_params.get("q", "").strip()
    sql, params = search_sql(q)
    con = kit.db(request)
    page = int_arg(request.query_params.get("page"))
    rows, pages = kit.paginate(con, sql, params, page)
    total = con.execute(f"SELECT COUNT(*) FROM ({sql})", params).fetchone()[0]
    return kit.render(request, "list.html", heading=f"Search results for: '{q}'", q=q, products=rows,
                      total=total, page=min(page, pages), pages=pages, qs=urlencode({"q": q}) + "&")


@login_required
async def category(request: Request):
    kit = site_kit(request)
    con = kit.db(request)
    cat = con.execute("SELECT * FROM categories WHERE slug=?", (request.path_params["slug"],)).fetchone()
    if cat is None:
        return not_found(request, "Category not found")
    sql = "SELECT id, name, price FROM products WHERE status='Enabled' AND category_id=? ORDER BY name"
    page = int_arg(request.query_params.get("page"))
    rows, pages = kit.paginate(con, sql, (cat["id"],), page)
    total = con.execute(f"SELECT COUNT(*) FROM ({sql})", (cat["id"],)).fetchone()[0]
    return kit.render(request, "list.html", heading=cat["name"], products=rows, total=total,
                      page=min(page, pages), pages=pages, qs="")


@login_required
async def product(request: Request):
    kit = site_kit(request)
    con = kit.db(request)
    p = con.execute("SELECT * FROM products WHERE id=?", (request.path_params["pid"],)).fetchone()
    if p is None:
        return not_found(request, "Product not found")
    cat = con.execute("SELECT * FROM categories WHERE id=?", (p["category_id"],)).fetchone()
    reviews = con.execute("SELECT * FROM reviews WHERE product_id=? ORDER BY id", (p["id"],)).fetchall()
    rating = round(sum(r["rating"] for r in reviews) / len(reviews), 1) if reviews else "no rating"
    return kit.render(request, "product.html", p=p, cat=cat, reviews=reviews, rating=rating,
                      added=request.query_params.get("added") == "1")


@login_required
async def cart_add(request: Request):
    kit = site_kit(request)
    form = await form_data(request)
    pid, qty = int_arg(form.get("product_id"), 0, 0), int_arg(form.get("qty"), 1, 1, 99)
    con = kit.db(request)
    if con.execute("SELECT 1 FROM products WHERE id=?", (pid,)).fetchone():
        con.execute("INSERT INTO cart(product_id, qty) VALUES (?, ?) "
                    "ON CONFLICT(product_id) DO UPDATE SET qty = qty + excluded.qty", (pid, qty))
        con.commit()
    return kit.redirect(f"/product/{pid}?added=1")


@login_required
async def cart_remove(request: Request):
    kit = site_kit(request)
    form = await form_data(request)
    con = kit.db(request)
    con.execute("DELETE FROM cart WHERE product_id=?", (int_arg(form.get("product_id"), 0, 0),))
    con.commit()
    return kit.redirect("/cart")


@login_required
async def cart(request: Request):
    kit = site_kit(request)
    items = cart_items(kit.db(request))
    return kit.render(request, "cart.html", items=items, total=sum(i["qty"] * i["price"] for i in items))


@login_required
async def checkout(request: Request):
    kit = site_kit(request)
    con = kit.db(request)
    items = cart_items(con)
    if not items:
        return kit.redirect("/cart")
    total = sum(i["qty"] * i["price"] for i in items)
    if request.method == "GET":
        return kit.render(request, "checkout.html", n=sum(i["qty"] for i in items), total=total, address=ADDRESS)
    form = await form_data(request)
    total += 15.0 if form.get("shipping", "").startswith("Express") else 5.0
    last = con.execute("SELECT MAX(CAST(number AS INT)) FROM orders").fetchone()[0] or 0
    number = f"{last + 1:09d}"
    cur = con.execute("INSERT INTO orders(number, date, status, total) VALUES (?, '2023-07-01', 'Pending', ?)",
                      (number, round(total, 2)))
    con.executemany("INSERT INTO order_items VALUES (?, ?, ?, ?)",
                    [(cur.lastrowid, i["product_id"], i["qty"], i["price"]) for i in items])
    con.execute("DELETE FROM cart")
    con.commit()
    return kit.redirect(f"/order/{number}")


@login_required
async def orders(request: Request):
    kit = site_kit(request)
    page = int_arg(request.query_params.get("page"))
    rows, pages = kit.paginate(kit.db(request), "SELECT * FROM orders ORDER BY CAST(number AS INT) DESC", (), page)
    return kit.render(request, "orders.html", orders=rows, page=min(page, pages), pages=pages)


@login_required
async def order(request: Request):
    kit = site_kit(request)
    con = kit.db(request)
    o = con.execute("SELECT * FROM orders WHERE number=?", (request.path_params["number"],)).fetchone()
    if o is None:
        return not_found(request, "Order not found")
    items = con.execute("SELECT i.*, p.name FROM order_items i JOIN products p ON p.id = i.product_id "
                        "WHERE order_id=?", (o["id"],)).fetchall()
    return kit.render(request, "order.html", o=o, items=items)


ROUTES = [Route("/", home), Route("/search", search), Route("/category/{slug}", category),
          Route("/product/{pid:int}", product), Route("/cart", cart), Route("/cart/add", cart_add, methods=["POST"]),
          Route("/cart/remove", cart_remove, methods=["POST"]), Route("/checkout", checkout, methods=["GET", "POST"]),
          Route("/orders", orders), Route("/order/{number}", order)]
APP = SiteApp(ROUTES, "shopping_session", dict([CUSTOMER, WEBARENA_CUSTOMER]), "__SHOPPING__")

"""The embedded shop administration site (Magento-admin-like): products, orders, customers, reports, edit forms.

Every page needs the admin login (cookie ``admin_session``). Grids are searchable and paginated.
"""

from __future__ import annotations

from urllib.parse import urlencode

from starlette.requests import Request
from starlette.routing import Route

from webrl_core.sites.common import SiteApp, form_data, int_arg, login_required, site_kit
from webrl_core.sites.data import MONTH_NAMES, MONTHS, ORDER_STATUSES


def bestsellers_sql() -> str:
    """Units sold per product in one month (orders that were not canceled), best first, ties by name."""
    return ("SELECT p.name, SUM(i.qty) AS units FROM order_items i JOIN orders o ON o.id = i.order_id "
            "JOIN products p ON p.id = i.product_id WHERE o.date LIKE ? AND o.status != 'Canceled' "
            "GROUP BY p.id ORDER BY units DESC, p.name LIMIT 5")


def grid(request: Request, template: str, sql: str, params: tuple, q: str):
    """One page of a searchable grid (``?q=`` and ``?page=``)."""
    kit = site_kit(request)
    con = kit.db(request)
    page = int_arg(request.query_params.get("page"))
    rows, pages = kit.paginate(con, sql, params, page)
    total = con.execute(f"SELECT COUNT(*) FROM ({sql})", params).fetchone()[0]
    return kit.render(request, template, rows=rows, total=total, q=q, page=min(page, pages), pages=pages,
                      qs=urlencode({"q": q}) + "&" if q else "")


@login_required
async def dashboard(request: Request):
    kit = site_kit(request)
    con = kit.db(request)
    one = lambda sql: con.execute(sql).fetchone()[0]  # noqa: E731
    last = con.execute("SELECT o.number, o.total, c.name FROM orders o JOIN customers c ON c.id = o.customer_id "
                       "ORDER BY o.id DESC LIMIT 5").fetchall()
    return kit.render(request, "dashboard.html", revenue=one("SELECT SUM(total) FROM orders"),
                      n_orders=one("SELECT COUNT(*) FROM orders"), n_customers=one("SELECT COUNT(*) FROM customers"),
                      n_products=one("SELECT COUNT(*) FROM products"), last=last)


@login_required
async def products(request: Request):
    q = request.query_params.get("q", "").strip()
    words = q.lower().split()[:8]
    where = " AND ".join("(lower(name) LIKE ? OR lower(sku) LIKE ?)" for _ in words) or "1=1"
    params = tuple(x for w in words for x in (f"%{w}%", f"%{w}%"))
    return grid(request, "products.html", f"SELECT * FROM products WHERE {where} ORDER BY id", params, q)


@login_required
async def product_edit(request: Request):
    kit = site_kit(request)
    con = kit.db(request)
    pid = request.path_params["pid"]
    if request.method == "POST":
        form = await form_data(request)
        try:
            price = round(float(form.get("price", "").replace("$", "").replace(",", "")), 2)
            stock = int(float(form.get("stock", "0")))
        except ValueError:
            p = con.execute("SELECT * FROM products WHERE id=?", (pid,)).fetchone()
            return kit.render(request, "product_edit.html", status=400, p=p, saved=False)
        status = form.get("status") if form.get("status") in ("Enabled", "Disabled") else "Enabled"
        con.execute("UPDATE products SET name=?, price=?, stock=?, status=? WHERE id=?",
                    (form.get("name", "").strip() or "Unnamed", price, stock, status, pid))
        con.commit()
        return kit.redirect(f"/product/{pid}/edit?saved=1")
    p = con.execute("SELECT * FROM products WHERE id=?", (pid,)).fetchone()
    if p is None:
        return kit.redirect("/products")
    return kit.render(request, "product_edit.html", p=p, saved=request.query_params.get("saved") == "1")


@login_required
async def orders(request: Request):
    q = request.query_params.get("q", "").strip()
    sql = ("SELECT o.*, c.name FROM orders o JOIN customers c ON c.id = o.customer_id "
           "WHERE o.number LIKE ? OR lower(c.name) LIKE ? ORDER BY o.id DESC")
    return grid(request, "orders.html", sql, (f"%{q}%", f"%{q.lower()}%"), q)


@login_required
async def order(request: Request):
    kit = site_kit(request)
    con = kit.db(request)
    number = request.path_params["number"]
    if request.method == "POST":
        form = await form_data(request)
        if form.get("status") in ORDER_STATUSES:
            con.execute("UPDATE orders SET status=? WHERE number=?", (form["status"], number))
            con.commit()
        return kit.redirect(f"/order/{number}?saved=1")
    o = con.execute("SELECT o.*, c.name FROM orders o JOIN customers c ON c.id = o.customer_id "
                    "WHERE o.number=?", (number,)).fetchone()
    if o is None:
        return kit.redirect("/orders")
    items = con.execute("SELECT i.qty, p.name FROM order_items i JOIN products p ON p.id = i.product_id "
                        "WHERE i.order_id=?", (o["id"],)).fetchall()
    return kit.render(request, "order.html", o=o, items=items, statuses=ORDER_STATUSES,
                      saved=request.query_params.get("saved") == "1")


@login_required
async def customers(request: Request):
    q = request.query_params.get("q", "").strip()
    sql = "SELECT * FROM customers WHERE lower(name) LIKE ? OR lower(email) LIKE ? ORDER BY id"
    return grid(request, "customers.html", sql, (f"%{q.lower()}%", f"%{q.lower()}%"), q)


@login_required
async def customer(request: Request):
    kit = site_kit(request)
    con = kit.db(request)
    c = con.execute("SELECT * FROM customers WHERE id=?", (request.path_params["cid"],)).fetchone()
    if c is None:
        return kit.redirect("/customers")
    orders_ = con.execute("SELECT * FROM orders WHERE customer_id=? ORDER BY id DESC", (c["id"],)).fetchall()
    return kit.render(request, "customer.html", c=c, orders=orders_)


@login_required
async def reports(request: Request):
    kit = site_kit(request)
    month = request.query_params.get("month", "")
    ctx = {"months": [(m, MONTH_NAMES[m]) for m in MONTHS], "month": month if month in MONTHS else ""}
    if ctx["month"]:
        con = kit.db(request)
        rev, n = con.execute("SELECT COALESCE(SUM(total), 0), COUNT(*) FROM orders WHERE date LIKE ? "
                             "AND status != 'Canceled'", (f"{month}%",)).fetchone()
        ctx.update(label=MONTH_NAMES[month], revenue=rev, n_orders=n,
                   top=con.execute(bestsellers_sql(), (f"{month}%",)).fetchall())
    return kit.render(request, "reports.html", **ctx)


ROUTES = [Route("/", dashboard), Route("/products", products),
          Route("/product/{pid:int}/edit", product_edit, methods=["GET", "POST"]), Route("/orders", orders),
          Route("/order/{number}", order, methods=["GET", "POST"]), Route("/customers", customers),
          Route("/customer/{cid:int}", customer), Route("/reports", reports)]
APP = SiteApp(ROUTES, "admin_session", {"admin": "admin1234"}, "__SHOPPING_ADMIN__")

"""Task families of the store's admin panel: one class per family, registered in definition order."""

from __future__ import annotations

from webrl_core.env.observation import parse_observation_elements
from webrl_core.sites.data import MONTH_NAMES, MONTHS
from webrl_core.sites.families.base import (button, click_link, do, ev_html, ev_string, ev_url, Family, field,
                                            finish, PageView, register, row_link, scroll_or_fail, select_with,
                                            selected_text)


class ShoppingAdminFamily(Family):
    """A family of the shop administration site; its tasks start on the home page."""

    site, start_url = "shopping_admin", "__SHOPPING_ADMIN__"


def _admin_grid(page: PageView, menu: str, grid_path: str, query: str, placeholder: str) -> str | None:
    """Navigate to ``grid_path`` filtered by ``query``; None once there."""
    if page.path != grid_path:
        return click_link(page, menu)
    box = field(page, placeholder)
    if box is None:
        return scroll_or_fail(page, "no search box")
    if page.query.get("q", "").lower() != query.lower():
        return do("Search", box, query)
    return None


def _admin_products(d):
    return d["shopping_admin"]["products"]


@register
class ShoppingAdminProductStock(ShoppingAdminFamily):
    """Ask a product's stock quantity; read it from the product grid (string_match)."""

    name = "shopping_admin.product_stock"
    templates = ["How many units of {product} are in stock?", "What is the stock quantity of {product}?"]
    test_quota = 7

    def instances(self, d):
        return [{"product": p["name"]} for p in _admin_products(d)]

    def evaluator(self, inst, d):
        p = next(p for p in _admin_products(d) if p["name"] == inst["product"])
        return ev_string(str(p["stock"]))

    def oracle(self, inst, page):
        nxt = _admin_grid(page, "Catalog", "/products", inst["product"], "Search by keyword")
        if nxt:
            return nxt
        els = parse_observation_elements(page.html)
        for i, e in enumerate(els):
            if e.tag == "tr" and inst["product"] in e.text:
                cells = [c.text for c in els if c.parent == i]
                return finish(cells[4], f"The grid shows quantity {cells[4]}")
        return scroll_or_fail(page, "product row not visible")


@register
class ShoppingAdminUpdatePrice(ShoppingAdminFamily):
    """Change a product's price in its edit form (program_html on the form)."""

    name = "shopping_admin.update_price"
    templates = ["Change the price of {product} to ${price}.", "Set the price of the {product} to {price} dollars."]
    test_quota = 6

    def instances(self, d):
        out = []
        for p in _admin_products(d):
            for k in (0.5, 0.8, 1.25):
                out.append({"product": p["name"], "price": f"{round(p['price'] * k) + 0.49:.2f}"})
        return out

    def evaluator(self, inst, d):
        p = next(p for p in _admin_products(d) if p["name"] == inst["product"])
        return ev_html(
            (f"__SHOPPING_ADMIN__/product/{p['id']}/edit", "document.querySelector('#price').value",
             {"exact_match": inst["price"]}))

    def oracle(self, inst, page):
        if page.path.endswith("/edit"):
            price = field(page, "Price")
            if price is None:
                return scroll_or_fail(page, "no price field")
            if price.attrs.get("value") != inst["price"]:
                return do("Type", price, inst["price"], "Price field")
            if "You saved the product" in page.html:
                return finish("Done", f"The price is now {inst['price']}")
            return do("Click", button(page, "Save"))
        nxt = _admin_grid(page, "Catalog", "/products", inst["product"], "Search by keyword")
        if nxt:
            return nxt
        el = row_link(page, inst["product"], "Edit")
        return do("Click", el, what=f"Edit {inst['product']}") if el else scroll_or_fail(page, "row not visible")


def _admin_order(d, number):
    o = next(o for o in d["shopping_admin"]["orders"] if o["number"] == number)
    c = next(c for c in d["shopping_admin"]["customers"] if c["id"] == o["customer_id"])
    return o, c


@register
class ShoppingAdminOrderCustomer(ShoppingAdminFamily):
    """Ask who placed an order; read it from the order grid (string_match)."""

    name = "shopping_admin.order_customer"
    templates = ["Who placed order #{number}?", "What is the name of the customer of order {number}?"]
    test_quota = 6

    def instances(self, d):
        return [{"number": o["number"]} for o in d["shopping_admin"]["orders"]]

    def evaluator(self, inst, d):
        return ev_string(_admin_order(d, inst["number"])[1]["name"])

    def oracle(self, inst, page):
        nxt = _admin_grid(page, "Sales", "/orders", inst["number"], "Search by order # or customer")
        if nxt:
            return nxt
        els = parse_observation_elements(page.html)
        for i, e in enumerate(els):
            if e.tag == "tr" and e.text.startswith(inst["number"]):
                cells = [c.text for c in els if c.parent == i]
                return finish(cells[2], f"Order {inst['number']} was placed by {cells[2]}")
        return scroll_or_fail(page, "order row not visible")


@register
class ShoppingAdminCustomerNav(ShoppingAdminFamily):
    """Open a customer's page (url_match)."""

    name = "shopping_admin.customer_nav"
    templates = ["Open the customer page of {name}.", "Show me the account of the customer {name}."]
    test_quota = 7

    def instances(self, d):
        return [{"name": c["name"]} for c in d["shopping_admin"]["customers"]]

    def evaluator(self, inst, d):
        c = next(c for c in d["shopping_admin"]["customers"] if c["name"] == inst["name"])
        return ev_url(f"__SHOPPING_ADMIN__/customer/{c['id']}")

    def oracle(self, inst, page):
        if page.path.startswith("/customer/"):
            return finish("Done", f"This is {inst['name']}'s page")
        nxt = _admin_grid(page, "Customers", "/customers", inst["name"], "Search by name or email")
        if nxt:
            return nxt
        el = row_link(page, inst["name"], "Edit")
        return do("Click", el, what=f"Edit {inst['name']}") if el else scroll_or_fail(page, "row not visible")


def _report(d, month):
    """(bestseller name or None if tied, revenue, order count) of a month, as /reports computes them."""
    ad = d["shopping_admin"]
    names = {p["id"]: p["name"] for p in ad["products"]}
    ok = {o["id"]: o for o in ad["orders"] if o["date"].startswith(month) and o["status"] != "Canceled"}
    units: dict[str, int] = {}
    for it in ad["order_items"]:
        if it["order_id"] in ok:
            units[names[it["product_id"]]] = units.get(names[it["product_id"]], 0) + it["qty"]
    ranked = sorted(units.items(), key=lambda kv: (-kv[1], kv[0]))
    best = ranked[0][0] if len(ranked) > 1 and ranked[0][1] > ranked[1][1] else None
    return best, f"{sum(o['total'] for o in ok.values()):.2f}", str(len(ok))


@register
class ShoppingAdminSalesReport(ShoppingAdminFamily):
    """Ask a month's bestseller, revenue or order count from the reports page (string_match)."""

    name = "shopping_admin.sales_report"
    templates = ["best|Which product sold the most units in {month}?",
                 "best|What was the bestselling product in {month}?",
                 "revenue|What was the revenue in {month}?", "revenue|How much revenue did the store make in {month}?",
                 "orders|How many orders (not canceled) were placed in {month}?"]
    test_quota = 4
    template_key = "metric"

    def instances(self, d):
        out = []
        for m in MONTHS:
            for metric in ("best", "revenue", "orders"):
                if metric == "best" and _report(d, m)[0] is None:
                    continue
                out.append({"month": MONTH_NAMES[m], "metric": metric})
        return out

    def evaluator(self, inst, d):
        m = next(k for k, v in MONTH_NAMES.items() if v == inst["month"])
        best, rev, n = _report(d, m)
        return ev_string({"best": best, "revenue": rev, "orders": n}[inst["metric"]])

    def oracle(self, inst, page):
        if page.path != "/reports":
            return click_link(page, "Reports")
        sel = select_with(page, inst["month"])
        if sel is None:
            return scroll_or_fail(page, "no period selector")
        if selected_text(sel) != inst["month"]:
            return do("Select Dropdown Option", sel, inst["month"], "Period")
        if f"{inst['month']}: revenue" not in page.text():
            return do("Click", button(page, "Show Report"))
        t = page.text()
        if inst["metric"] == "revenue":
            return finish(t.split("revenue $")[1].split()[0], "Read from the report")
        if inst["metric"] == "orders":
            return finish(t.split(" orders")[0].split()[-1], "Read from the report")
        els = parse_observation_elements(page.html)
        rows = [i for i, e in enumerate(els) if e.tag == "tr" and e.text.startswith("1 ")]
        cells = [c.text for c in els if rows and c.parent == rows[0]]
        return finish(cells[1] if cells else "unknown", "Rank 1 of the bestsellers")


@register
class ShoppingAdminOrderStatusUpdate(ShoppingAdminFamily):
    """Change an order's status (program_html on the order page)."""

    name = "shopping_admin.order_status_update"
    templates = ["Change the status of order #{number} to {status}.", "Mark order {number} as {status}."]
    test_quota = 6

    def instances(self, d):
        return [{"number": o["number"], "status": s} for o in d["shopping_admin"]["orders"]
                for s in ("Shipped", "Complete", "Canceled") if s != o["status"]]

    def evaluator(self, inst, d):
        return ev_html(
            (f"__SHOPPING_ADMIN__/order/{inst['number']}", "document.querySelector('#order-status').outerText",
             {"exact_match": inst["status"]}))

    def oracle(self, inst, page):
        if page.path == f"/order/{inst['number']}":
            if "status was updated" in page.html and f"Status {inst['status']}" in page.text():
                return finish("Done", f"Order {inst['number']} is {inst['status']}")
            sel = select_with(page, inst["status"])
            if sel is None:
                return scroll_or_fail(page, "no status selector")
            if selected_text(sel) != inst["status"]:
                return do("Select Dropdown Option", sel, inst["status"], "Change status")
            return do("Click", button(page, "Update Status"))
        nxt = _admin_grid(page, "Sales", "/orders", inst["number"], "Search by order # or customer")
        if nxt:
            return nxt
        el = row_link(page, inst["number"], "View")
        return do("Click", el, what=f"View order {inst['number']}") if el else scroll_or_fail(page, "row not visible")

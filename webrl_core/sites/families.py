"""Task families of the embedded sites: parameterised WebArena-Lite tasks with verifiable evaluators and oracles.

A family is (site, intent phrasings, instantiation space, builder, oracle):

  - ``instances(data)``: every instantiation (a JSON-able dict) the seeded data supports, in a fixed order;
  - ``build(inst, data)``: ``start_url`` + ``eval`` (string_match / url_match / program_html) for one instantiation,
    computed from the same seeded rows the site serves, so the reference answer is right by construction;
  - ``oracle(inst, page)``: the next action of a scripted expert, decided from the CURRENT page only (its URL
    and its simplified-HTML observation), so it recovers from any state and its responses are valid
    demonstrations in the agent's grammar (``# Element: ...`` then ``do(...)``/``exit(...)``).

Split rule: the instantiations of a family are ordered by a stable hash; the first ``test_quota`` are the
held-out test pool, the rest the training pool (so test and training instantiations are disjoint).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Callable
from urllib.parse import parse_qs, urlsplit

from webrl_core.env.observation import find_element, labelled_elements, parse_observation_elements
from webrl_core.sites.data import GL_USERS, MONTH_NAMES, MONTHS, route


# --------------------------------------------------------------------------- oracle toolkit

@dataclass
class PageView:
    """What an oracle looks at: the current URL (split) and observation."""

    url: str
    html: str
    step: int = 0

    @property
    def path(self) -> str:
        return urlsplit(self.url).path.rstrip("/") or "/"

    @property
    def query(self) -> dict[str, str]:
        return {k: v[-1] for k, v in parse_qs(urlsplit(self.url).query).items()}

    def text(self) -> str:
        els = parse_observation_elements(self.html)
        return " ".join(e.text for e in els if e.parent is None)


def q(s: str) -> str:
    """A Python string literal the action parser accepts."""
    return json.dumps(s, ensure_ascii=False)


def do(action: str, el=None, argument: str | None = None, what: str | None = None) -> str:
    lines = []
    if el is not None:
        desc = what or el.text or el.attrs.get("placeholder") or el.attrs.get("title") or el.tag
        lines.append(f"# Element: {desc[:80]}")
    args = [f"action={q(action)}"]
    if argument is not None:
        args.append(f"argument={q(argument)}")
    if el is not None:
        args.append(f"element={q(el.id)}")
    lines.append(f"do({', '.join(args)})")
    return "\n".join(lines)


def finish(message: str, note: str | None = None) -> str:
    return (f"# Note: {note}\n" if note else "") + f"exit(message={q(message)})"


def scroll_or_fail(page: PageView, why: str) -> str:
    # the target is not among the visible elements: scroll once, then give up with a clear note
    if page.step < 12:
        return f"# Note: {why}; scrolling to look for it\ndo(action=\"Scroll Down\")"
    return finish("I could not complete the task.", why)


def link(page: PageView, text: str, exact: bool = True):
    return find_element(page.html, text, tag="a", exact=exact)


def button(page: PageView, text: str):
    return find_element(page.html, text, tag="button", exact=True)


def field(page: PageView, placeholder: str, tag: str | None = None):
    for el in labelled_elements(page.html):
        if el.attrs.get("placeholder", "").lower() == placeholder.lower() and (tag is None or el.tag == tag):
            return el
    return None


def select_with(page: PageView, option: str):
    """The select element that offers an option with this text."""
    els = parse_observation_elements(page.html)
    for i, el in enumerate(els):
        if el.tag == "select" and el.id.isdigit():
            opts = [o.text.lower() for o in els[i + 1:] if o.tag == "option" and o.parent == i]
            if option.lower() in opts:
                return el
    return None


def selected_text(el) -> str:
    return el.attrs.get("data-value", "") if el is not None else ""


def row_link(page: PageView, row_text: str, link_text: str):
    """The link ``link_text`` inside the table row / list item whose text holds ``row_text``."""
    els = parse_observation_elements(page.html)
    for el in els:
        if not (el.id.isdigit() and el.tag == "a" and el.text.strip().lower() == link_text.lower()):
            continue
        p = el.parent
        while p is not None:
            if els[p].tag in ("tr", "li") and row_text.lower() in els[p].text.lower():
                return el
            p = els[p].parent
    return None


def search_then_click(page: PageView, query: str, placeholder: str, target: str, exact: bool = True) -> str:
    """Click the link ``target`` if it is on the page, else search for ``query`` (or page on)."""
    el = link(page, target, exact)
    if el is not None:
        return do("Click", el)
    box = field(page, placeholder)
    if box is not None and box.attrs.get("value", "").lower() != query.lower():
        return do("Search", box, query)
    nxt = link(page, "Next")
    if nxt is not None:
        return do("Click", nxt)
    if box is not None:
        return do("Search", box, query)
    return scroll_or_fail(page, f"no search box and no link '{target}'")


def click_link(page: PageView, text: str, exact: bool = True) -> str:
    el = link(page, text, exact)
    return do("Click", el) if el is not None else scroll_or_fail(page, f"link '{text}' not visible")


# --------------------------------------------------------------------------- family registry

@dataclass
class Family:
    name: str
    site: str
    templates: list[str]                       # intent phrasings; str.format(**inst)
    instances: Callable[[dict], list[dict]]
    build: Callable[[dict, dict], dict]        # -> {"start_url", "eval"}
    oracle: Callable[[dict, PageView], str]
    test_quota: int
    template_key: str | None = None            # inst key that selects the phrasing group (see _phrasings)

    def phrasings(self, inst: dict) -> list[str]:
        if self.template_key is None:
            return self.templates
        return [t.split("|", 1)[1] for t in self.templates if t.split("|", 1)[0] == str(inst[self.template_key])]


FAMILIES: dict[str, Family] = {}


def family(name, site, templates, test_quota, template_key=None):
    def wrap(cls):
        FAMILIES[name] = Family(name, site, templates, cls.instances, cls.build, cls.oracle, test_quota, template_key)
        return cls
    return wrap


def ev_string(answer: str | list[str], how: str = "must_include") -> dict:
    ref = answer if isinstance(answer, list) else [answer]
    return {"eval_types": ["string_match"], "reference_answers": {how: ref if how != "exact_match" else ref[0]},
            "reference_url": None, "program_html": [], "reference_answer_raw_annotation": ", ".join(ref)}


def ev_url(url: str, note: str = "EXACT") -> dict:
    return {"eval_types": ["url_match"], "reference_answers": None, "reference_url": url, "program_html": [],
            "url_note": note}


def ev_html(*targets: tuple[str, str, dict]) -> dict:
    return {"eval_types": ["program_html"], "reference_answers": None, "reference_url": None,
            "program_html": [{"url": u, "locator": loc, "required_contents": rc} for u, loc, rc in targets]}


def stable_hash(obj) -> int:
    return int(hashlib.sha1(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:12], 16)


def _prod_by_name(data, name):
    return next(p for p in data["shopping"]["products"] if p["name"] == name)


def _enabled(data):
    return [p for p in data["shopping"]["products"] if p["status"] == "Enabled"]


SHOP_SEARCH = "Search entire store here..."

# --------------------------------------------------------------------------- shopping


def _shop_to_product(page: PageView, product: str) -> str | None:
    """None when already on the product's page, else the next action to get there."""
    h1 = [e for e in parse_observation_elements(page.html) if e.tag == "h1"]
    if page.path.startswith("/product/") and h1 and h1[0].text == product:
        return None
    return search_then_click(page, product, SHOP_SEARCH, product)


@family("shopping.product_price", "shopping", ["What is the price of {product}?", "How much does the {product} cost?",
                                                 "Tell me the price of the {product}."], 9)
class _:
    instances = staticmethod(lambda d: [{"product": p["name"]} for p in _enabled(d)])

    @staticmethod
    def build(inst, d):
        return {"start_url": "__SHOPPING__", "eval": ev_string(f"{_prod_by_name(d, inst['product'])['price']:.2f}")}

    @staticmethod
    def oracle(inst, page):
        nxt = _shop_to_product(page, inst["product"])
        if nxt:
            return nxt
        price = next((e.text for e in parse_observation_elements(page.html) if e.text.startswith("$")), "")
        return finish(price.split()[0] if price else "unknown", f"The product page shows the price {price}")


@family("shopping.review_count", "shopping", ["How many reviews does {product} have?",
                                               "Count the customer reviews of the {product}."], 8)
class _:
    instances = staticmethod(lambda d: [{"product": p["name"]} for p in _enabled(d)])

    @staticmethod
    def build(inst, d):
        pid = _prod_by_name(d, inst["product"])["id"]
        n = sum(1 for r in d["shopping"]["reviews"] if r["product_id"] == pid)
        return {"start_url": "__SHOPPING__", "eval": ev_string(str(n))}

    @staticmethod
    def oracle(inst, page):
        nxt = _shop_to_product(page, inst["product"])
        if nxt:
            return nxt
        t = page.text()
        n = t.split(" reviews")[0].split()[-1] if " reviews" in t else "0"
        return finish(n, f"The page says {n} reviews")


@family("shopping.category_nav", "shopping",
        ["1|Open the {category} category.", "1|Show me the products in the {category} category.",
         "2|Go to page 2 of the {category} category.", "2|Show me the second page of the {category} category."],
        5, template_key="page")
class _:
    instances = staticmethod(lambda d: [{"category": c["name"], "page": pg} for c in d["shopping"]["categories"]
                                        for pg in (1, 2)])

    @staticmethod
    def build(inst, d):
        slug = next(c["slug"] for c in d["shopping"]["categories"] if c["name"] == inst["category"])
        url = f"__SHOPPING__/category/{slug}" + ("?page=2" if inst["page"] == 2 else "")
        return {"start_url": "__SHOPPING__", "eval": ev_url(url)}

    @staticmethod
    def oracle(inst, page):
        on_cat = page.path.startswith("/category/") and inst["category"] in page.text()
        if not on_cat:
            home = link(page, "One Stop Market")
            cat = link(page, inst["category"])
            return do("Click", cat) if cat else (do("Click", home) if home else scroll_or_fail(page, "no category"))
        if inst["page"] == 2 and page.query.get("page") != "2":
            return click_link(page, "Next")
        return finish("Done", f"This is the {inst['category']} category" + (", page 2" if inst["page"] == 2 else ""))


@family("shopping.add_to_cart", "shopping", ["Add {product} to my shopping cart.", "Put the {product} in my cart."], 8)
class _:
    instances = staticmethod(lambda d: [{"product": p["name"]} for p in _enabled(d)])

    @staticmethod
    def build(inst, d):
        return {"start_url": "__SHOPPING__", "eval": ev_html(
            ("__SHOPPING__/cart", "document.querySelector('#cart').outerText", {"must_include": [inst["product"]]}))}

    @staticmethod
    def oracle(inst, page):
        nxt = _shop_to_product(page, inst["product"])
        if nxt:
            return nxt
        if "You added" in page.html:
            return finish("Done", f"{inst['product']} is in the cart")
        b = button(page, "Add to Cart")
        return do("Click", b) if b else scroll_or_fail(page, "no Add to Cart button")


@family("shopping.order_status", "shopping", ["What is the status of my order #{number}?",
                                               "Check the status of order number {number}."], 7)
class _:
    instances = staticmethod(lambda d: [{"number": o["number"]} for o in d["shopping"]["orders"]])

    @staticmethod
    def build(inst, d):
        o = next(o for o in d["shopping"]["orders"] if o["number"] == inst["number"])
        return {"start_url": "__SHOPPING__", "eval": ev_string(o["status"])}

    @staticmethod
    def oracle(inst, page):
        if page.path == f"/order/{inst['number']}":
            status = page.text().split("Status: ")[1].split(" |")[0].strip() if "Status: " in page.text() else ""
            return finish(status, f"Order {inst['number']} is {status}")
        if page.path == "/orders":
            el = row_link(page, inst["number"], "View Order")
            return do("Click", el, what=f"View Order {inst['number']}") if el else click_link(page, "Next")
        return click_link(page, "My Orders")


@family("shopping.checkout", "shopping", ["1|Buy {product} with flat rate shipping.",
                                          "1|Order the {product} using the flat rate shipping.",
                                          "2|Buy {product} with express shipping.",
                                          "2|Order the {product} using express shipping."], 9, template_key="express")
class _:
    instances = staticmethod(lambda d: [{"product": p["name"], "express": e} for p in _enabled(d) for e in (1, 2)])

    @staticmethod
    def build(inst, d):
        p = _prod_by_name(d, inst["product"])
        total = f"{p['price'] + (15.0 if inst['express'] == 2 else 5.0):.2f}"
        return {"start_url": "__SHOPPING__", "eval": ev_html(
            ("last", "document.querySelector('#items').outerText", {"must_include": [inst["product"]]}),
            ("last", "document.querySelector('h1').outerText + ' ' + document.querySelector('#order-total').outerText",
             {"must_include": ["Order #", total]}))}

    @staticmethod
    def oracle(inst, page):
        ship = "Express" if inst["express"] == 2 else "Flat Rate"
        if page.path.startswith("/order/"):
            return finish("Done", "The order was placed")
        if page.path == "/checkout":
            sel = select_with(page, "Express $15.00")
            if sel is not None and not selected_text(sel).startswith(ship):
                return do("Select Dropdown Option", sel, ship, "Shipping method")
            return do("Click", button(page, "Place Order")) if button(page, "Place Order") else scroll_or_fail(
                page, "no Place Order button")
        if page.path == "/cart":
            if inst["product"] in page.text():
                return click_link(page, "Proceed to Checkout")
            return click_link(page, "One Stop Market")
        if page.path.startswith("/product/") and "You added" in page.html:
            return click_link(page, "My Cart")
        nxt = _shop_to_product(page, inst["product"])
        if nxt:
            return nxt
        b = button(page, "Add to Cart")
        return do("Click", b) if b else scroll_or_fail(page, "no Add to Cart button")


# --------------------------------------------------------------------------- shopping_admin

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


@family("shopping_admin.product_stock", "shopping_admin",
        ["How many units of {product} are in stock?", "What is the stock quantity of {product}?"], 7)
class _:
    instances = staticmethod(lambda d: [{"product": p["name"]} for p in _admin_products(d)])

    @staticmethod
    def build(inst, d):
        p = next(p for p in _admin_products(d) if p["name"] == inst["product"])
        return {"start_url": "__SHOPPING_ADMIN__", "eval": ev_string(str(p["stock"]))}

    @staticmethod
    def oracle(inst, page):
        nxt = _admin_grid(page, "Catalog", "/products", inst["product"], "Search by keyword")
        if nxt:
            return nxt
        els = parse_observation_elements(page.html)
        for i, e in enumerate(els):
            if e.tag == "tr" and inst["product"] in e.text:
                cells = [c.text for c in els if c.parent == i]
                return finish(cells[4], f"The grid shows quantity {cells[4]}")
        return scroll_or_fail(page, "product row not visible")


@family("shopping_admin.update_price", "shopping_admin",
        ["Change the price of {product} to ${price}.", "Set the price of the {product} to {price} dollars."], 6)
class _:
    @staticmethod
    def instances(d):
        out = []
        for p in _admin_products(d):
            for k in (0.5, 0.8, 1.25):
                out.append({"product": p["name"], "price": f"{round(p['price'] * k) + 0.49:.2f}"})
        return out

    @staticmethod
    def build(inst, d):
        p = next(p for p in _admin_products(d) if p["name"] == inst["product"])
        return {"start_url": "__SHOPPING_ADMIN__", "eval": ev_html(
            (f"__SHOPPING_ADMIN__/product/{p['id']}/edit", "document.querySelector('#price').value",
             {"exact_match": inst["price"]}))}

    @staticmethod
    def oracle(inst, page):
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


@family("shopping_admin.order_customer", "shopping_admin",
        ["Who placed order #{number}?", "What is the name of the customer of order {number}?"], 6)
class _:
    instances = staticmethod(lambda d: [{"number": o["number"]} for o in d["shopping_admin"]["orders"]])

    @staticmethod
    def build(inst, d):
        return {"start_url": "__SHOPPING_ADMIN__", "eval": ev_string(_admin_order(d, inst["number"])[1]["name"])}

    @staticmethod
    def oracle(inst, page):
        nxt = _admin_grid(page, "Sales", "/orders", inst["number"], "Search by order # or customer")
        if nxt:
            return nxt
        els = parse_observation_elements(page.html)
        for i, e in enumerate(els):
            if e.tag == "tr" and e.text.startswith(inst["number"]):
                cells = [c.text for c in els if c.parent == i]
                return finish(cells[2], f"Order {inst['number']} was placed by {cells[2]}")
        return scroll_or_fail(page, "order row not visible")


@family("shopping_admin.customer_nav", "shopping_admin",
        ["Open the customer page of {name}.", "Show me the account of the customer {name}."], 7)
class _:
    instances = staticmethod(lambda d: [{"name": c["name"]} for c in d["shopping_admin"]["customers"]])

    @staticmethod
    def build(inst, d):
        c = next(c for c in d["shopping_admin"]["customers"] if c["name"] == inst["name"])
        return {"start_url": "__SHOPPING_ADMIN__", "eval": ev_url(f"__SHOPPING_ADMIN__/customer/{c['id']}")}

    @staticmethod
    def oracle(inst, page):
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


@family("shopping_admin.sales_report", "shopping_admin",
        ["best|Which product sold the most units in {month}?", "best|What was the bestselling product in {month}?",
         "revenue|What was the revenue in {month}?", "revenue|How much revenue did the store make in {month}?",
         "orders|How many orders (not canceled) were placed in {month}?"], 4, template_key="metric")
class _:
    @staticmethod
    def instances(d):
        out = []
        for m in MONTHS:
            for metric in ("best", "revenue", "orders"):
                if metric == "best" and _report(d, m)[0] is None:
                    continue
                out.append({"month": MONTH_NAMES[m], "metric": metric})
        return out

    @staticmethod
    def build(inst, d):
        m = next(k for k, v in MONTH_NAMES.items() if v == inst["month"])
        best, rev, n = _report(d, m)
        return {"start_url": "__SHOPPING_ADMIN__",
                "eval": ev_string({"best": best, "revenue": rev, "orders": n}[inst["metric"]])}

    @staticmethod
    def oracle(inst, page):
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


@family("shopping_admin.order_status_update", "shopping_admin",
        ["Change the status of order #{number} to {status}.", "Mark order {number} as {status}."], 6)
class _:
    @staticmethod
    def instances(d):
        return [{"number": o["number"], "status": s} for o in d["shopping_admin"]["orders"]
                for s in ("Shipped", "Complete", "Canceled") if s != o["status"]]

    @staticmethod
    def build(inst, d):
        return {"start_url": "__SHOPPING_ADMIN__", "eval": ev_html(
            (f"__SHOPPING_ADMIN__/order/{inst['number']}", "document.querySelector('#order-status').outerText",
             {"exact_match": inst["status"]}))}

    @staticmethod
    def oracle(inst, page):
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


# --------------------------------------------------------------------------- reddit

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


@family("reddit.forum_nav", "reddit", ["Go to the {forum} forum.", "Open the forum about {forum}."], 3)
class _:
    instances = staticmethod(lambda d: [{"forum": f["name"]} for f in d["reddit"]["forums"]])

    @staticmethod
    def build(inst, d):
        return {"start_url": "__REDDIT__", "eval": ev_url(f"__REDDIT__/f/{inst['forum']}")}

    @staticmethod
    def oracle(inst, page):
        return _to_forum(page, inst["forum"]) or finish("Done", f"This is f/{inst['forum']}")


@family("reddit.post_author", "reddit", ["Who posted '{title}' in the {forum} forum?",
                                         "In f/{forum}, what is the username of the author of '{title}'?"], 5)
class _:
    instances = staticmethod(lambda d: [{"forum": p["forum"], "title": p["title"]} for p in _front_posts(d)])

    @staticmethod
    def build(inst, d):
        p = next(p for p in d["reddit"]["posts"] if p["title"] == inst["title"])
        return {"start_url": "__REDDIT__", "eval": ev_string(p["author"])}

    @staticmethod
    def oracle(inst, page):
        nxt = _to_forum(page, inst["forum"])
        if nxt:
            return nxt
        els = parse_observation_elements(page.html)
        for e in els:
            if e.tag == "li" and inst["title"] in e.text and " by " in e.text:
                author = e.text.split(" by ")[-1].split(" in f/")[0]
                return finish(author, f"The listing says by {author}")
        return scroll_or_fail(page, "post not visible")


@family("reddit.vote", "reddit", ["1|Upvote the post '{title}' in f/{forum}.",
                                  "1|Give an upvote to '{title}' in the {forum} forum.",
                                  "-1|Downvote the post '{title}' in f/{forum}."], 4, template_key="dir")
class _:
    instances = staticmethod(lambda d: [{"forum": p["forum"], "title": p["title"], "dir": v}
                                        for p in _front_posts(d) for v in (1, -1)])

    @staticmethod
    def build(inst, d):
        p = next(p for p in d["reddit"]["posts"] if p["title"] == inst["title"])
        return {"start_url": "__REDDIT__", "eval": ev_html(
            (f"__REDDIT__/f/{p['forum']}/{p['id']}", "document.querySelector('#post-vote').dataset.voted",
             {"exact_match": str(inst["dir"])}))}

    @staticmethod
    def oracle(inst, page):
        nxt = _to_post(page, inst["forum"], inst["title"])
        if nxt:
            return nxt
        if f"You {'up' if inst['dir'] == 1 else 'down'}voted this post" in page.text():
            return finish("Done", "The vote is recorded")
        b = find_element(page.html, "Upvote" if inst["dir"] == 1 else "Downvote", tag="button", exact=True)
        return do("Click", b) if b else scroll_or_fail(page, "no vote button")


@family("reddit.comment", "reddit", ["Reply to the post '{title}' in f/{forum} with \"{text}\".",
                                     "Comment \"{text}\" on '{title}' in the {forum} forum."], 4)
class _:
    @staticmethod
    def instances(d):
        texts = ["Great point, thanks!", "I learned something new today.", "Could you share a source?",
                 "Following this thread.", "Same here, welcome aboard."]
        return [{"forum": p["forum"], "title": p["title"], "text": t} for p in _front_posts(d) for t in texts]

    @staticmethod
    def build(inst, d):
        p = next(p for p in d["reddit"]["posts"] if p["title"] == inst["title"])
        return {"start_url": "__REDDIT__", "eval": ev_html(
            (f"__REDDIT__/f/{p['forum']}/{p['id']}", "document.querySelector('#comments').outerText",
             {"must_include": [f"MarvelsGrantMan136: {inst['text']}"]}))}

    @staticmethod
    def oracle(inst, page):
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


@family("reddit.submit", "reddit", ["Create a post titled '{title}' in the {forum} forum.",
                                    "Submit a new post to f/{forum} with the title '{title}'."], 4)
class _:
    @staticmethod
    def instances(d):
        titles = ["Weekly discussion thread", "Share your recent wins", "Beginner questions welcome here",
                  "What are you working on this month?", "Rate my setup"]
        return [{"forum": f["name"], "title": t} for f in d["reddit"]["forums"] for t in titles]

    @staticmethod
    def build(inst, d):
        return {"start_url": "__REDDIT__", "eval": ev_html(
            (f"__REDDIT__/f/{inst['forum']}", "document.querySelector('.posts').outerText",
             {"must_include": [inst["title"]]}))}

    @staticmethod
    def oracle(inst, page):
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


# --------------------------------------------------------------------------- gitlab

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


@family("gitlab.open_issue_count", "gitlab", ["How many open issues does the {project} project have?",
                                              "Count the open issues of {project}."], 7)
class _:
    instances = staticmethod(lambda d: [{"project": p["name"]} for p in d["gitlab"]["projects"]])

    @staticmethod
    def build(inst, d):
        pid = _proj(d, inst["project"])["id"]
        n = sum(1 for i in d["gitlab"]["issues"] if i["project_id"] == pid and i["state"] == "opened")
        return {"start_url": "__GITLAB__", "eval": ev_string(str(n))}

    @staticmethod
    def oracle(inst, page):
        nxt = _to_project(page, inst["project"])
        if nxt:
            return nxt
        t = page.text()
        n = t.split(" open issues")[0].split()[-1]
        return finish(n, f"The overview shows {n} open issues")


@family("gitlab.mr_nav", "gitlab", ["Open the merge requests of {project}.",
                                    "Show me the open merge requests in the {project} repository."], 7)
class _:
    instances = staticmethod(lambda d: [{"project": p["name"]} for p in d["gitlab"]["projects"]])

    @staticmethod
    def build(inst, d):
        p = _proj(d, inst["project"])
        return {"start_url": "__GITLAB__", "eval": ev_url(f"__GITLAB__/{p['namespace']}/{p['name']}/-/merge_requests")}

    @staticmethod
    def oracle(inst, page):
        return (_in_project(page, inst["project"], "Merge requests", "/-/merge_requests")
                or finish("Done", "These are the merge requests"))


@family("gitlab.create_issue", "gitlab", ["Create an issue titled '{title}' in the {project} project.",
                                          "Open a new issue in {project} called '{title}'."], 7)
class _:
    @staticmethod
    def instances(d):
        titles = ["Update the installation guide", "Crash on empty input", "Add a dark theme",
                  "Support Python 3.12", "Broken link in the docs"]
        return [{"project": p["name"], "title": t} for p in d["gitlab"]["projects"] for t in titles]

    @staticmethod
    def build(inst, d):
        p = _proj(d, inst["project"])
        return {"start_url": "__GITLAB__", "eval": ev_html(
            (f"__GITLAB__/{p['namespace']}/{p['name']}/-/issues", "document.querySelector('.issues').outerText",
             {"must_include": [inst["title"]]}))}

    @staticmethod
    def oracle(inst, page):
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


@family("gitlab.add_member", "gitlab", ["Add {user} to the {project} project as {role}.",
                                        "Invite {user} to {project} with the {role} role."], 6)
class _:
    @staticmethod
    def instances(d):
        out = []
        for p in d["gitlab"]["projects"]:
            have = {m["username"] for m in d["gitlab"]["members"] if m["project_id"] == p["id"]}
            for u in GL_USERS:
                if u not in have:
                    out += [{"project": p["name"], "user": u, "role": r} for r in ("Reporter", "Developer")]
        return out

    @staticmethod
    def build(inst, d):
        p = _proj(d, inst["project"])
        loc = f"document.querySelector('[data-member=\"{inst['user']}\"] .role').outerText"
        return {"start_url": "__GITLAB__", "eval": ev_html(
            (f"__GITLAB__/{p['namespace']}/{p['name']}/-/project_members", loc, {"exact_match": inst["role"]}))}

    @staticmethod
    def oracle(inst, page):
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


@family("gitlab.file_lines", "gitlab", ["How many lines does {path} have in the {project} project?",
                                        "What is the line count of the file {path} in {project}?"], 7)
class _:
    @staticmethod
    def instances(d):
        names = {p["id"]: p["name"] for p in d["gitlab"]["projects"]}
        return [{"project": names[f["project_id"]], "path": f["path"]} for f in d["gitlab"]["files"]]

    @staticmethod
    def build(inst, d):
        pid = _proj(d, inst["project"])["id"]
        f = next(f for f in d["gitlab"]["files"] if f["project_id"] == pid and f["path"] == inst["path"])
        return {"start_url": "__GITLAB__", "eval": ev_string(str(f["lines"]))}

    @staticmethod
    def oracle(inst, page):
        if page.path.endswith(f"/-/blob/main/{inst['path']}") and f"/{inst['project']}/" in page.path:
            n = page.text().split(" lines")[0].split()[-1]
            return finish(n, f"The file has {n} lines")
        return _to_project(page, inst["project"]) or click_link(page, inst["path"])


# --------------------------------------------------------------------------- map

def _place(d, name):
    return next(p for p in d["map"]["places"] if p["name"] == name)


def _to_place(page: PageView, place: str) -> str | None:
    h1 = [e for e in parse_observation_elements(page.html) if e.tag == "h1"]
    if page.path.startswith("/place/") and h1 and h1[0].text == place:
        return None
    return search_then_click(page, place, "Search places", place)


@family("map.place_address", "map", ["What is the address of {place}?", "Where is {place} located? Give the address."],
        7)
class _:
    instances = staticmethod(lambda d: [{"place": p["name"]} for p in d["map"]["places"]])

    @staticmethod
    def build(inst, d):
        return {"start_url": "__MAP__", "eval": ev_string(_place(d, inst["place"])["address"].split(",")[0])}

    @staticmethod
    def oracle(inst, page):
        nxt = _to_place(page, inst["place"])
        if nxt:
            return nxt
        t = page.text()
        addr = t.split("Address ")[1].split(" Opening hours")[0] if "Address " in t else "unknown"
        return finish(addr, "Read from the place page")


@family("map.place_nav", "map", ["Show me {place} on the map.", "Open the page of {place}."], 5)
class _:
    instances = staticmethod(lambda d: [{"place": p["name"]} for p in d["map"]["places"]])

    @staticmethod
    def build(inst, d):
        return {"start_url": "__MAP__", "eval": ev_url(f"__MAP__/place/{_place(d, inst['place'])['id']}")}

    @staticmethod
    def oracle(inst, page):
        return _to_place(page, inst["place"]) or finish("Done", f"This is {inst['place']}")


@family("map.place_hours", "map", ["What are the opening hours of {place}?", "When is {place} open?"], 5)
class _:
    instances = staticmethod(lambda d: [{"place": p["name"]} for p in d["map"]["places"]])

    @staticmethod
    def build(inst, d):
        return {"start_url": "__MAP__", "eval": ev_string(_place(d, inst["place"])["hours"], "exact_match")}

    @staticmethod
    def oracle(inst, page):
        nxt = _to_place(page, inst["place"])
        if nxt:
            return nxt
        t = page.text()
        hours = t.split("Opening hours ")[1].split(" Phone")[0] if "Opening hours " in t else "unknown"
        return finish(hours, "Read from the place page")


MODE_WORDS = {"car": ("drive", "Car"), "bike": ("cycle", "Bicycle"), "foot": ("walk", "Foot")}


def _pairs(d):
    ps = d["map"]["places"]
    return [(ps[i]["name"], ps[(i * 7 + 3) % len(ps)]["name"]) for i in range(len(ps)) if i != (i * 7 + 3) % len(ps)]


def _directions_oracle(inst, page: PageView, answer_of) -> str:
    mode_label = MODE_WORDS[inst["mode"]][1]
    if page.path != "/directions":
        return click_link(page, "Directions")
    src, dst = field(page, "From"), field(page, "To")
    if src is None or dst is None:
        return scroll_or_fail(page, "no direction fields")
    if src.attrs.get("value", "") != inst["a"]:
        return do("Type", src, inst["a"], "From")
    if dst.attrs.get("value", "") != inst["b"]:
        return do("Type", dst, inst["b"], "To")
    sel = select_with(page, mode_label)
    if sel is not None and selected_text(sel) != mode_label:
        return do("Select Dropdown Option", sel, mode_label, "Mode")
    t = page.text()
    if f"{inst['a']} to {inst['b']} by {mode_label}" not in t:
        return do("Click", button(page, "Get Directions"))
    return finish(answer_of(t), "Read from the route summary")


@family("map.distance", "map", ["How far is it from {a} to {b} by {mode}?",
                                "What is the {mode} distance between {a} and {b}?"], 6)
class _:
    instances = staticmethod(lambda d: [{"a": a, "b": b, "mode": m} for a, b in _pairs(d) for m in ("car", "bike")])

    @staticmethod
    def build(inst, d):
        km, _ = route(_place(d, inst["a"]), _place(d, inst["b"]), inst["mode"])
        return {"start_url": "__MAP__", "eval": ev_string(f"{km} km")}

    @staticmethod
    def oracle(inst, page):
        return _directions_oracle(inst, page, lambda t: t.split("Distance: ")[1].split(" |")[0])


@family("map.travel_time", "map", ["How long does it take to {verb} from {a} to {b}?",
                                   "How many minutes do I need to {verb} from {a} to {b}?"], 6)
class _:
    instances = staticmethod(lambda d: [{"a": a, "b": b, "mode": m, "verb": MODE_WORDS[m][0]} for a, b in _pairs(d)
                                        for m in ("car", "bike", "foot")])

    @staticmethod
    def build(inst, d):
        _, minutes = route(_place(d, inst["a"]), _place(d, inst["b"]), inst["mode"])
        return {"start_url": "__MAP__", "eval": ev_string(f"{minutes} min")}

    @staticmethod
    def oracle(inst, page):
        return _directions_oracle(inst, page, lambda t: t.split("Time: ")[1].split()[0] + " min")

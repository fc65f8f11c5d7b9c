"""Task families of the embedded sites: parameterised WebArena-Lite tasks with verifiable evaluators and oracles.

A family is a named class (as BrowserGym makes each task a class) that owns its setup, its validation and its
solution; ``@register`` puts one instance of it in ``FAMILIES``:

  - setup: ``site``, ``start_url``, intent ``templates`` (``str.format(**inst)``) and ``instances(data)``, every
    instantiation (a JSON-able dict) the seeded data supports, in a fixed order;
  - validation: ``evaluator(inst, data)``, the task config's ``eval`` in the official WebArena format
    (``string_match`` / ``url_match`` / ``program_html``, scored by ``evaluation_harness/evaluators.py``),
    computed from the same seeded rows the site serves, so the reference answer is right by construction;
    ``build(inst, data)`` gives ``start_url`` + ``eval`` together;
  - solution: ``oracle(inst, page)``, the next action of a scripted expert, decided from the CURRENT page only
    (its URL and its simplified-HTML observation), so it recovers from any state and its responses are valid
    demonstrations in the agent's grammar (``# Element: ...`` then ``do(...)``/``exit(...)``).

Registry order (definition order) fixes the held-out test set and ``intent_template_id`` (see ``tasks``).

Split rule: the instantiations of a family are ordered by a stable hash; the first ``test_quota`` are the
held-out test pool, the rest the training pool (so test and training instantiations are disjoint).
"""

from __future__ import annotations

import hashlib
import json
from abc import ABC, abstractmethod
from dataclasses import dataclass
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

class Family(ABC):
    """A task family: its site and phrasings, its instantiations, its evaluator and its scripted expert."""

    name: str                                  # "<site>.<what>": the ``family`` field of its tasks
    site: str
    start_url: str                             # the site's URL placeholder: every task starts on its home page
    templates: list[str]                       # intent phrasings; str.format(**inst); "<group>|..." with template_key
    test_quota: int                            # how many of its instantiations are held out for the test set
    template_key: str | None = None            # inst key that selects the phrasing group (see ``phrasings``)

    @abstractmethod
    def instances(self, d: dict) -> list[dict]:
        """Every instantiation the seeded data ``d`` (``data.site_data``) supports, in a fixed order."""

    @abstractmethod
    def evaluator(self, inst: dict, d: dict) -> dict:
        """The ``eval`` config (WebArena format) that scores a task of this instantiation."""

    @abstractmethod
    def oracle(self, inst: dict, page: PageView) -> str:
        """The scripted expert's next response on ``page``."""

    def build(self, inst: dict, d: dict) -> dict:
        """The task config's ``start_url`` and ``eval`` for one instantiation."""
        return {"start_url": self.start_url, "eval": self.evaluator(inst, d)}

    def phrasings(self, inst: dict) -> list[str]:
        if self.template_key is None:
            return self.templates
        return [t.split("|", 1)[1] for t in self.templates if t.split("|", 1)[0] == str(inst[self.template_key])]


FAMILIES: dict[str, Family] = {}
"""family name -> the family; in definition order, which fixes the test set and ``intent_template_id``."""


def register(cls: type[Family]) -> type[Family]:
    """Class decorator: add an instance of the family class to ``FAMILIES``."""
    if cls.name in FAMILIES:
        raise ValueError(f"task family {cls.name!r} is defined twice")
    FAMILIES[cls.name] = cls()
    return cls


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


class ShoppingFamily(Family):
    """A family of the shopping site; its tasks start on the home page."""

    site, start_url = "shopping", "__SHOPPING__"


def _shop_to_product(page: PageView, product: str) -> str | None:
    """None when already on the product's page, else the next action to get there."""
    h1 = [e for e in parse_observation_elements(page.html) if e.tag == "h1"]
    if page.path.startswith("/product/") and h1 and h1[0].text == product:
        return None
    return search_then_click(page, product, SHOP_SEARCH, product)


@register
class ShoppingProductPrice(ShoppingFamily):
    """Ask for a product's price; read it from the product page (string_match)."""

    name = "shopping.product_price"
    templates = ["What is the price of {product}?", "How much does the {product} cost?",
                 "Tell me the price of the {product}."]
    test_quota = 9

    def instances(self, d):
        return [{"product": p["name"]} for p in _enabled(d)]

    def evaluator(self, inst, d):
        return ev_string(f"{_prod_by_name(d, inst['product'])['price']:.2f}")

    def oracle(self, inst, page):
        nxt = _shop_to_product(page, inst["product"])
        if nxt:
            return nxt
        price = next((e.text for e in parse_observation_elements(page.html) if e.text.startswith("$")), "")
        return finish(price.split()[0] if price else "unknown", f"The product page shows the price {price}")


@register
class ShoppingReviewCount(ShoppingFamily):
    """Ask how many reviews a product has; count them on the product page (string_match)."""

    name = "shopping.review_count"
    templates = ["How many reviews does {product} have?",
                 "Count the customer reviews of the {product}."]
    test_quota = 8

    def instances(self, d):
        return [{"product": p["name"]} for p in _enabled(d)]

    def evaluator(self, inst, d):
        pid = _prod_by_name(d, inst["product"])["id"]
        n = sum(1 for r in d["shopping"]["reviews"] if r["product_id"] == pid)
        return ev_string(str(n))

    def oracle(self, inst, page):
        nxt = _shop_to_product(page, inst["product"])
        if nxt:
            return nxt
        t = page.text()
        n = t.split(" reviews")[0].split()[-1] if " reviews" in t else "0"
        return finish(n, f"The page says {n} reviews")


@register
class ShoppingCategoryNav(ShoppingFamily):
    """Open a category, or its second page (url_match)."""

    name = "shopping.category_nav"
    templates = ["1|Open the {category} category.", "1|Show me the products in the {category} category.",
                 "2|Go to page 2 of the {category} category.", "2|Show me the second page of the {category} category."]
    test_quota = 5
    template_key = "page"

    def instances(self, d):
        return [{"category": c["name"], "page": pg} for c in d["shopping"]["categories"]
                for pg in (1, 2)]

    def evaluator(self, inst, d):
        slug = next(c["slug"] for c in d["shopping"]["categories"] if c["name"] == inst["category"])
        url = f"__SHOPPING__/category/{slug}" + ("?page=2" if inst["page"] == 2 else "")
        return ev_url(url)

    def oracle(self, inst, page):
        on_cat = page.path.startswith("/category/") and inst["category"] in page.text()
        if not on_cat:
            home = link(page, "One Stop Market")
            cat = link(page, inst["category"])
            return do("Click", cat) if cat else (do("Click", home) if home else scroll_or_fail(page, "no category"))
        if inst["page"] == 2 and page.query.get("page") != "2":
            return click_link(page, "Next")
        return finish("Done", f"This is the {inst['category']} category" + (", page 2" if inst["page"] == 2 else ""))


@register
class ShoppingAddToCart(ShoppingFamily):
    """Put a product in the cart (program_html on the cart page)."""

    name = "shopping.add_to_cart"
    templates = ["Add {product} to my shopping cart.", "Put the {product} in my cart."]
    test_quota = 8

    def instances(self, d):
        return [{"product": p["name"]} for p in _enabled(d)]

    def evaluator(self, inst, d):
        return ev_html(
            ("__SHOPPING__/cart", "document.querySelector('#cart').outerText", {"must_include": [inst["product"]]}))

    def oracle(self, inst, page):
        nxt = _shop_to_product(page, inst["product"])
        if nxt:
            return nxt
        if "You added" in page.html:
            return finish("Done", f"{inst['product']} is in the cart")
        b = button(page, "Add to Cart")
        return do("Click", b) if b else scroll_or_fail(page, "no Add to Cart button")


@register
class ShoppingOrderStatus(ShoppingFamily):
    """Ask the status of one of the customer's orders (string_match)."""

    name = "shopping.order_status"
    templates = ["What is the status of my order #{number}?",
                 "Check the status of order number {number}."]
    test_quota = 7

    def instances(self, d):
        return [{"number": o["number"]} for o in d["shopping"]["orders"]]

    def evaluator(self, inst, d):
        o = next(o for o in d["shopping"]["orders"] if o["number"] == inst["number"])
        return ev_string(o["status"])

    def oracle(self, inst, page):
        if page.path == f"/order/{inst['number']}":
            status = page.text().split("Status: ")[1].split(" |")[0].strip() if "Status: " in page.text() else ""
            return finish(status, f"Order {inst['number']} is {status}")
        if page.path == "/orders":
            el = row_link(page, inst["number"], "View Order")
            return do("Click", el, what=f"View Order {inst['number']}") if el else click_link(page, "Next")
        return click_link(page, "My Orders")


@register
class ShoppingCheckout(ShoppingFamily):
    """Buy a product with flat-rate or express shipping (program_html on the new order page)."""

    name = "shopping.checkout"
    templates = ["1|Buy {product} with flat rate shipping.",
                 "1|Order the {product} using the flat rate shipping.",
                 "2|Buy {product} with express shipping.",
                 "2|Order the {product} using express shipping."]
    test_quota = 9
    template_key = "express"

    def instances(self, d):
        return [{"product": p["name"], "express": e} for p in _enabled(d) for e in (1, 2)]

    def evaluator(self, inst, d):
        p = _prod_by_name(d, inst["product"])
        total = f"{p['price'] + (15.0 if inst['express'] == 2 else 5.0):.2f}"
        return ev_html(
            ("last", "document.querySelector('#items').outerText", {"must_include": [inst["product"]]}),
            ("last", "document.querySelector('h1').outerText + ' ' + document.querySelector('#order-total').outerText",
             {"must_include": ["Order #", total]}))

    def oracle(self, inst, page):
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


# --------------------------------------------------------------------------- reddit

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


# --------------------------------------------------------------------------- gitlab

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


# --------------------------------------------------------------------------- map

class MapFamily(Family):
    """A family of the map; its tasks start on the home page."""

    site, start_url = "map", "__MAP__"


def _place(d, name):
    return next(p for p in d["map"]["places"] if p["name"] == name)


def _to_place(page: PageView, place: str) -> str | None:
    h1 = [e for e in parse_observation_elements(page.html) if e.tag == "h1"]
    if page.path.startswith("/place/") and h1 and h1[0].text == place:
        return None
    return search_then_click(page, place, "Search places", place)


@register
class MapPlaceAddress(MapFamily):
    """Ask a place's address; read it from the place page (string_match)."""

    name = "map.place_address"
    templates = ["What is the address of {place}?", "Where is {place} located? Give the address."]
    test_quota = 7

    def instances(self, d):
        return [{"place": p["name"]} for p in d["map"]["places"]]

    def evaluator(self, inst, d):
        return ev_string(_place(d, inst["place"])["address"].split(",")[0])

    def oracle(self, inst, page):
        nxt = _to_place(page, inst["place"])
        if nxt:
            return nxt
        t = page.text()
        addr = t.split("Address ")[1].split(" Opening hours")[0] if "Address " in t else "unknown"
        return finish(addr, "Read from the place page")


@register
class MapPlaceNav(MapFamily):
    """Open a place's page (url_match)."""

    name = "map.place_nav"
    templates = ["Show me {place} on the map.", "Open the page of {place}."]
    test_quota = 5

    def instances(self, d):
        return [{"place": p["name"]} for p in d["map"]["places"]]

    def evaluator(self, inst, d):
        return ev_url(f"__MAP__/place/{_place(d, inst['place'])['id']}")

    def oracle(self, inst, page):
        return _to_place(page, inst["place"]) or finish("Done", f"This is {inst['place']}")


@register
class MapPlaceHours(MapFamily):
    """Ask a place's opening hours; read them from the place page (string_match, exact)."""

    name = "map.place_hours"
    templates = ["What are the opening hours of {place}?", "When is {place} open?"]
    test_quota = 5

    def instances(self, d):
        return [{"place": p["name"]} for p in d["map"]["places"]]

    def evaluator(self, inst, d):
        return ev_string(_place(d, inst["place"])["hours"], "exact_match")

    def oracle(self, inst, page):
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


@register
class MapDistance(MapFamily):
    """Ask the distance between two places by car or bicycle; read it from the directions (string_match)."""

    name = "map.distance"
    templates = ["How far is it from {a} to {b} by {mode}?",
                 "What is the {mode} distance between {a} and {b}?"]
    test_quota = 6

    def instances(self, d):
        return [{"a": a, "b": b, "mode": m} for a, b in _pairs(d) for m in ("car", "bike")]

    def evaluator(self, inst, d):
        km, _ = route(_place(d, inst["a"]), _place(d, inst["b"]), inst["mode"])
        return ev_string(f"{km} km")

    def oracle(self, inst, page):
        return _directions_oracle(inst, page, lambda t: t.split("Distance: ")[1].split(" |")[0])


@register
class MapTravelTime(MapFamily):
    """Ask the travel time between two places by car, bicycle or foot; read it from the directions (string_match)."""

    name = "map.travel_time"
    templates = ["How long does it take to {verb} from {a} to {b}?",
                 "How many minutes do I need to {verb} from {a} to {b}?"]
    test_quota = 6

    def instances(self, d):
        return [{"a": a, "b": b, "mode": m, "verb": MODE_WORDS[m][0]} for a, b in _pairs(d)
                for m in ("car", "bike", "foot")]

    def evaluator(self, inst, d):
        _, minutes = route(_place(d, inst["a"]), _place(d, inst["b"]), inst["mode"])
        return ev_string(f"{minutes} min")

    def oracle(self, inst, page):
        return _directions_oracle(inst, page, lambda t: t.split("Time: ")[1].split()[0] + " min")

"""Task families of the online store (OneStopShop-like): one class per family, registered in definition order."""

from __future__ import annotations

from webrl_core.env.observation import parse_observation_elements
from webrl_core.sites.families.base import (button, click_link, do, ev_html, ev_string, ev_url, Family, finish, link,
                                            PageView, register, row_link, scroll_or_fail, search_then_click,
                                            select_with, selected_text)


def _prod_by_name(data, name):
    return next(p for p in data["shopping"]["products"] if p["name"] == name)


def _enabled(data):
    return [p for p in data["shopping"]["products"] if p["status"] == "Enabled"]


SHOP_SEARCH = "Search entire store here..."



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

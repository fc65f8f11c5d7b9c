"""Task families of the map (OpenStreetMap-like): one class per family, registered in definition order."""

from __future__ import annotations

from webrl_core.env.observation import parse_observation_elements
from webrl_core.sites.data import route
from webrl_core.sites.families.base import (button, click_link, do, ev_string, ev_url, Family, field, finish,
                                            PageView, register, scroll_or_fail, search_then_click, select_with,
                                            selected_text)


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

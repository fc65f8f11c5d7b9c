"""Deterministic seeded data of the five embedded sites (no downloads: small word lists + ``random.Random``).

``site_data(seed)`` returns {site: {table: [row dicts]}}; the same seed always gives the same rows,
so task generators (which read these rows to fill intents and reference answers) and the running
sites (which load them into SQLite templates via ``write_template``) agree.
"""

from __future__ import annotations

import math
import random
import sqlite3
from functools import lru_cache
from pathlib import Path

FIRST = ["Emma", "Liam", "Olivia", "Noah", "Ava", "Ethan", "Sophia", "Mason", "Isabella", "Lucas", "Mia", "Logan",
         "Amelia", "Jacob", "Harper", "Aiden", "Ella", "Carter", "Grace", "Owen", "Chloe", "Wyatt", "Nora", "Caleb",
         "Lily", "Hannah", "Julian", "Zoe", "Leo", "Ruby", "Adam", "Clara", "Victor", "Alice", "Samuel", "Ivy"]
LAST = ["Lopez", "Smith", "Nguyen", "Garcia", "Brown", "Patel", "Kim", "Miller", "Davis", "Wilson", "Moore", "Clark",
        "Young", "Hall", "Allen", "Wright", "Scott", "Green", "Baker", "Adams", "Nelson", "Hill", "Campbell", "Reed",
        "Cook", "Morgan", "Bell", "Murphy", "Rivera", "Cooper", "Ward", "Torres", "Gray", "Hughes", "Price", "Long"]
CITIES = ["Pittsburgh", "Boston", "Austin", "Denver", "Seattle", "Portland", "Chicago", "Atlanta", "Phoenix", "Miami"]
BRANDS = ["Nordhaven", "Luma", "Brightwell", "Oakridge", "Vantix", "Solace", "Kestrel", "Meridian", "Pinecrest",
          "Aurora", "Bluefin", "Cobalt", "Driftwood", "Everly", "Fjord", "Granite", "Harbor", "Juniper"]
CATEGORIES = {  # slug: (name, nouns, adjectives, price range)
    "electronics": ("Electronics", ["Headphones", "Speaker", "Charger", "Webcam", "Keyboard", "Mouse", "Monitor"],
                    ["Wireless", "Compact", "Pro", "Smart", "Portable", "Ultra"], (15, 400)),
    "home-kitchen": ("Home & Kitchen", ["Kettle", "Blender", "Toaster", "Pan", "Knife Set", "Mug", "Lamp"],
                     ["Ceramic", "Steel", "Classic", "Electric", "Nonstick", "Modern"], (8, 180)),
    "beauty": ("Beauty", ["Face Cream", "Shampoo", "Lip Balm", "Serum", "Body Lotion", "Sunscreen"],
               ["Hydrating", "Organic", "Gentle", "Daily", "Herbal", "Matte"], (5, 90)),
    "sports": ("Sports & Outdoors", ["Yoga Mat", "Water Bottle", "Tent", "Backpack", "Dumbbell", "Jump Rope"],
               ["Lightweight", "Trail", "Foldable", "Insulated", "Heavy Duty", "Grip"], (7, 250)),
    "toys": ("Toys & Games", ["Puzzle", "Board Game", "Building Set", "Plush Bear", "Kite", "Race Car"],
             ["Wooden", "Deluxe", "Mini", "Family", "Junior", "Glow"], (6, 120)),
    "grocery": ("Grocery", ["Coffee Beans", "Green Tea", "Honey", "Olive Oil", "Granola", "Dark Chocolate"],
                ["Roasted", "Raw", "Premium", "Fair Trade", "Spiced", "Extra Virgin"], (3, 45)),
    "office": ("Office Products", ["Notebook", "Pen Set", "Desk Organizer", "Stapler", "Planner", "Marker Pack"],
               ["Recycled", "Ergonomic", "Gel", "Weekly", "Magnetic", "Bold"], (2, 60)),
    "clothing": ("Clothing", ["T-Shirt", "Hoodie", "Rain Jacket", "Socks", "Beanie", "Running Shorts"],
                 ["Cotton", "Fleece", "Breathable", "Wool", "Slim", "Relaxed"], (9, 150)),
}
REVIEW_TITLES = ["Great value", "Works as described", "Not bad", "Love it", "Disappointed", "Would buy again",
                 "Solid quality", "Too small", "Exceeded expectations", "Okay for the price"]
REVIEW_BODIES = ["Arrived quickly and works well.", "The quality is better than I expected.",
                 "It broke after two weeks.", "Exactly what I needed for daily use.", "A bit pricey but worth it.",
                 "Packaging was damaged but the item was fine.", "My family uses it every day."]
ORDER_STATUSES = ["Pending", "Processing", "Shipped", "Complete", "Canceled"]
MONTHS = ["2023-01", "2023-02", "2023-03", "2023-04", "2023-05", "2023-06"]
MONTH_NAMES = {"2023-01": "January 2023", "2023-02": "February 2023", "2023-03": "March 2023",
               "2023-04": "April 2023", "2023-05": "May 2023", "2023-06": "June 2023"}

FORUMS = {  # name: (title, topic words)
    "books": ("Books", ["novel", "author", "library", "series", "poetry"]),
    "movies": ("Movies", ["sequel", "director", "trailer", "soundtrack", "casting"]),
    "gaming": ("Gaming", ["console", "speedrun", "indie game", "controller", "patch"]),
    "cooking": ("Cooking", ["sourdough", "cast iron", "spice rack", "meal prep", "soup"]),
    "science": ("Science", ["telescope", "fossil", "vaccine", "black hole", "enzyme"]),
    "technology": ("Technology", ["laptop", "open source", "password manager", "router", "smartwatch"]),
    "travel": ("Travel", ["backpacking", "train pass", "layover", "hostel", "road trip"]),
    "fitness": ("Fitness", ["marathon", "squat form", "rest day", "protein", "stretching"]),
    "music": ("Music", ["vinyl", "guitar", "playlist", "concert", "album"]),
    "pittsburgh": ("Pittsburgh", ["incline", "bridge", "pierogi", "bus route", "riverfront"]),
    "gardening": ("Gardening", ["tomatoes", "compost", "seedlings", "raised bed", "pruning"]),
    "photography": ("Photography", ["prime lens", "golden hour", "tripod", "film camera", "editing"]),
}
POST_PATTERNS = ["What is your favorite {t}?", "Tips for a beginner {t}", "Is this {t} worth it?",
                 "My first {t} experience", "Unpopular opinion about {t}", "Help choosing a {t}",
                 "The best {t} I found this year", "Why does everyone love {t}?", "Thoughts on the new {t}",
                 "How I fixed my {t} problem", "Looking for {t} recommendations", "A short story about {t}"]
COMMENTS = ["Totally agree with this.", "I had the same experience.", "Thanks for sharing!", "Interesting take.",
            "Can you post an update later?", "This is the way.", "I disagree, but good post.", "Saved for later."]
FORUM_USERS = ["MarvelsGrantMan136", "quietriver", "pixel_pusher", "trailmix42", "nightowl_dev", "bookworm88",
               "sunny_side", "gearhead", "mapleleaf", "coffee_addict", "astro_kid", "greenthumb", "lenscap",
               "tunesmith", "runner_bean"]

GL_USERS = ["byteblaze", "abisubramanya27", "yjlou", "koush", "vinta", "primer", "jlee", "mchen", "asmith", "dkumar",
            "rsato", "tnguyen", "lgarcia", "pwilson"]
GL_WORDS = ["dotfiles", "api-gateway", "chat-server", "css-grid", "data-pipeline", "design-system", "docs-site",
            "edge-proxy", "feature-flags", "form-builder", "graph-viz", "image-resizer", "job-queue", "log-parser",
            "markdown-kit", "metrics-exporter", "mobile-app", "note-taker", "pdf-tools", "rate-limiter",
            "search-index", "static-blog", "task-runner", "theme-switcher", "weather-bot", "web-scraper"]
GL_ISSUE_PATTERNS = ["Fix crash when {x}", "Add support for {x}", "Improve docs for {x}", "Refactor {x}",
                     "Tests fail on {x}", "Slow performance in {x}", "Typo in {x}", "Deprecate old {x}"]
GL_THINGS = ["config loading", "dark mode", "unicode input", "large files", "the CLI", "Windows paths", "caching",
             "the login page", "error messages", "pagination", "API tokens", "the README", "timezones",
             "retries", "logging", "plugins"]
GL_ROLES = ["Guest", "Reporter", "Developer", "Maintainer", "Owner"]
GL_LICENSES = ["MIT License", "Apache License 2.0", "GNU GPLv3", "BSD 3-Clause", "Mozilla Public License 2.0"]

PLACE_KINDS = {  # category: name suffixes
    "Cafe": ["Cafe", "Coffee House", "Espresso Bar"], "Restaurant": ["Bistro", "Grill", "Kitchen", "Diner"],
    "Library": ["Library"], "Museum": ["Museum", "Gallery"], "Park": ["Park", "Gardens"],
    "Hospital": ["Hospital", "Medical Center"], "Pharmacy": ["Pharmacy"], "Hotel": ["Hotel", "Inn"],
    "School": ["Elementary School", "High School"], "Supermarket": ["Market", "Grocery"],
    "Gas Station": ["Fuel Stop"], "Bank": ["Bank", "Credit Union"],
}
PLACE_WORDS = ["Blue Heron", "Maple", "Riverside", "Golden Gate", "Oak Hill", "Liberty", "Summit", "Cedar",
               "Harbor Light", "Ironworks", "Northside", "Juniper", "Red Door", "Silver Lake", "Stone Bridge",
               "Willow", "Carnegie", "Allegheny", "Mellon", "Schenley", "Highland", "Brighton", "Fairview", "Lakeside"]
DISTRICTS = ["Shadyside", "Oakland", "Squirrel Hill", "Lawrenceville", "Strip District", "Downtown", "South Side",
             "Bloomfield", "East Liberty", "North Shore"]
STREETS = ["Forbes Ave", "Fifth Ave", "Penn Ave", "Liberty Ave", "Butler St", "Murray Ave", "Walnut St",
           "Carson St", "Craig St", "Smallman St", "Ellsworth Ave", "Baum Blvd"]
SPEED_KMH = {"car": 30.0, "bike": 15.0, "foot": 5.0}  # city speeds used by the directions page
ROAD_FACTOR = 1.3  # road distance / straight-line distance


def route(a: dict, b: dict, mode: str) -> tuple[float, int]:
    """(road km rounded to 0.1, minutes) between two places: haversine x ROAD_FACTOR at SPEED_KMH[mode]."""
    la1, lo1, la2, lo2 = map(math.radians, (a["lat"], a["lon"], b["lat"], b["lon"]))
    h = math.sin((la2 - la1) / 2) ** 2 + math.cos(la1) * math.cos(la2) * math.sin((lo2 - lo1) / 2) ** 2
    km = round(2 * 6371.0 * math.asin(math.sqrt(h)) * ROAD_FACTOR, 1)
    return km, max(1, round(km / SPEED_KMH[mode] * 60))


def _name(rng: random.Random) -> str:
    return f"{rng.choice(FIRST)} {rng.choice(LAST)}"


def _catalogue(rng: random.Random) -> tuple[list[dict], list[dict]]:
    cats, products, seen = [], [], set()
    for ci, (slug, (cname, nouns, adjs, (lo, hi))) in enumerate(CATEGORIES.items(), start=1):
        cats.append({"id": ci, "slug": slug, "name": cname})
        made = 0
        while made < 36:
            name = f"{rng.choice(BRANDS)} {rng.choice(adjs)} {rng.choice(nouns)}"
            if name in seen:
                continue
            seen.add(name)
            made += 1
            pid = len(products) + 1
            products.append({"id": pid, "sku": f"SKU-{1000 + pid}", "name": name, "category_id": ci,
                             "price": round(rng.uniform(lo, hi), 2) // 1 + 0.99, "stock": rng.randint(0, 250),
                             "description": f"The {name} by {name.split()[0]}, a favourite in {cname}.",
                             "status": "Enabled" if rng.random() > 0.08 else "Disabled"})
    return cats, products


def _shopping(seed: int) -> dict:
    rng = random.Random(f"shopping-{seed}")
    cats, products = _catalogue(random.Random(f"catalogue-{seed}"))
    reviews = []
    for p in products:
        n = rng.choice([0, 1, 2, 3, 4, 5, 6, 8, 12])
        for _ in range(n):
            reviews.append({"id": len(reviews) + 1, "product_id": p["id"], "author": _name(rng),
                            "rating": rng.choice([1, 2, 3, 4, 4, 5, 5, 5]), "title": rng.choice(REVIEW_TITLES),
                            "body": rng.choice(REVIEW_BODIES)})
    orders, items = [], []
    for i in range(24):
        number = f"{170 + i * 7:09d}"
        chosen = rng.sample(products, rng.randint(1, 3))
        lines = [(p, rng.randint(1, 3)) for p in chosen]
        total = round(sum(p["price"] * q for p, q in lines) + 5.0, 2)
        orders.append({"id": i + 1, "number": number, "date": f"2023-{1 + i % 6:02d}-{3 + (i * 5) % 25:02d}",
                       "status": rng.choice(ORDER_STATUSES), "total": total})
        for p, q in lines:
            items.append({"order_id": i + 1, "product_id": p["id"], "qty": q, "price": p["price"]})
    return {"categories": cats, "products": products, "reviews": reviews, "orders": orders, "order_items": items,
            "cart": []}


def _shopping_admin(seed: int) -> dict:
    rng = random.Random(f"admin-{seed}")
    cats, products = _catalogue(random.Random(f"catalogue-{seed}"))
    customers, seen = [], set()
    while len(customers) < 120:
        name = _name(rng)
        if name in seen:
            continue
        seen.add(name)
        email = name.lower().replace(" ", ".") + "@example.com"
        customers.append({"id": len(customers) + 1, "name": name, "email": email, "city": rng.choice(CITIES),
                          "grp": rng.choice(["General", "Wholesale", "VIP"])})
    orders, items = [], []
    for i in range(300):
        c = rng.choice(customers)
        lines = [(p, rng.randint(1, 4)) for p in rng.sample(products, rng.randint(1, 3))]
        month = MONTHS[i % len(MONTHS)]
        orders.append({"id": i + 1, "number": f"{1000 + i:06d}", "customer_id": c["id"],
                       "date": f"{month}-{1 + (i * 7) % 28:02d}", "status": rng.choice(ORDER_STATUSES),
                       "total": round(sum(p["price"] * q for p, q in lines), 2)})
        for p, q in lines:
            items.append({"order_id": i + 1, "product_id": p["id"], "qty": q, "price": p["price"]})
    return {"categories": cats, "products": products, "customers": customers, "orders": orders,
            "order_items": items}


def _reddit(seed: int) -> dict:
    rng = random.Random(f"reddit-{seed}")
    forums = [{"name": n, "title": t, "description": f"Everything about {t.lower()}."} for n, (t, _) in FORUMS.items()]
    posts, comments, seen = [], [], set()
    for f, (_, topics) in FORUMS.items():
        made = 0
        while made < 24:
            title = rng.choice(POST_PATTERNS).format(t=rng.choice(topics))
            if title in seen:
                continue
            seen.add(title)
            made += 1
            pid = len(posts) + 1
            posts.append({"id": pid, "forum": f, "title": title, "author": rng.choice(FORUM_USERS[1:]),
                          "body": f"I have been thinking about {title.lower().rstrip('?.')} lately. What do you think?",
                          "created": f"2023-{1 + pid % 12:02d}-{1 + pid % 28:02d}", "score": rng.randint(-3, 180)})
            for _ in range(rng.randint(0, 5)):
                comments.append({"id": len(comments) + 1, "post_id": pid, "author": rng.choice(FORUM_USERS),
                                 "body": rng.choice(COMMENTS)})
    return {"forums": forums, "posts": posts, "comments": comments, "votes": []}


def _gitlab(seed: int) -> dict:
    rng = random.Random(f"gitlab-{seed}")
    projects, members, issues, mrs, files = [], [], [], [], []
    for i, name in enumerate(GL_WORDS, start=1):
        owner = "byteblaze" if i % 3 else rng.choice(GL_USERS[1:])
        projects.append({"id": i, "namespace": owner, "name": name, "stars": rng.randint(0, 900),
                         "description": f"A small {name.replace('-', ' ')} project.",
                         "license": rng.choice(GL_LICENSES)})
        team = [owner] + rng.sample([u for u in GL_USERS if u != owner], rng.randint(2, 5))
        if "byteblaze" not in team:
            team.append("byteblaze")
        for j, u in enumerate(team):
            members.append({"project_id": i, "username": u, "role": "Owner" if j == 0 else rng.choice(GL_ROLES[:4])})
        seen = set()
        for iid in range(1, rng.randint(6, 16)):
            t = rng.choice(GL_ISSUE_PATTERNS).format(x=rng.choice(GL_THINGS))
            if t in seen:
                continue
            seen.add(t)
            issues.append({"id": len(issues) + 1, "project_id": i, "iid": iid, "title": t, "author": rng.choice(team),
                           "state": "opened" if rng.random() < 0.65 else "closed",
                           "labels": rng.choice(["bug", "feature", "docs", "question"])})
        for iid in range(1, rng.randint(3, 9)):
            t = rng.choice(["Update", "Add", "Remove", "Fix"]) + " " + rng.choice(GL_THINGS)
            mrs.append({"id": len(mrs) + 1, "project_id": i, "iid": iid, "title": t, "author": rng.choice(team),
                        "state": rng.choice(["opened", "opened", "merged", "closed"]),
                        "source": f"{t.split()[0].lower()}-{iid}", "target": "main"})
        for path, n in [("README.md", rng.randint(8, 60)), ("LICENSE", rng.randint(15, 30)),
                        ("setup.cfg", rng.randint(5, 25)), (f"src/{name.replace('-', '_')}.py", rng.randint(20, 400))]:
            body = "\n".join(f"line {k + 1} of {path}" for k in range(min(n, 12)))
            files.append({"project_id": i, "path": path, "lines": n, "content": body})
    return {"users": [{"username": u, "name": u.replace("_", " ").title()} for u in GL_USERS],
            "projects": projects, "members": members, "issues": issues, "merge_requests": mrs, "files": files}


def _map(seed: int) -> dict:
    rng = random.Random(f"map-{seed}")
    places, seen = [], set()
    while len(places) < 200:
        cat = rng.choice(list(PLACE_KINDS))
        name = f"{rng.choice(PLACE_WORDS)} {rng.choice(PLACE_KINDS[cat])}"
        if name in seen:
            continue
        seen.add(name)
        d = rng.randrange(len(DISTRICTS))
        places.append({"id": len(places) + 1, "name": name, "category": cat, "district": DISTRICTS[d],
                       "address": f"{rng.randint(10, 4999)} {rng.choice(STREETS)}, {DISTRICTS[d]}, Pittsburgh, PA",
                       "lat": round(40.40 + 0.012 * d + rng.uniform(0, 0.03), 5),
                       "lon": round(-80.02 + 0.011 * d + rng.uniform(0, 0.03), 5),
                       "hours": rng.choice(["7am-7pm", "8am-10pm", "9am-5pm", "10am-6pm", "Open 24 hours", "6am-2pm"]),
                       "phone": f"(412) {rng.randint(200, 999)}-{rng.randint(1000, 9999)}"})
    return {"places": places}


@lru_cache(maxsize=4)
def site_data(seed: int = 0) -> dict[str, dict[str, list[dict]]]:
    """All seeded rows, per site and table."""
    return {"shopping": _shopping(seed), "shopping_admin": _shopping_admin(seed), "reddit": _reddit(seed),
            "gitlab": _gitlab(seed), "map": _map(seed)}


NAMED_FIELDS = {  # (site, table): the columns that name a thing a task's intent refers to
    ("shopping", "products"): ("name",), ("shopping", "orders"): ("number",),
    ("shopping_admin", "products"): ("name",), ("shopping_admin", "customers"): ("name",),
    ("shopping_admin", "orders"): ("number",),
    ("reddit", "forums"): ("name",), ("reddit", "posts"): ("title",),
    ("gitlab", "users"): ("username", "name"), ("gitlab", "projects"): ("name",),
    ("gitlab", "issues"): ("title",), ("gitlab", "merge_requests"): ("title",),
    ("map", "places"): ("name",),
}


def entity_kinds(seed: int = 0) -> dict[str, str]:
    """name -> kind ("site.table.column") of every named thing of the sites (products, orders, customers, forums,
    posts, users, projects, issues, merge requests, places): what intents name and actions type. A name of several
    kinds keeps the first."""
    data = site_data(seed)
    kinds: dict[str, str] = {}
    for (site, table), cols in NAMED_FIELDS.items():
        for col in cols:
            for row in data[site][table]:
                if row.get(col):
                    kinds.setdefault(str(row[col]), f"{site}.{table}.{col}")
    return kinds


def entity_names(seed: int = 0) -> list[str]:
    """The sites' entity names (``entity_kinds``), sorted."""
    return sorted(entity_kinds(seed))


SCHEMAS = {
    "shopping": """
      CREATE TABLE categories(id INTEGER PRIMARY KEY, slug TEXT, name TEXT);
      CREATE TABLE products(id INTEGER PRIMARY KEY, sku TEXT, name TEXT, category_id INT, price REAL, stock INT,
                            description TEXT, status TEXT);
      CREATE TABLE reviews(id INTEGER PRIMARY KEY, product_id INT, author TEXT, rating INT, title TEXT, body TEXT);
      CREATE TABLE orders(id INTEGER PRIMARY KEY, number TEXT, date TEXT, status TEXT, total REAL);
      CREATE TABLE order_items(order_id INT, product_id INT, qty INT, price REAL);
      CREATE TABLE cart(product_id INTEGER PRIMARY KEY, qty INT);""",
    "shopping_admin": """
      CREATE TABLE categories(id INTEGER PRIMARY KEY, slug TEXT, name TEXT);
      CREATE TABLE products(id INTEGER PRIMARY KEY, sku TEXT, name TEXT, category_id INT, price REAL, stock INT,
                            description TEXT, status TEXT);
      CREATE TABLE customers(id INTEGER PRIMARY KEY, name TEXT, email TEXT, city TEXT, grp TEXT);
      CREATE TABLE orders(id INTEGER PRIMARY KEY, number TEXT, customer_id INT, date TEXT, status TEXT, total REAL);
      CREATE TABLE order_items(order_id INT, product_id INT, qty INT, price REAL);""",
    "reddit": """
      CREATE TABLE forums(name TEXT PRIMARY KEY, title TEXT, description TEXT);
      CREATE TABLE posts(id INTEGER PRIMARY KEY, forum TEXT, title TEXT, author TEXT, body TEXT, created TEXT,
                         score INT);
      CREATE TABLE comments(id INTEGER PRIMARY KEY, post_id INT, author TEXT, body TEXT);
      CREATE TABLE votes(username TEXT, post_id INT, dir INT, PRIMARY KEY(username, post_id));""",
    "gitlab": """
      CREATE TABLE users(username TEXT PRIMARY KEY, name TEXT);
      CREATE TABLE projects(id INTEGER PRIMARY KEY, namespace TEXT, name TEXT, stars INT, description TEXT,
                            license TEXT);
      CREATE TABLE members(project_id INT, username TEXT, role TEXT, PRIMARY KEY(project_id, username));
      CREATE TABLE issues(id INTEGER PRIMARY KEY, project_id INT, iid INT, title TEXT, author TEXT, state TEXT,
                          labels TEXT);
      CREATE TABLE merge_requests(id INTEGER PRIMARY KEY, project_id INT, iid INT, title TEXT, author TEXT,
                                  state TEXT, source TEXT, target TEXT);
      CREATE TABLE files(project_id INT, path TEXT, lines INT, content TEXT);""",
    "map": """
      CREATE TABLE places(id INTEGER PRIMARY KEY, name TEXT, category TEXT, district TEXT, address TEXT,
                          lat REAL, lon REAL, hours TEXT, phone TEXT);""",
}


def write_template(site: str, seed: int, path: Path) -> Path:
    """Create the seeded SQLite template of one site at ``path``."""
    path = Path(path)
    path.unlink(missing_ok=True)
    con = sqlite3.connect(path)
    con.executescript(SCHEMAS[site])
    for table, rows in site_data(seed)[site].items():
        if rows:
            cols = list(rows[0])
            con.executemany(f"INSERT INTO {table}({','.join(cols)}) VALUES ({','.join('?' * len(cols))})",
                            [tuple(r[c] for c in cols) for r in rows])
    con.commit()
    con.close()
    return path

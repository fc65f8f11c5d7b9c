"""One route handler and one task family, imported by name and exercised alone: the handler without the app
factory, the family class without the registry (its own oracle drives the episode)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from starlette.requests import Request

from webrl_core.config_loader import load_config
from webrl_core.env.rollout import rollout
from webrl_core.sites import shopping
from webrl_core.sites.common import EpisodeDBs, SiteKit, sign
from webrl_core.sites.data import site_data, write_template
from webrl_core.sites.families import PageView
from webrl_core.sites.families.shopping_admin import ShoppingAdminUpdatePrice
from webrl_core.sites.shopping import orders
from webrl_core.sites.tasks import make_task


def _get(kit: SiteKit, path: str, cookies: dict[str, str] | None = None) -> Request:
    """A GET request as Starlette hands it to an endpoint; the app is a stand-in that only carries the kit."""
    headers = [(b"cookie", "; ".join(f"{k}={v}" for k, v in cookies.items()).encode())] if cookies else []
    return Request({"type": "http", "method": "GET", "path": path, "query_string": b"", "headers": headers,
                    "path_params": {}, "app": SimpleNamespace(state=SimpleNamespace(kit=kit))})


def test_a_handler_alone_sends_anonymous_visitors_to_login(tmp_path):
    app = shopping.APP
    write_template("shopping", 0, tmp_path / "shopping.sqlite")
    kit = SiteKit("shopping", EpisodeDBs(tmp_path / "shopping.sqlite", tmp_path / "episodes"), "secret",
                  app.session_cookie, app.accounts)
    anonymous = asyncio.run(orders(_get(kit, "/orders")))
    assert anonymous.status_code == 303 and anonymous.headers["location"] == "/login?next=/orders"
    user = next(iter(app.accounts))
    logged_in = asyncio.run(orders(_get(kit, "/orders", {app.session_cookie: sign("secret", user)})))
    assert logged_in.status_code == 200 and "<h1>My Orders</h1>" in logged_in.body.decode()


class FamilyOracle:
    """The scripted expert of one family class, asked directly (not through ``FAMILIES``)."""

    policy_id = "family-oracle"

    def __init__(self, family):
        self.family = family

    async def act(self, prompts, contexts=None):
        return [self.family.oracle(c.task["instantiation_dict"], PageView(url=c.url, html=c.html, step=c.step))
                for c in contexts]


def test_a_family_class_alone_builds_a_task_its_oracle_solves(sites):
    fam = ShoppingAdminUpdatePrice()
    inst = fam.instances(site_data(0))[0]
    task = make_task(fam, inst, 1, "train", "alone-update-price")
    assert task["family"] == "shopping_admin.update_price" and task["start_url"] == "__SHOPPING_ADMIN__"
    assert task["intent"] == f"Set the price of the {inst['product']} to {inst['price']} dollars."
    cfg = load_config().env.model_copy(update={"n_envs": 1})
    [ep] = asyncio.run(rollout([task], FamilyOracle(fam), 1, cfg=cfg, hooks=sites, purpose="oracle",
                               progress=False))
    assert ep["env_score"] == 1.0, (ep["status"], ep["error"], ep["final_answer"])

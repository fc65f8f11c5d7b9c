"""The bootstrap's ORM data (``webrl_core.pipeline.bootstrap.balance_classes``): equal classes, and with
``orm.positives: policy_first`` the policies' own successes before any oracle demonstration."""

from __future__ import annotations

from webrl_core.config_loader import load_config
from webrl_core.pipeline.bootstrap import balance_classes


def _examples(n_oracle_yes: int, n_policy_yes: int, n_no: int) -> list[dict]:
    rows = [{"episode_id": f"oracle-{i}", "completion": "YES"} for i in range(n_oracle_yes)]
    rows += [{"episode_id": f"policy-{i}", "completion": "YES"} for i in range(n_policy_yes)]
    return rows + [{"episode_id": f"fail-{i}", "completion": "NO"} for i in range(n_no)]


def test_policy_successes_come_before_oracle_ones():
    ex = _examples(300, 15, 25)
    oracle = {e["episode_id"] for e in ex if e["episode_id"].startswith("oracle")}
    kept = balance_classes(ex, seed=0, fill_only=oracle)
    yes = [e["episode_id"] for e in kept if e["completion"] == "YES"]
    assert len(yes) == 25 and sum(1 for e in kept if e["completion"] == "NO") == 25
    assert sum(i.startswith("policy") for i in yes) == 15  # every policy success, then 10 oracle ones
    uniform = balance_classes(ex, seed=0)
    assert sum(e["episode_id"].startswith("policy") for e in uniform) < 15  # a uniform draw is mostly oracle


def test_more_policy_successes_than_needed_leave_the_oracle_out():
    ex = _examples(100, 30, 10)
    oracle = {e["episode_id"] for e in ex if e["episode_id"].startswith("oracle")}
    kept = balance_classes(ex, seed=3, fill_only=oracle)
    assert len(kept) == 20 and not any(e["episode_id"].startswith("oracle") for e in kept)


def test_without_fillers_the_draw_is_the_uniform_one_and_default_is_policy_first():
    ex = _examples(40, 5, 12)
    assert balance_classes(ex, seed=1, fill_only=set()) == balance_classes(ex, seed=1)
    assert load_config().orm.positives == "policy_first"
    assert load_config(sets=["orm.positives=any"]).orm.positives == "any"

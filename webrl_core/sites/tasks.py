"""Task sets of the embedded sites, in the WebArena-Lite JSON schema (+ ``family`` and ``split``).

  - ``test_set(data_seed)``: a FIXED held-out set of 165 tasks spread over the sites like WebArena-Lite
    (shopping 46, shopping_admin 36, gitlab 34, map 29, reddit 20; see TEST_COUNTS), drawn from each family's test pool;
  - ``train_tasks(n, seed)``: n tasks sampled round-robin over families from their training pools;
  - ``vary_task(task, rng)``: a new task of the same family (different training instantiation and/or
    phrasing) with its own correct evaluator -- the curriculum's embedded generator;
  - ``widen_task(task, rng)``: a new task of ANOTHER family of the same site, with its evaluator -- the embedded
    generator's in-breadth share (``curriculum.breadth``).
Test and training instantiations are disjoint by construction (``families`` split rule).
"""

from __future__ import annotations

import copy
import random
from functools import lru_cache

from webrl_core.sites.data import site_data
from webrl_core.sites.families import FAMILIES, Family, stable_hash
from webrl_core.websites import SITES

# WebArena-Lite: 45/35/30/26/19 single-site tasks + 10 multi-site ones; we count those 10 towards the sites they
# name (our families are single-site), which keeps the total at 165.
TEST_COUNTS = {"shopping": 46, "shopping_admin": 36, "gitlab": 34, "map": 29, "reddit": 20}


@lru_cache(maxsize=8)
def _pools(data_seed: int) -> dict[str, tuple[list[dict], list[dict]]]:
    """family -> (test pool, train pool)."""
    data = site_data(data_seed)
    out = {}
    for name, fam in FAMILIES.items():
        insts = sorted(fam.instances(data), key=lambda i: stable_hash([name, i]))
        if len(insts) <= fam.test_quota:
            raise ValueError(f"family {name}: {len(insts)} instantiations, test quota {fam.test_quota}")
        out[name] = (insts[:fam.test_quota], insts[fam.test_quota:])
    return out


def make_task(fam: Family, inst: dict, phrasing: int, split: str, task_id: str, data_seed: int = 0) -> dict:
    """One WebArena-Lite task config for a family instantiation."""
    data = site_data(data_seed)
    templates = fam.phrasings(inst)
    template = templates[phrasing % len(templates)]
    built = fam.build(inst, data)
    t_index = fam.templates.index(next(t for t in fam.templates if t.endswith(template)))
    return {
        "sites": [fam.site],
        "task_id": task_id,
        "require_login": True,
        "storage_state": None,
        "start_url": built["start_url"],
        "geolocation": None,
        "intent_template": template,
        "instantiation_dict": dict(inst),
        "intent": template.format(**inst),
        "require_reset": False,
        "eval": built["eval"],
        "intent_template_id": list(FAMILIES).index(fam.name) * 10 + t_index,
        "family": fam.name,
        "split": split,
        "data_seed": data_seed,
    }


def families_of(site: str) -> list[Family]:
    return [f for f in FAMILIES.values() if f.site == site]


@lru_cache(maxsize=4)
def _test_set(data_seed: int) -> tuple:
    pools = _pools(data_seed)
    tasks = []
    for site in SITES:
        fams = families_of(site)
        quota = sum(f.test_quota for f in fams)
        if quota != TEST_COUNTS[site]:
            raise ValueError(f"site {site}: family test quotas sum to {quota}, expected {TEST_COUNTS[site]}")
        for fam in fams:
            for j, inst in enumerate(pools[fam.name][0]):
                tasks.append(make_task(fam, inst, j, "test", f"emb-test-{len(tasks):03d}", data_seed))
    return tuple(tasks)


def test_set(data_seed: int = 0) -> list[dict]:
    """The fixed held-out set (165 tasks; ids emb-test-000 .. emb-test-164)."""
    return copy.deepcopy(list(_test_set(data_seed)))


def train_instances(fam: Family, data_seed: int = 0) -> list[dict]:
    """The family's training-pool instantiations, in the pool's fixed order (never one of the held-out test
    pool's): what a task written for training may instantiate."""
    return copy.deepcopy(_pools(data_seed)[fam.name][1])


def _train_task(fam: Family, rng: random.Random, data_seed: int) -> dict:
    inst = rng.choice(_pools(data_seed)[fam.name][1])
    phrasing = rng.randrange(len(fam.phrasings(inst)))
    tid = f"emb-train-{fam.name}-{stable_hash([inst, phrasing]) % 16**8:08x}"
    return make_task(fam, inst, phrasing, "train", tid, data_seed)


def train_tasks(n: int, seed: int = 0, data_seed: int = 0, families: list[str] | None = None) -> list[dict]:
    """n training tasks, families taken round-robin (shuffled), instantiations sampled from training pools."""
    names = list(families or FAMILIES)
    unknown = sorted(set(names) - set(FAMILIES))
    if unknown:
        raise ValueError(f"unknown task families {unknown}; known: {sorted(FAMILIES)}")
    rng = random.Random(f"train-{seed}")
    out, seen = [], set()
    order: list[str] = []
    while len(out) < n:
        if not order:
            order = rng.sample(names, len(names))
        fam = FAMILIES[order.pop()]
        for _ in range(5):  # avoid exact duplicates when the pool allows it
            task = _train_task(fam, rng, data_seed)
            if task["task_id"] not in seen:
                break
        seen.add(task["task_id"])
        out.append(task)
    return out


def family_of(task: dict) -> Family:
    """``task``'s family; a task in strict WebArena-Lite format (no ``family``) is of the family its
    ``intent_template_id`` encodes."""
    name = task.get("family")
    if name is None and isinstance(task.get("intent_template_id"), int) and task["intent_template_id"] >= 0:
        names = list(FAMILIES)
        name = names[task["intent_template_id"] // 10] if task["intent_template_id"] // 10 < len(names) else None
    if name not in FAMILIES:
        raise ValueError(f"task {task.get('task_id')!r} has family {name!r}; known: {sorted(FAMILIES)}")
    return FAMILIES[name]


def vary_task(task: dict, rng: random.Random) -> dict:
    """A new training task of ``task``'s family (``family_of``): another instantiation and/or phrasing, with its own
    evaluator."""
    fam = family_of(task)
    data_seed = int(task.get("data_seed", 0))
    for _ in range(20):
        new = _train_task(fam, rng, data_seed)
        if new["intent"] != task.get("intent"):
            return new
    return new


def widen_task(task: dict, rng: random.Random) -> dict:
    """A new training task of another family of the site of ``task``'s family (``family_of``; uniform over the
    site's other families), with its own evaluator: a different kind of task on the same website, as the paper's
    in-breadth evolving asks of its generator (arXiv 2411.02337, Sec. 3.1 and App. C: "the same domain ... more
    diverse"). A site with one family gives a task of that family."""
    own = family_of(task)
    others = [f for f in families_of(own.site) if f.name != own.name] or [own]
    return _train_task(rng.choice(others), rng, int(task.get("data_seed", 0)))


def task_sites(tasks: list[dict]) -> dict[str, int]:
    out: dict[str, int] = {}
    for t in tasks:
        out[t["sites"][0]] = out.get(t["sites"][0], 0) + 1
    return out

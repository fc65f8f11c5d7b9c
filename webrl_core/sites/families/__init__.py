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

One module per site (``shopping``, ``shopping_admin``, ``reddit``, ``gitlab``, ``map``), imported here in
that order, which is the registry's order; the shared toolkit and the registry are in ``base``.
"""

from webrl_core.sites.families.base import FAMILIES, Family, PageView, finish, stable_hash
from webrl_core.sites.families import shopping, shopping_admin, reddit, gitlab, map  # noqa: F401  (registers, in order)

__all__ = ["FAMILIES", "Family", "PageView", "finish", "stable_hash"]

"""Entity-swap augmentation of the embedded SFT demonstrations.

Most embedded tasks name a thing (a product, customer, place, post, issue, project, user or order) that the agent
must type or find: ``Search(argument="<the product in the intent>")``. A small model trained from scratch on a few
hundred demonstrations can lower its loss by memorising which names follow which pages instead of copying the name
from the intent, and then types ``"graph-viz"`` for every GitLab project. Swapping breaks that shortcut: a pair
``(prompt, action)`` is, with probability ``p``, rewritten with every entity name ``e`` it contains replaced by
``σ(e)``, a name of the same kind drawn at random (one ``σ`` per pair, injective, applied to the intent, the page and
the action alike), so the typed name is predictable only from the intent. Each SFT epoch sees its own draw.

Kinds are the sites' named columns (``sites.data.entity_kinds``): a product is swapped for a product, an order
number for an order number. Swapping is text-level and keeps everything else: a swapped page still shows the
original price or count, which is fine because the answers the model learns to read are on the page it sees.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence


class EntitySwapper:
    """Rewrites texts with a random same-kind substitution of the entity names they contain."""

    def __init__(self, kinds: dict[str, str]):
        if not kinds:
            raise ValueError("EntitySwapper: no entity names to swap")
        self.kinds = kinds
        self.by_kind: dict[str, list[str]] = {}
        for name, kind in sorted(kinds.items()):
            self.by_kind.setdefault(kind, []).append(name)
        # longest first, whole words only: "Maple Hotel" inside "Maple Hotels" is not an entity
        alternatives = "|".join(re.escape(n) for n in sorted(kinds, key=len, reverse=True))
        self.pattern = re.compile(rf"(?<![\w-])(?:{alternatives})(?![\w-])")

    def swap(self, texts: Sequence[str], rng: random.Random) -> tuple[str, ...]:
        """The texts with one injective same-kind substitution σ applied to all of them."""
        found = sorted({m.group(0) for t in texts for m in self.pattern.finditer(t)})
        sigma: dict[str, str] = {}
        taken: set[str] = set()
        for name in found:
            # draw among the kind's names not yet taken: found names of a kind never outnumber the kind, so one is
            # always free, and a page listing every name of a small kind (the 12 forums) gets a permutation, never
            # two lines with one name
            free = [n for n in self.by_kind[self.kinds[name]] if n not in taken]
            sigma[name] = pick = rng.choice(free)
            taken.add(pick)
        if not sigma:
            return tuple(texts)
        return tuple(self.pattern.sub(lambda m: sigma[m.group(0)], t) for t in texts)


def augment_pairs(pairs: Sequence[tuple[str, str]], swapper: EntitySwapper, copies: int, p: float,
                  seed: int) -> list[tuple[str, str]]:
    """``copies`` passes over ``pairs``; in each, a pair is entity-swapped with probability ``p`` (fresh draws)."""
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"entity swap probability must be in [0, 1], got {p}")
    rng = random.Random(seed)
    out: list[tuple[str, str]] = []
    for _ in range(copies):
        for prompt, action in pairs:
            out.append(swapper.swap((prompt, action), rng) if rng.random() < p else (prompt, action))
    return out

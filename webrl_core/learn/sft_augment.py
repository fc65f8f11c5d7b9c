"""The bootstrap SFT's training data: each epoch its own augmented pass over the demonstrations' pairs.

With ``bootstrap.sft_entity_swap = p_s`` or ``bootstrap.sft_list_shuffle = p_l`` the SFT trains on
``P = ceil(epochs)`` passes over the pairs, ``epochs / P`` of an epoch each over the concatenation; in each pass a
pair is entity-swapped with probability ``p_s`` (``entity_swap.py``: the typed name only copyable from the intent)
and then list-shuffled with probability ``p_l`` (``list_shuffle.py``: the clicked id only findable by its name), with
fresh draws per pass. Both 0: the pairs as they are, trained ``epochs`` over.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

from webrl_core.learn.entity_swap import EntitySwapper, augment_pairs
from webrl_core.learn.list_shuffle import shuffle_pairs


def augmented_sft_passes(pairs: Sequence[tuple[str, str]], kinds: dict[str, str], epochs: float,
                         entity_swap: float, list_shuffle: float, seed: int
                         ) -> tuple[list[tuple[str, str]], float | None]:
    """(the SFT pairs, the epochs to train over them): ceil(``epochs``) augmented passes and ``epochs`` / passes,
    or, without augmentation, ``pairs`` as they are and None (train ``epochs`` over them)."""
    if entity_swap <= 0 and list_shuffle <= 0:
        return list(pairs), None
    passes = max(1, math.ceil(epochs))
    if entity_swap > 0:
        out = augment_pairs(pairs, EntitySwapper(kinds), passes, entity_swap, seed=seed)
    else:
        out = [pair for _ in range(passes) for pair in pairs]
    if list_shuffle > 0:
        out = shuffle_pairs(out, list_shuffle, seed=random.Random(seed).randrange(2**31))
    return out, epochs / passes


def sft_passes(settings, pairs: Sequence[tuple[str, str]]) -> tuple[list[tuple[str, str]], float | None]:
    """``augmented_sft_passes`` with the run's ``bootstrap.sft_entity_swap`` and ``bootstrap.sft_list_shuffle``."""
    from webrl_core.sites.data import entity_kinds

    boot = settings.bootstrap
    kinds = entity_kinds(settings.sites.data_seed) if boot.sft_entity_swap > 0 else {}
    return augmented_sft_passes(pairs, kinds, boot.sft_epochs, boot.sft_entity_swap, boot.sft_list_shuffle,
                                seed=settings.run.seed)

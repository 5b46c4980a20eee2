"""Packing algorithms, one per module, and the layout builder of the `before` plan.

`best_fit` packs the plain plan (and fills pre-filled rows); `random_groups` groups samples for padded and flattened;
`label_aware` repacks given rows so their label counts start close (microbatch balance starts from it).
"""

from __future__ import annotations

import numpy as np

from plancc.config import Mode, PlanSettings
from plancc.pack.best_fit import pack_best_fit
from plancc.pack.random_groups import group_fixed
from plancc.plan import Batches, SampleArrays, from_rows


def initial_batches(s: SampleArrays, settings: PlanSettings, rng: np.random.Generator) -> Batches:
    """The `before` plan of one epoch: shuffled, packed (or grouped) microbatches in the chosen layout."""
    if settings.mode == Mode.PACKED:
        order, row_bounds = pack_best_fit(s.length, settings.row_capacity, rng)
        rows_per_batch = settings.micro_batch_size if settings.real_batches else 1
        return from_rows(order, row_bounds, rows_per_batch)
    order, groups = group_fixed(len(s), settings.micro_batch_size, rng)
    if settings.mode == Mode.PADDED:  # one row per sample
        return Batches(order, np.arange(len(s) + 1, dtype=np.int64), groups)
    return Batches(order, groups, np.arange(groups.shape[0], dtype=np.int64))  # flattened: one row per group


__all__ = ["group_fixed", "initial_batches", "pack_best_fit"]

"""Placing the items that fit no gap of a packing: a stride of rows repacked by best fit, else exact fills.

The rows with a gap and every `stride`-th other row give up their items, which go back longest first, one a row
(no row left empty), then by best fit, with the left-out ones; strides shrink (STRIDES) until everything fits.
Repacking a stride of rows rather than all keeps most rows as they were; a pass is O(n log C). Where rows have
almost no spare tokens, best fit leaves the shortest items out on every stride, and `exact_fill` closes the rows
by filling them exactly (the last resort).

Callers: the plain packing gives rows above the lower bound back through it (`plain`), and label-aware repacking
closes its own left-outs with it (`label_aware`).
"""

from __future__ import annotations

import numpy as np

from plancc.planner.pack._rows import pool_items, row_fill
from plancc.planner.pack.best_fit import best_fit
from plancc.planner.pack.exact_fill import fill_exactly
from plancc.planner.sort import longest_first

STRIDES = (64, 16, 4, 2)  # every STRIDE-th row joins the rows with gaps to close the left-out items


def close_left_out(lengths: np.ndarray, assign: np.ndarray, start_tok: np.ndarray, capacity: int,
                   rng: np.random.Generator) -> bool:
    """Place the items left out (`assign` -1), in place, within `capacity` and with no row left empty: by strides
    of rows, else by exact fills. False (and `assign` as it was) if neither closes.

    `start_tok[r]` is what row r holds before any item (pinned samples); `rng` orders the rows that repack."""
    lengths = lengths.astype(np.int64, copy=False)  # the kernels' sums in int64 whatever the lengths' type
    return (_close_by_strides(lengths, assign, start_tok, capacity, rng)
            or fill_exactly(lengths, assign, start_tok, capacity, rng))


def _close_by_strides(lengths: np.ndarray, assign: np.ndarray, start_tok: np.ndarray, capacity: int,
                      rng: np.random.Generator) -> bool:
    """The stride passes of the module docstring, in place; False (and `assign` as it was) if no stride closes.

    The rows take the longest items in a seeded random order: in row order, a row's label count would follow its
    position, and where most rows join the pool, updates would drift from light to heavy along the plan."""
    rows = start_tok.shape[0]
    row_tok = row_fill(assign, lengths, start_tok)
    for stride in STRIDES:
        pool = (row_tok < capacity) | (np.arange(rows) % stride == 0)
        items = pool_items(assign, pool)
        items = items[longest_first(lengths[items])]
        pool_rows = rng.permutation(np.flatnonzero(pool))
        k = min(pool_rows.shape[0], items.shape[0])  # one item a row first: no row left empty
        fill = start_tok[pool_rows].astype(np.int64)
        fill[:k] += lengths[items[:k]]
        at, _ = best_fit(lengths[items[k:]].astype(np.int64, copy=False), int(capacity), fill, False)
        if (at >= 0).all() and k == pool_rows.shape[0] and (fill <= capacity).all():
            assign[items[:k]] = pool_rows[:k]
            assign[items[k:]] = pool_rows[at]
            return True
    return False

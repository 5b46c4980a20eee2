"""Row bookkeeping shared by the two ways of closing left-out items (`left_out` strides, `exact_fill`).

Both kernels read 10M-item assignments once, with no per-item temporaries (a boolean mask and a `bincount` would
allocate two arrays of the items' size).
"""

from __future__ import annotations

import numpy as np

from plancc.core.jit import numba


@numba.njit(cache=True)
def row_fill(assign, lengths, start_tok):
    """Tokens each row holds: its `start_tok` plus the lengths of the items placed in it.

    Args:
        assign: int64 (items,) — row of each item, -1 for an item left out (not counted).
        lengths: int (items,) — tokens of each item.
        start_tok: int (rows,) — tokens a row holds before any item (pinned samples), 0 for none.
    Returns: int64 (rows,).
    """
    fill = start_tok.astype(np.int64)
    for item in range(assign.shape[0]):
        if assign[item] >= 0:
            fill[assign[item]] += lengths[item]
    return fill


@numba.njit(cache=True)
def pool_items(assign, pool):
    """The items to place again: those left out and those whose row is in the pool, in item order.

    Args:
        assign: int64 (items,) — row of each item, -1 for an item left out.
        pool: bool (rows,) — rows that give up their items.
    Returns: int64 (pooled items,) — item indices, ascending.
    """
    out = np.empty(assign.shape[0], dtype=np.int64)
    count = 0
    for item in range(assign.shape[0]):
        if assign[item] < 0 or pool[assign[item]]:
            out[count] = item
            count += 1
    return out[:count].copy()

"""Closing rows with almost no free space by filling them exactly: the last resort of `left_out.close_left_out`.

When the rows must hold every item with only a few tokens to spare (rows at the lower bound `ceil(tokens / C)`,
a handful of spare tokens over thousands of rows), best fit leaves the shortest items out while nearly every row
has no gap and the rest gaps of a few tokens, and repacking a stride of rows by best fit ends the same way on
every seeded order. Filling rows exactly closes them:

1. The pool (the rows with a gap and every STRIDE-th other row) gives up its items. Items of at least T tokens
   go back longest first by best fit into rows of C - T, so every pool row keeps at least T tokens of space; T is
   the shortest length whose shorter items hold SHORT_SPACE times the space kept (enough to fill it), at most C / 4.
2. Each pool row, smallest space first, takes the short items whose total comes closest to its space from below
   (a bounded subset sum over the short lengths). With many short items of many lengths that is an exact fill,
   so the spare tokens collect in the last rows.

It changes nothing and says False if an item is left over or a pool row stays empty. Cost: a best fit of the
pool's items, then per pool row a subset sum over at most T lengths (O(T * space)).
"""

from __future__ import annotations

import numpy as np

from plancc.core.jit import numba
from plancc.planner.pack._rows import pool_items, row_fill
from plancc.planner.pack.best_fit import best_fit
from plancc.planner.sort import longest_first

STRIDE = 64  # every STRIDE-th row without a gap joins the pool too
SHORT_SPACE = 8  # the short items hold at least this many times the space kept for them


def fill_exactly(lengths: np.ndarray, assign: np.ndarray, start_tok: np.ndarray, capacity: int,
                 rng: np.random.Generator) -> bool:
    """Steps 1-2 of the module docstring, in place; False (and `assign` as it was) if they do not close."""
    lengths = lengths.astype(np.int64)
    rows = start_tok.shape[0]
    row_tok = row_fill(assign, lengths, start_tok)
    pool = (row_tok < capacity) | (np.arange(rows) % STRIDE == 0)
    pool_rows = rng.permutation(np.flatnonzero(pool))
    items = pool_items(assign, pool)
    short = _threshold(lengths[items], pool_rows.shape[0], capacity)
    long_items = items[lengths[items] >= short]
    long_items = long_items[longest_first(lengths[long_items])]
    k = min(pool_rows.shape[0], long_items.shape[0])  # one item a row first: no row left to short items alone
    fill = start_tok[pool_rows].astype(np.int64)
    fill[:k] += lengths[long_items[:k]]
    rest, _ = best_fit(lengths[long_items[k:]], int(capacity - short), fill, False)
    if (rest < 0).any() or (fill > capacity - short).any():
        return False
    at = np.concatenate([np.arange(k, dtype=np.int64), rest])
    np.add.at(fill, rest, lengths[long_items[k:]])
    short_items = items[lengths[items] < short]
    got = _fill_rows(lengths[short_items], short, capacity - fill)
    if (got < 0).any():
        return False
    count = np.bincount(at, minlength=pool_rows.shape[0]) + np.bincount(got, minlength=pool_rows.shape[0])
    if ((count == 0) & (start_tok[pool_rows] == 0)).any():
        return False
    assign[long_items] = pool_rows[at]
    assign[short_items] = pool_rows[got]
    return True


def _threshold(lengths: np.ndarray, rows: int, capacity: int) -> int:
    """The shortest T whose items shorter than T hold at least SHORT_SPACE * rows * T tokens (at most
    capacity // 4)."""
    counts = np.bincount(lengths, minlength=capacity // 4 + 1)[: capacity // 4 + 1]
    below = np.concatenate([[0], np.cumsum(counts * np.arange(counts.shape[0]))])  # tokens of items < T
    ok = np.flatnonzero(below[1:] >= SHORT_SPACE * rows * np.arange(1, counts.shape[0] + 1))
    return int(ok[0]) + 1 if ok.size else capacity // 4


@numba.njit(cache=True)
def _items_by_length(lengths, short):
    """The items grouped by length (a counting sort): (CSR start per length, items, count per length).

    Args:
        lengths: int64 (items,) — tokens of each item, each below `short`.
        short: int — one past the longest length.
    Returns: (int64 (short + 1,), int64 (items,), int64 (short,)).
    """
    n_items = lengths.shape[0]
    count = np.zeros(short, dtype=np.int64)
    for item in range(n_items):
        count[lengths[item]] += 1
    start = np.zeros(short + 1, dtype=np.int64)
    for length in range(short):
        start[length + 1] = start[length] + count[length]
    by_length = np.empty(n_items, dtype=np.int64)
    fill = start[:short].copy()
    for item in range(n_items):
        by_length[fill[lengths[item]]] = item
        fill[lengths[item]] += 1
    return start, by_length, count


@numba.njit(cache=True)
def _closest_subset(left, short, target):
    """A bounded subset sum: the largest total <= `target` made of the lengths still left, and how to reach it.

    Args:
        left: int64 (short,) — items of each length still to place.
        short: int — one past the longest length.
        target: int — the row's free space (> 0).
    Returns: (int best total, int64 (target + 1,) per total the length whose copy last reached it, 0: unreached).
    """
    reach = np.zeros(target + 1, dtype=np.int64)
    used = np.zeros(target + 1, dtype=np.int64)  # copies of the current length in the way to each total
    reach[0] = -1
    best = 0
    for length in range(1, short):
        if left[length] == 0:
            continue
        used[:] = 0
        for total in range(length, target + 1):
            if reach[total] == 0 and reach[total - length] != 0 and used[total - length] < left[length]:
                reach[total] = length
                used[total] = used[total - length] + 1
                if total > best:
                    best = total
        if best == target:
            break
    return best, reach


@numba.njit(cache=True)
def _fill_rows(lengths, short, space):
    """Row of each item: rows smallest space first, each taking the subset of what is left whose total comes
    closest to its space from below; -1 for items left over.

    Args:
        lengths: int64 (items,) — tokens of each short item, each below `short`.
        short: int — the threshold T of the module docstring.
        space: int64 (rows,) — free tokens of each pool row.
    Returns: int64 (items,).
    """
    start, by_length, left = _items_by_length(lengths, short)
    out = np.full(lengths.shape[0], -1, dtype=np.int64)
    for row in np.argsort(space, kind="mergesort"):
        if space[row] <= 0:
            continue
        total, reach = _closest_subset(left, short, space[row])
        while total > 0:  # walk the subset back, taking the last item of each length it uses
            length = reach[total]
            left[length] -= 1
            out[by_length[start[length] + left[length]]] = row
            total -= length
    return out

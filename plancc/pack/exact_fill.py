"""Closing rows with almost no free space by filling them exactly: the last resort of `best_fit.close_left_out`.

When the rows must hold every item with only a few tokens to spare (rows at the lower bound `ceil(tokens / C)`:
200k samples of the SFT mix, data seed 5, have 1,943 spare tokens over 7,413 rows of 16384), best fit leaves the
shortest items out (there 109 of 35-51 tokens, while 94% of the rows have no gap and the rest gaps of a few
tokens), and repacking a stride of rows by best fit (`close_left_out`) ends the same way on every seeded order.
Filling rows exactly closes them:

1. The pool (the rows with a gap and every STRIDE-th other row) gives up its items. Items of at least T tokens
   go back longest first by best fit into rows of C - T, so every pool row keeps at least T tokens of space; T is
   the shortest length whose shorter items hold twice the space kept (enough to fill it), at most C / 4.
2. Each pool row, smallest space first, takes the short items whose total comes closest to its space from below
   (a bounded subset sum over the short lengths). With many short items of many lengths that is an exact fill,
   so the spare tokens collect in the last rows.

It changes nothing and says False if an item is left over or a pool row stays empty. Cost: a best fit of the
pool's items, then per pool row a subset sum over at most T lengths (O(T * space)).
"""

from __future__ import annotations

import numpy as np

from plancc.jit import numba
from plancc.pack.best_fit import _pool_items, _row_fill, best_fit
from plancc.sort import longest_first

STRIDE = 64  # every STRIDE-th row without a gap joins the pool too
SHORT_SPACE = 8  # the short items hold at least this many times the space kept for them


def fill_exactly(lengths: np.ndarray, assign: np.ndarray, start_tok: np.ndarray, capacity: int,
                 rng: np.random.Generator) -> bool:
    """Steps 1-2 of the module docstring, in place; False (and `assign` as it was) if they do not close."""
    lengths = lengths.astype(np.int64)
    rows = start_tok.shape[0]
    row_tok = _row_fill(assign, lengths, start_tok)
    pool = (row_tok < capacity) | (np.arange(rows) % STRIDE == 0)
    pool_rows = rng.permutation(np.flatnonzero(pool))
    items = _pool_items(assign, pool)
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
    """The shortest T whose items shorter than T hold at least 2 * rows * T tokens (at most capacity // 4)."""
    counts = np.bincount(lengths, minlength=capacity // 4 + 1)[: capacity // 4 + 1]
    below = np.concatenate([[0], np.cumsum(counts * np.arange(counts.shape[0]))])  # tokens of items < T
    ok = np.flatnonzero(below[1:] >= SHORT_SPACE * rows * np.arange(1, counts.shape[0] + 1))
    return int(ok[0]) + 1 if ok.size else capacity // 4


@numba.njit(cache=True)
def _fill_rows(lengths, short, space):
    """Row of each item (all shorter than `short`): rows smallest `space` first, each taking the subset whose
    total comes closest to its space from below; -1 for items left over."""
    n = lengths.shape[0]
    count = np.zeros(short, dtype=np.int64)
    for i in range(n):
        count[lengths[i]] += 1
    start = np.zeros(short + 1, dtype=np.int64)  # items by length (CSR), taken from the end
    for v in range(short):
        start[v + 1] = start[v] + count[v]
    by_len = np.empty(n, dtype=np.int64)
    fill = start[:short].copy()
    for i in range(n):
        by_len[fill[lengths[i]]] = i
        fill[lengths[i]] += 1
    left = count.copy()
    out = np.full(n, -1, dtype=np.int64)
    for r in np.argsort(space, kind="mergesort"):
        target = space[r]
        if target <= 0:
            continue
        # bounded subset sum: reach[t] is the length whose copy last reached total t (0: unreached)
        reach = np.zeros(target + 1, dtype=np.int64)
        used = np.zeros(target + 1, dtype=np.int64)
        reach[0] = -1
        best = 0
        for v in range(1, short):
            if left[v] == 0:
                continue
            used[:] = 0
            for t in range(v, target + 1):
                if reach[t] == 0 and reach[t - v] != 0 and used[t - v] < left[v]:
                    reach[t] = v
                    used[t] = used[t - v] + 1
                    if t > best:
                        best = t
            if best == target:
                break
        t = best
        while t > 0:
            v = reach[t]
            left[v] -= 1
            out[by_len[start[v] + left[v]]] = r
            t -= v
    return out

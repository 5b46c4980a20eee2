"""Best-fit-decreasing bin packing in O(n log C): the plain packer behind the `before` plan.

Items are taken longest first (ties in a seeded random order) and each goes to the open row whose remaining space
is the smallest that still fits it, found in a segment tree over remaining-space values. On SFT length mixes this
lands on the rows lower bound `ceil(tokens / capacity)` or a row or two above it (200k samples, data seed 3:
one above). Where rows hold many samples (CROWDED on average) and best fit ends more than 0.01% above the bound,
the emptiest row is emptied into the others (`close_left_out`) until it is within 0.01%; a try that does not close
leaves the packing as it was. The spare rows kept are the free space label balancing trades through: at exactly
the bound its repacking cannot close the rows (4M samples: label CV 0.22 instead of 0.012), and rows of few
samples keep best fit's spare row (capacity 4096, ~7 a row, 200k samples: label CV 9% above its floor with it,
19% without, for 0.03% rows).

`close_left_out` places items that fit no gap: the rows with a gap and every `stride`-th other row give up their
items, which go back longest first, one a row (no row left empty), then by best fit, with the left-out ones;
strides shrink (64, 16, 4, 2) until everything fits. Repacking a stride of rows rather than all keeps most rows
as they were (label-aware repacking calls it to close its own left-outs); a pass is O(n log C).
"""

from __future__ import annotations

import numpy as np

from plancc.jit import numba
from plancc.sort import longest_first, stable_order

STRIDES = (64, 16, 4, 2)  # every STRIDE-th row joins the rows with gaps to close the left-out items
REPAIRS = 8  # rows more than 0.01% above the lower bound that the plain packing tries to give back
CROWDED = 16  # samples a row on average from which rows above the lower bound are given back


@numba.njit(cache=True, inline="always")
def _push(tree, head, nxt, width, row, left):
    """Register `row` as open with `left` tokens of space."""
    nxt[row] = head[left]
    head[left] = row
    node = left + width
    while node >= 1:
        tree[node] += 1
        node //= 2


@numba.njit(cache=True)
def best_fit(sizes, capacity, filled, can_open):
    """Row index per item (items in the given order) and the number of rows.

    Rows `0..len(filled)-1` start with `filled` tokens; further rows are numbered by opening order. Without
    `can_open`, an item that fits no row gets -1 instead of a new row.
    """
    n = sizes.shape[0]
    width = 1
    while width < capacity + 1:
        width *= 2
    tree = np.zeros(2 * width, dtype=np.int64)  # counts of open rows per remaining space
    head = np.full(capacity + 1, -1, dtype=np.int64)  # stack of rows per remaining space
    rows = filled.shape[0]
    nxt = np.empty(n + rows, dtype=np.int64)
    assign = np.empty(n, dtype=np.int64)
    for row in range(rows):
        left = capacity - filled[row]
        if left > 0:
            _push(tree, head, nxt, width, row, left)
    for i in range(n):
        size = sizes[i]
        # smallest remaining r >= size with a row: descend the tree
        r = -1
        if tree[1] > 0:
            # find first leaf >= size with count > 0
            node = size + width
            if tree[node] > 0:
                r = size
            else:
                # climb until a right sibling subtree has rows
                while node > 1:
                    if node % 2 == 0 and tree[node + 1] > 0:
                        node = node + 1
                        while node < width:
                            node = 2 * node if tree[2 * node] > 0 else 2 * node + 1
                        r = node - width
                        break
                    node //= 2
        if r < 0 and not can_open:
            assign[i] = -1
            continue
        if r < 0:
            row = rows
            rows += 1
            left = capacity - size
        else:
            row = head[r]
            head[r] = nxt[row]
            node = r + width
            while node >= 1:
                tree[node] -= 1
                node //= 2
            left = r - size
        assign[i] = row
        if left > 0:
            _push(tree, head, nxt, width, row, left)
    return assign, rows


def pack_best_fit(lengths: np.ndarray, capacity: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Pack items of `lengths` (each <= capacity) into rows; return (items in row order, row bounds).

    Rows come out in a seeded random order; inside a row, items keep their placement order.
    """
    n = lengths.shape[0]
    if n and int(lengths.max()) > capacity:
        raise ValueError(f"an item of length {int(lengths.max())} exceeds the row capacity {capacity}")
    shuffled = rng.permutation(n)
    order = shuffled[longest_first(lengths[shuffled])]
    sizes = lengths[order].astype(np.int64, copy=False)
    assign, rows = best_fit(sizes, int(capacity), np.zeros(0, dtype=np.int64), True)
    lower = -(-int(sizes.sum()) // capacity)
    for _ in range(REPAIRS):  # empty the emptiest row into the others' gaps, if they close
        if rows <= lower + lower // 10_000 or n < CROWDED * lower:
            break
        worst = int(np.argmin(np.bincount(assign, sizes, minlength=rows)))
        trial = np.where(assign == worst, -1, assign - (assign > worst))
        if not close_left_out(sizes, trial, np.zeros(rows - 1, dtype=np.int64), int(capacity), rng):
            break
        assign, rows = trial, rows - 1
    new_row = rng.permutation(rows)[assign]  # rows in a seeded random order: each item's new row
    by_row = stable_order(new_row, rows)
    bounds = np.zeros(rows + 1, dtype=np.int64)
    np.cumsum(np.bincount(new_row, minlength=rows), out=bounds[1:])
    return order[by_row].astype(np.int64, copy=False), bounds


@numba.njit(cache=True)
def _row_fill(assign, lengths, start_tok):
    """Tokens of each row: `start_tok` plus its placed items (`assign` >= 0), with no per-item temporaries."""
    fill = start_tok.astype(np.int64)
    for i in range(assign.shape[0]):
        if assign[i] >= 0:
            fill[assign[i]] += lengths[i]
    return fill


@numba.njit(cache=True)
def _pool_items(assign, pool):
    """Items left out (`assign` -1) or placed in a `pool` row, in item order."""
    out = np.empty(assign.shape[0], dtype=np.int64)
    k = 0
    for i in range(assign.shape[0]):
        if assign[i] < 0 or pool[assign[i]]:
            out[k] = i
            k += 1
    return out[:k].copy()


def close_left_out(lengths: np.ndarray, assign: np.ndarray, start_tok: np.ndarray, capacity: int,
           rng: np.random.Generator) -> bool:
    """Place the items left out (`assign` -1), in place: the rows with a gap and every `stride`-th other row give
    up their items, which go back longest first, one a row, then by best fit, with the left-out ones. False if
    even half the rows cannot close.

    The rows take the longest items in a seeded random order: in row order, a row's label count would follow its
    position (at capacity 4096 most rows join, and the update label CV then rose from 0.0003 to 0.009)."""
    rows = start_tok.shape[0]
    row_tok = _row_fill(assign, lengths, start_tok)
    for stride in STRIDES:
        pool = (row_tok < capacity) | (np.arange(rows) % stride == 0)
        items = _pool_items(assign, pool)
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
    from plancc.pack.exact_fill import fill_exactly  # it packs with best_fit: imported here, not at the top

    return fill_exactly(lengths, assign, start_tok, capacity, rng)

"""Best-fit-decreasing bin packing in O(n log C): the plain packer behind the `before` plan.

Items are taken longest first (ties in a seeded random order) and each goes to the open row whose remaining space
is the smallest that still fits it, found in a segment tree over remaining-space values. On SFT length mixes this
lands within a fraction of a percent of the rows lower bound `ceil(tokens / capacity)`; its siblings trade some of
that density for label awareness (see `plancc.balance`).
"""

from __future__ import annotations

import numpy as np

from plancc.jit import numba
from plancc.sort import longest_first, stable_order


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
    assign, rows = best_fit(lengths[order].astype(np.int64), int(capacity), np.zeros(0, dtype=np.int64), True)
    row_perm = rng.permutation(rows)  # new position of each row
    by_row = stable_order(row_perm[assign], rows)
    counts = np.bincount(row_perm[assign], minlength=rows)
    bounds = np.zeros(rows + 1, dtype=np.int64)
    np.cumsum(counts, out=bounds[1:])
    return order[by_row].astype(np.int64), bounds

"""Best-fit placement in O(log C) an item: the kernel behind the plain packing and every repacking of rows.

Each item goes to the open row whose free space is the smallest that still fits it. Open rows are kept by free
space: a stack of rows per space value, and a segment tree over the space values counting the open rows below
each node, so the smallest space >= an item's size is one descent. Items taken longest first make it
best-fit-decreasing (`plain.pack_best_fit`); with rows that start partly filled and no new rows it places items
into given rows (`left_out`, `exact_fill`, `label_aware`).
"""

from __future__ import annotations

import numpy as np

from plancc.core.jit import numba


@numba.njit(cache=True, inline="always")
def _push(tree, head, next_row, width, row, space):
    """Register `row` as open with `space` free tokens: on top of that space's stack, counted up the tree.

    Args:
        tree: int64 (2 * width,) — open rows under each node; leaf `width + space` counts rows of that space.
        head: int64 (capacity + 1,) — per free space, the row on top of its stack (-1: none).
        next_row: int64 (rows,) — per row, the row below it on its stack.
        width: int — leaves of the tree, a power of two above the capacity.
        row: int — the row to register.
        space: int — its free tokens, 1..capacity.
    """
    next_row[row] = head[space]
    head[space] = row
    node = space + width
    while node >= 1:
        tree[node] += 1
        node //= 2


@numba.njit(cache=True, inline="always")
def _pop(tree, head, next_row, width, space):
    """Take the row on top of the stack of `space` free tokens off it and out of the tree; return it.

    Args as `_push` (`space` must have an open row).
    """
    row = head[space]
    head[space] = next_row[row]
    node = space + width
    while node >= 1:
        tree[node] -= 1
        node //= 2
    return row


@numba.njit(cache=True, inline="always")
def _smallest_fit(tree, width, size):
    """The smallest free space >= `size` that some open row has, or -1 if none.

    Args:
        tree, width: as `_push`.
        size: int — tokens of the item to place, 1..capacity.
    """
    if tree[1] == 0:
        return -1
    node = size + width
    if tree[node] > 0:
        return size
    while node > 1:  # climb until a right sibling holds rows, then descend to its leftmost leaf with rows
        if node % 2 == 0 and tree[node + 1] > 0:
            node += 1
            while node < width:
                node = 2 * node if tree[2 * node] > 0 else 2 * node + 1
            return node - width
        node //= 2
    return -1


@numba.njit(cache=True)
def best_fit(sizes, capacity, filled, can_open):
    """Row of each item, placed in the given order, and the number of rows.

    Args:
        sizes: int64 (items,) — tokens of each item (each <= `capacity`), in placement order.
        capacity: int — tokens a row holds.
        filled: int64 (rows,) — tokens rows 0..rows-1 hold before any item (zeros: empty rows; length 0: none).
        can_open: bool — an item that fits no row opens a new one (numbered in opening order); else it gets -1.
    Returns: (int64 (items,) row of each item or -1, int rows in the end).
    """
    n_items = sizes.shape[0]
    width = 1
    while width < capacity + 1:
        width *= 2
    tree = np.zeros(2 * width, dtype=np.int64)
    head = np.full(capacity + 1, -1, dtype=np.int64)
    rows = filled.shape[0]
    next_row = np.empty(n_items + rows, dtype=np.int64)
    assign = np.empty(n_items, dtype=np.int64)
    for row in range(rows):
        space = capacity - filled[row]
        if space > 0:
            _push(tree, head, next_row, width, row, space)
    for item in range(n_items):
        size = sizes[item]
        fit = _smallest_fit(tree, width, size)
        if fit < 0 and not can_open:
            assign[item] = -1
            continue
        if fit < 0:
            row = rows
            rows += 1
            space = capacity - size
        else:
            row = _pop(tree, head, next_row, width, fit)
            space = fit - size
        assign[item] = row
        if space > 0:
            _push(tree, head, next_row, width, row, space)
    return assign, rows

"""Stable orderings of small-range integer keys in O(n): the counting sort behind packing and balancing.

Plans sort 10M positions by length (at most the row capacity) or by row (fewer rows than samples) several times
an epoch; a comparison sort costs n log n and an int64 index array per call, a counting sort one pass over the
keys and one over the range. The order is the unique stable one, the same as `np.argsort(keys, kind="stable")`.
"""

from __future__ import annotations

import numpy as np

from plancc.core.jit import numba


@numba.njit(cache=True)
def stable_order(keys, n_keys, descending=False):
    """Positions of `keys` in ascending key order (descending with `descending`), ties in position order.

    Args:
        keys: int64 (n,) — integers in [0, n_keys).
        n_keys: int — one past the largest key.
        descending: bool — largest key first.
    Returns: int64 (n,).
    """
    start = np.zeros(n_keys + 1, dtype=np.int64)
    top = n_keys - 1
    for key in keys:
        start[(top - key if descending else key) + 1] += 1
    for key in range(n_keys):
        start[key + 1] += start[key]
    out = np.empty(keys.shape[0], dtype=np.int64)
    for i in range(keys.shape[0]):
        key = top - keys[i] if descending else keys[i]
        out[start[key]] = i
        start[key] += 1
    return out


@numba.njit(cache=True)
def longest_first_of(items, lengths, n_keys):
    """`items` longest first by `lengths[item]`, ties in their given order: `items[longest_first(lengths[items])]`
    without the gathered lengths and the positions (two item-sized arrays, one random gather less).

    Args:
        items: int64 (m,) — positions into `lengths`.
        lengths: int (n,) — non-negative, each below `n_keys`.
        n_keys: int — one past the largest length.
    Returns: int64 (m,).
    """
    start = np.zeros(n_keys + 1, dtype=np.int64)
    top = n_keys - 1
    for item in items:
        start[top - lengths[item] + 1] += 1
    for key in range(n_keys):
        start[key + 1] += start[key]
    out = np.empty(items.shape[0], dtype=np.int64)
    for item in items:
        key = top - lengths[item]
        out[start[key]] = item
        start[key] += 1
    return out


def longest_first(lengths: np.ndarray) -> np.ndarray:
    """Positions of non-negative `lengths` longest first, ties in position order (stable)."""
    if lengths.shape[0] == 0:
        return np.zeros(0, dtype=np.int64)
    return stable_order(lengths.astype(np.int64, copy=False), int(lengths.max()) + 1, True)

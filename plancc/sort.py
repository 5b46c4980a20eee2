"""Stable orderings of small-range integer keys in O(n): the counting sort behind packing and balancing.

Plans sort 10M positions by length (at most the row capacity) or by row (fewer rows than samples) several times
an epoch; a comparison sort costs n log n and an int64 index array per call, a counting sort one pass over the
keys and one over the range. The order is the unique stable one, the same as `np.argsort(keys, kind="stable")`.
"""

from __future__ import annotations

import numpy as np

from plancc.jit import numba


@numba.njit(cache=True)
def stable_order(keys, n_keys, descending=False):
    """Positions of `keys` (integers in [0, n_keys)) in ascending key order (descending with `descending`), ties in
    position order."""
    start = np.zeros(n_keys + 1, dtype=np.int64)
    top = n_keys - 1
    for k in keys:
        start[(top - k if descending else k) + 1] += 1
    for k in range(n_keys):
        start[k + 1] += start[k]
    out = np.empty(keys.shape[0], dtype=np.int64)
    for i in range(keys.shape[0]):
        k = top - keys[i] if descending else keys[i]
        out[start[k]] = i
        start[k] += 1
    return out


def longest_first(lengths: np.ndarray) -> np.ndarray:
    """Positions of non-negative `lengths` longest first, ties in position order (stable)."""
    if lengths.shape[0] == 0:
        return np.zeros(0, dtype=np.int64)
    return stable_order(lengths.astype(np.int64, copy=False), int(lengths.max()) + 1, True)

"""The per-sample 64-bit content hash of (`input_ids`, `labels`), as a compiled loop.

Kept apart from `fingerprint` so that checking a plan's digests (which the runtime does on open) never loads
numba; only hashing tokens does.
"""

from __future__ import annotations

import numpy as np

from plancc.core.jit import numba


@numba.njit(cache=True, inline="always")
def _round(state, word):
    """Mix one 64-bit `word` into the running hash `state` (both uint64): multiply, rotate, multiply."""
    state = state ^ (word * np.uint64(0xC2B2AE3D27D4EB4F))
    state = (state << np.uint64(31)) | (state >> np.uint64(33))
    return state * np.uint64(0x9E3779B185EBCA87)


@numba.njit(cache=True, inline="always")
def _avalanche(state):
    """The final mix of a hash `state` (uint64): every input bit reaches every output bit."""
    state = state ^ (state >> np.uint64(33))
    state = state * np.uint64(0xC2B2AE3D27D4EB4F)
    state = state ^ (state >> np.uint64(29))
    state = state * np.uint64(0x165667B19E3779F9)
    return state ^ (state >> np.uint64(32))


@numba.njit(cache=True)
def hash_pairs(ids, ids_offsets, labels, labels_offsets):
    """One hash per sample i over ids[ids_offsets[i]:ids_offsets[i+1]] and the same slice of labels.

    Args:
        ids: int (tokens,) — every sample's input ids, concatenated.
        ids_offsets: int64 (samples + 1,) — where each sample's ids start.
        labels: int (labels,) — every sample's labels, concatenated (-100 included: hashed as uint32).
        labels_offsets: int64 (samples + 1,) — where each sample's labels start.
    Returns: uint64 (samples,).
    """
    n = ids_offsets.shape[0] - 1
    out = np.empty(n, dtype=np.uint64)
    for i in range(n):
        ids_lo, ids_hi = ids_offsets[i], ids_offsets[i + 1]
        labels_lo, labels_hi = labels_offsets[i], labels_offsets[i + 1]
        state = np.uint64(0x27D4EB2F165667C5) ^ np.uint64(ids_hi - ids_lo)
        for j in range(ids_lo, ids_hi):
            state = _round(state, np.uint64(np.uint32(ids[j])))
        state = _round(state, np.uint64(labels_hi - labels_lo) ^ np.uint64(0xFFFFFFFF00000000))
        for j in range(labels_lo, labels_hi):
            state = _round(state, np.uint64(np.uint32(labels[j])))
        out[i] = _avalanche(state)
    return out

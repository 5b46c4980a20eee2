"""The per-sample 64-bit content hash of (`input_ids`, `labels`), as a compiled loop.

Kept apart from `fingerprint` so that checking a plan's digests (which the runtime does on open) never loads
numba; only hashing tokens does.
"""

from __future__ import annotations

import numpy as np

from plancc.jit import numba


@numba.njit(cache=True, inline="always")
def _round(h, v):
    h = h ^ (v * np.uint64(0xC2B2AE3D27D4EB4F))
    h = (h << np.uint64(31)) | (h >> np.uint64(33))
    return h * np.uint64(0x9E3779B185EBCA87)


@numba.njit(cache=True, inline="always")
def _avalanche(h):
    h = h ^ (h >> np.uint64(33))
    h = h * np.uint64(0xC2B2AE3D27D4EB4F)
    h = h ^ (h >> np.uint64(29))
    h = h * np.uint64(0x165667B19E3779F9)
    return h ^ (h >> np.uint64(32))


@numba.njit(cache=True)
def hash_pairs(ids, ids_offsets, labels, labels_offsets):
    """One hash per sample i over ids[ids_offsets[i]:ids_offsets[i+1]] and the same slice of labels."""
    n = ids_offsets.shape[0] - 1
    out = np.empty(n, dtype=np.uint64)
    for i in range(n):
        a0, a1 = ids_offsets[i], ids_offsets[i + 1]
        b0, b1 = labels_offsets[i], labels_offsets[i + 1]
        h = np.uint64(0x27D4EB2F165667C5) ^ np.uint64(a1 - a0)
        for j in range(a0, a1):
            h = _round(h, np.uint64(np.uint32(ids[j])))
        h = _round(h, np.uint64(b1 - b0) ^ np.uint64(0xFFFFFFFF00000000))
        for j in range(b0, b1):
            h = _round(h, np.uint64(np.uint32(labels[j])))
        out[i] = _avalanche(h)
    return out

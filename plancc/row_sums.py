"""Per-row sums of a plan's samples in one pass: tokens, supervised targets and squared lengths (attention work).

Every summary of a plan (each stage's metrics, the plan table's columns, validate) reduces per-sample facts over
rows. The samples sit in plan order, so each fact is a random read into the samples table; at 10M samples one such
gather costs about as much as everything else in a reduction, and a summary needed five of them. Here each
sample's length, label count and first-label flag are packed into one int64 (`pack_facts`), so one read per sample
gives all three sums; from PARALLEL_FROM samples rows are split over threads (integer sums per row: the same result
on any thread count).
"""

from __future__ import annotations

import numpy as np

from plancc.jit import numba

NONE, SAMPLE, ROW = 0, 1, 2  # how a row's targets follow from its samples' label counts (plan.SampleArrays.targets)
LABEL_BITS = 31  # label counts below 2**31 (lengths too: both are token counts of one sample)


def pack_facts(length: np.ndarray, label_count: np.ndarray, first_label_supervised: np.ndarray) -> np.ndarray:
    """length << 32 | label_count << 1 | first_label_supervised, one int64 a sample."""
    return (length.astype(np.int64) << 32) | (label_count.astype(np.int64) << 1) | first_label_supervised


PARALLEL_FROM = 500_000  # samples from which threads pay: below, starting them costs more than the pass


@numba.njit(cache=True, inline="always")
def _row(samples, lo, hi, facts, shift, mask):
    """(tokens, targets, squared lengths) of the samples at positions lo..hi-1 (one row)."""
    tok = 0
    tgt = 0
    sq = 0
    for k in range(lo, hi):
        f = facts[samples[k]]
        x = f >> 32
        tok += x
        sq += x * x
        tgt += (f >> 1) & mask
        if shift == SAMPLE or (shift == ROW and k == lo):
            tgt -= f & 1
    return tok, tgt, sq


@numba.njit(cache=True)
def row_sums(samples, row_bounds, facts, shift):
    """(tokens, targets, squared lengths) per row; `shift` is NONE, SAMPLE (every sample's first label is no
    target) or ROW (only the first sample's of each row)."""
    n = row_bounds.shape[0] - 1
    out = np.zeros((3, n), dtype=np.int64)
    for r in range(n):
        out[0, r], out[1, r], out[2, r] = _row(samples, row_bounds[r], row_bounds[r + 1], facts, shift,
                                               (1 << LABEL_BITS) - 1)
    return out


@numba.njit(cache=True, parallel=True)
def row_sums_threaded(samples, row_bounds, facts, shift):
    """`row_sums` with rows split over threads (for PARALLEL_FROM samples and more)."""
    n = row_bounds.shape[0] - 1
    out = np.zeros((3, n), dtype=np.int64)
    for r in numba.prange(n):
        out[0, r], out[1, r], out[2, r] = _row(samples, row_bounds[r], row_bounds[r + 1], facts, shift,
                                               (1 << LABEL_BITS) - 1)
    return out

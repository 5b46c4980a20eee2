"""Per-row sums of a plan's samples in one pass: tokens, supervised targets and squared lengths (attention work).

Every summary of a plan (each stage's metrics, the plan table's columns, validate) reduces per-sample facts over
rows. The samples sit in plan order, so each fact is a random read into the samples table; at scale one such gather
costs about as much as everything else in a reduction, and a summary needed five of them. Here each
sample's length, label count and first-label flag are packed into one int64 (`pack_facts`), so one read per sample
gives all three sums; from PARALLEL_FROM samples rows are split over threads (integer sums per row: the same result
on any thread count).
"""

from __future__ import annotations

import numpy as np

from plancc.core.jit import numba

NONE, SAMPLE, ROW = 0, 1, 2  # how a row's targets follow from its samples' label counts (plan.SampleArrays.targets)
LABEL_BITS = 31  # label counts below 2**31 (lengths too: both are token counts of one sample)


def pack_facts(length: np.ndarray, label_count: np.ndarray, first_label_supervised: np.ndarray) -> np.ndarray:
    """length << 32 | label_count << 1 | first_label_supervised, one int64 a sample."""
    return (length.astype(np.int64) << 32) | (label_count.astype(np.int64) << 1) | first_label_supervised


PARALLEL_FROM = 500_000  # samples from which threads pay: below, starting them costs more than the pass


@numba.njit(cache=True, inline="always")
def _row(samples, lo, hi, facts, shift, mask):
    """(tokens, targets, squared lengths) of the samples at positions lo..hi-1 (one row).

    Args:
        samples: int64 (positions,) — sample at each plan position.
        lo, hi: int — the row's positions.
        facts: int64 (samples,) — `pack_facts` of each sample.
        shift: int — NONE, SAMPLE or ROW.
        mask: int — (1 << LABEL_BITS) - 1, the label count's bits.
    """
    tokens = 0
    targets = 0
    squares = 0
    for pos in range(lo, hi):
        fact = facts[samples[pos]]
        length = fact >> 32
        tokens += length
        squares += length * length
        targets += (fact >> 1) & mask
        if shift == SAMPLE or (shift == ROW and pos == lo):
            targets -= fact & 1
    return tokens, targets, squares


@numba.njit(cache=True)
def row_sums(samples, row_bounds, facts, shift):
    """(tokens, targets, squared lengths) per row; `shift` is NONE, SAMPLE (every sample's first label is no
    target) or ROW (only the first sample's of each row).

    Args:
        samples: int64 (positions,) — sample at each plan position.
        row_bounds: int64 (rows + 1,) — CSR of positions per row.
        facts: int64 (samples,) — `pack_facts` of each sample.
        shift: int — NONE, SAMPLE or ROW.
    Returns: int64 (3, rows).
    """
    n = row_bounds.shape[0] - 1
    out = np.zeros((3, n), dtype=np.int64)
    for row in range(n):
        out[0, row], out[1, row], out[2, row] = _row(samples, row_bounds[row], row_bounds[row + 1], facts, shift,
                                                     (1 << LABEL_BITS) - 1)
    return out


@numba.njit(cache=True, parallel=True)
def row_sums_threaded(samples, row_bounds, facts, shift):
    """`row_sums` with rows split over threads (for PARALLEL_FROM samples and more); args as `row_sums`."""
    n = row_bounds.shape[0] - 1
    out = np.zeros((3, n), dtype=np.int64)
    for row in numba.prange(n):
        out[0, row], out[1, row], out[2, row] = _row(samples, row_bounds[row], row_bounds[row + 1], facts, shift,
                                                     (1 << LABEL_BITS) - 1)
    return out

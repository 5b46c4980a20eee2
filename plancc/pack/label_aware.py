"""Label-aware decreasing fit into a fixed number of rows: the repacker behind packed microbatch balance.

Plain best-fit-decreasing fills rows one after another with the longest samples that still fit, which is why it
reaches the rows lower bound on SFT mixes: the last rows of a window take the smallest samples and close the gaps.
It also makes label counts follow sample length (rows of long prompts hold few labels). This sibling keeps the
same sequential, longest-first filling but, at each step, looks at the few longest samples that fit (at most
`lookahead`, none shorter than `ratio` x the longest) and takes the one that steers the row's expected final
label count closest to its target::

    free 3000, labels 1200, target 4000, density of what is left 0.4
    candidates (len, labels): (2900, 300) -> 1200+300+0.4*100 = 1540     (2850, 2400) -> 3660   <- taken

Items keep near-decreasing order, so density stays close to plain first-fit; the result is rejected by the caller
when an item is left over (it never opens an extra row). Targets are per microbatch (rows of a microbatch share
it), recomputed from what is left so the last rows are not starved.
"""

from __future__ import annotations

import numba
import numpy as np


@numba.njit(cache=True)
def _find(nxt, i):
    """Next unused index >= i (path-halving union-find over 'used' items)."""
    while nxt[i] != i:
        nxt[i] = nxt[nxt[i]]
        i = nxt[i]
    return i


@numba.njit(cache=True)
def pack_rows_label_aware(lengths, v_first, v_other, caps, row_mb, n_mb, lookahead, ratio, out_row, out_rank):
    """Fill rows (in order) with all items; True if every item found a row.

    `lengths` must be sorted in decreasing order. `v_first`/`v_other`: the item's targets when it starts a row /
    when it does not (they differ only under row shift). `out_row`, `out_rank`: row and placement rank per item.
    """
    n = lengths.shape[0]
    n_rows = caps.shape[0]
    nxt = np.arange(n + 1)  # nxt[n] = n: sentinel "no item"
    # items sorted decreasing: the first index whose length <= f is found by binary search on -lengths
    neg = -lengths
    left_tok = 0
    left_val = 0.0
    for i in range(n):
        left_tok += lengths[i]
        left_val += v_other[i]
    mb_rows_left = np.zeros(n_mb, dtype=np.int64)
    for r in range(n_rows):
        mb_rows_left[row_mb[r]] += 1
    mb_val = np.zeros(n_mb, dtype=np.float64)
    placed = 0
    rows_left = n_rows
    for r in range(n_rows):
        mb = row_mb[r]
        free = caps[r]
        val = 0.0
        rank = 0
        # this row's target: the microbatch's share of what is left, spread over its remaining rows
        share = left_val / max(rows_left, 1)
        target_mb_rest = share * mb_rows_left[mb]
        target = (target_mb_rest - 0.0) / mb_rows_left[mb]
        if rows_left == 1:
            target = 1e300  # last row: take everything that fits
        density = left_val / left_tok if left_tok > 0 else 0.0
        while True:
            start = np.searchsorted(neg, -free)
            i = _find(nxt, start)
            if i >= n:
                break
            longest = lengths[i]
            best = i
            if rows_left > 1:
                best_score = 1e300
                j = i
                seen = 0
                while j < n and seen < lookahead and lengths[j] >= ratio * longest:
                    v = v_first[j] if rank == 0 else v_other[j]
                    expect = val + v + density * (free - lengths[j])
                    sc = abs(expect - target)
                    if sc < best_score:
                        best_score = sc
                        best = j
                    seen += 1
                    j = _find(nxt, j + 1)
            v = v_first[best] if rank == 0 else v_other[best]
            out_row[best] = r
            out_rank[best] = rank
            rank += 1
            val += v
            free -= lengths[best]
            left_tok -= lengths[best]
            left_val -= v_other[best]
            nxt[best] = best + 1
            placed += 1
        mb_val[mb] += val
        mb_rows_left[mb] -= 1
        rows_left -= 1
    return placed == n

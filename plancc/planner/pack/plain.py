"""Best-fit-decreasing packing into rows: the plain packer behind the `before` plan.

Items are taken longest first (ties in a seeded random order) and each goes to the open row whose free space is
the smallest that still fits it (`best_fit`). On SFT length mixes this lands on the rows lower bound
`ceil(tokens / capacity)` or a row or two above it. Where rows hold many samples (CROWDED on average) and best fit
ends more than 0.01% above the bound, the emptiest row is emptied into the others (`left_out.close_left_out`)
until it is within 0.01%; a try that does not close leaves the packing as it was.

Why not down to the bound: the spare rows kept are the free space label balancing trades through. At exactly the
bound its repacking cannot close the rows and balance falls far short, and rows of few samples keep best fit's
spare row, which costs a few hundredths of a percent of rows and buys most of their label balance
(docs/benchmarks.md has the figures).
"""

from __future__ import annotations

import numpy as np

from plancc.planner.pack.best_fit import best_fit
from plancc.planner.pack.left_out import close_left_out
from plancc.planner.sort import longest_first_of, stable_order

REPAIRS = 8  # rows more than 0.01% above the lower bound that the plain packing tries to give back
CROWDED = 16  # samples a row on average from which rows above the lower bound are given back


def pack_best_fit(lengths: np.ndarray, capacity: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Pack items of `lengths` (each <= capacity) into rows; return (items in row order, row bounds).

    Rows come out in a seeded random order; inside a row, items keep their placement order.
    """
    n = lengths.shape[0]
    longest = int(lengths.max()) if n else 0
    if longest > capacity:
        raise ValueError(f"an item of length {longest} exceeds the row capacity {capacity}")
    order = longest_first_of(rng.permutation(n), lengths, longest + 1)  # each item-sized array freed once used
    sizes = lengths[order].astype(np.int64, copy=False)
    assign, rows = best_fit(sizes, int(capacity), np.zeros(0, dtype=np.int64), True)
    assign, rows = _give_back_rows(sizes, assign, rows, int(capacity), rng)
    del sizes
    new_row = rng.permutation(rows)[assign]  # rows in a seeded random order: each item's new row
    del assign
    by_row = stable_order(new_row, rows)
    bounds = np.zeros(rows + 1, dtype=np.int64)
    np.cumsum(np.bincount(new_row, minlength=rows), out=bounds[1:])
    return order[by_row].astype(np.int64, copy=False), bounds


def _give_back_rows(sizes: np.ndarray, assign: np.ndarray, rows: int, capacity: int, rng: np.random.Generator
                    ) -> tuple[np.ndarray, int]:
    """(`assign`, `rows`) with up to REPAIRS emptiest rows emptied into the others' gaps while more than 0.01%
    above the lower bound and rows are CROWDED; each try that does not close ends it, the packing as it was."""
    lower = -(-int(sizes.sum()) // capacity)
    for _ in range(REPAIRS):
        if rows <= lower + lower // 10_000 or sizes.shape[0] < CROWDED * lower:
            break
        worst = int(np.argmin(np.bincount(assign, sizes, minlength=rows)))
        trial = np.where(assign == worst, -1, assign - (assign > worst))
        if not close_left_out(sizes, trial, np.zeros(rows - 1, dtype=np.int64), capacity, rng):
            break
        assign, rows = trial, rows - 1
    return assign, rows

"""Microbatch balance for `packed`: equalize supervised-label counts across microbatches (SPEC 5, stage 2).

Trades samples between pairs of microbatches inside windows of at most `balance_window` microbatches, for
`balance_passes` passes (see `_exchange` for the trade). Windows are stratified: each pass sorts the microbatches
by label count and deals them round-robin into windows, so every window holds heavy and light microbatches and its
mean sits near the plan's mean. Trades keep every row within its capacity (and the plan's peak cost), never raise a
pair's padded cost, and never add or remove a row; the tail is not touched.

Against the reference's swap-then-repack on contiguous windows, this trades subsets (up to three samples a side)
with a new partner every round, which still finds equal-length trades when first-fit-decreasing has filled rows
to 99.99% (where repacking a window cannot close it again: measured, only windows holding a half-empty row
repack into the same row count), and the stratified windows let labels flow across the whole epoch rather than
only inside one window. The before plan stays the plain first-fit-decreasing packing.
"""

from __future__ import annotations

import numpy as np

from plancc.balance import _common as c
from plancc.config import PlanSettings
from plancc.plan import Batches, SampleArrays

ROUNDS = 64  # pairing rounds per window and pass (a window stops early after IDLE idle rounds)
TOL = 0.01  # label gaps under 1% of the mean microbatch are not worth a trade


def balance_microbatches(b: Batches, s: SampleArrays, settings: PlanSettings, rng: np.random.Generator) -> Batches:
    window = settings.balance_window
    return c.exchange(b, s, settings, windows=lambda p, v: c.stratified_windows(v, window),
                      passes=settings.balance_passes, rounds=ROUNDS, tol_share=TOL)

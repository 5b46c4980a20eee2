"""Accumulation-aware ordering (SPEC 5, stage 3): whole microbatches reordered so every update's label total is even.

Groups of at most 16 complete updates (`W*G` microbatches each) are reassigned independently, first blocks of
neighbouring updates, then groups dealt from the updates sorted by total (each group spans heavy and light updates,
so its mean sits at the global mean and totals even out across the epoch, not only inside a block): microbatches go
largest label count first into the update with the smallest total that still has a free slot (longest-processing-
time with cardinality), then the update with the largest total and the one with the smallest trade the pair of
microbatches whose difference best halves their gap, until no trade narrows it. A block's new order is kept only
if the variance of its update totals drops. Microbatch contents, costs and the tail never change::

    labels 9 9 1 1 (W*G = 2)   before: updates (9+9, 1+1) = 18, 2    after: (9+1, 9+1) = 10, 10
"""

from __future__ import annotations

import numpy as np

from plancc.balance import _common as c
from plancc.config import PlanSettings
from plancc.jit import numba
from plancc.plan import Batches, SampleArrays, batch_targets, permute_batches

BLOCK_UPDATES = 16
MAX_TRADES = 256  # per block
PASSES = 2  # contiguous blocks, then stratified groups of updates


@numba.njit(cache=True)
def _assign_block(values, n_upd, per_update):
    """New order (positions into `values`) grouping them into `n_upd` updates of `per_update` with even totals."""
    n = values.shape[0]
    order = np.argsort(-values, kind="mergesort")
    total = np.zeros(n_upd, dtype=np.int64)
    filled = np.zeros(n_upd, dtype=np.int64)
    upd = np.empty(n, dtype=np.int64)
    for x in range(n):
        p = order[x]
        best = -1
        for u in range(n_upd):
            if filled[u] < per_update and (best < 0 or total[u] < total[best]):
                best = u
        upd[p] = best
        total[best] += values[p]
        filled[best] += 1
    for _ in range(MAX_TRADES):
        hi = np.argmax(total)
        lo = np.argmin(total)
        gap = total[hi] - total[lo]
        if gap <= 0:
            break
        best_new = gap
        bp = -1
        bq = -1
        for p in range(n):
            if upd[p] != hi:
                continue
            for q in range(n):
                if upd[q] != lo:
                    continue
                d = values[p] - values[q]
                new_gap = abs(gap - 2 * d)
                if d > 0 and new_gap < best_new:
                    best_new = new_gap
                    bp = p
                    bq = q
        if bp < 0:
            break
        d = values[bp] - values[bq]
        upd[bp] = lo
        upd[bq] = hi
        total[hi] -= d
        total[lo] += d
    return np.argsort(upd, kind="mergesort")


def order_for_accumulation(b: Batches, s: SampleArrays, settings: PlanSettings) -> Batches:
    """The stage: `b`'s complete updates reordered by `update_order` on their microbatch label counts."""
    per_update = settings.batches_per_update
    n_span = c.span(b, settings)
    if per_update < 2 or n_span // per_update < 2:
        return b
    order = update_order(batch_targets(b, s, settings.shift)[:n_span].astype(np.int64), per_update)
    if order is None:
        return b
    perm = np.arange(b.num_batches, dtype=np.int64)
    perm[:n_span] = order
    return permute_batches(b, perm)


def update_order(labels: np.ndarray, per_update: int) -> np.ndarray | None:
    """A new order of the microbatches of `labels` (label count each; a whole number of updates of `per_update`)
    whose update totals are more even, or None if no block's variance drops (see the module docstring)."""
    n_upd = labels.shape[0] // per_update
    slots = np.arange(labels.shape[0], dtype=np.int64).reshape(n_upd, per_update)  # microbatch in each slot
    changed = False
    for p in range(PASSES):
        totals = labels[slots].sum(axis=1)
        if p == 0:  # neighbouring updates first
            bounds, members = c.contiguous_windows(n_upd, BLOCK_UPDATES)
        else:  # then groups of updates spanning the whole range of totals, so every group's mean is the global one
            bounds, members = c.stratified_windows(totals, BLOCK_UPDATES)
        changed |= _reorder_groups(labels, slots, bounds, members, per_update)
    return slots.reshape(-1) if changed else None


@numba.njit(cache=True)
def _reorder_groups(labels, slots, bounds, members, per_update):
    """Each group of updates (CSR `bounds` over `members`) reassigned by `_assign_block`, in place in `slots`, where
    its update totals' variance drops; True if any did. A group's label total is fixed, so the variance drops
    exactly when the sum of squared totals does (integers: no rounding decides)."""
    changed = False
    for g in range(bounds.shape[0] - 1):
        upd = np.sort(members[bounds[g]:bounds[g + 1]])
        k = upd.shape[0]
        if k < 2:
            continue
        held = np.empty(k * per_update, dtype=np.int64)
        for i in range(k):
            held[i * per_update:(i + 1) * per_update] = slots[upd[i]]
        vals = labels[held]
        new = _assign_block(vals, k, per_update)
        before = 0
        after = 0
        for i in range(k):
            tb = 0
            ta = 0
            for j in range(i * per_update, (i + 1) * per_update):
                tb += vals[j]
                ta += vals[new[j]]
            before += tb * tb
            after += ta * ta
        if after < before:
            for i in range(k):
                slots[upd[i]] = held[new[i * per_update:(i + 1) * per_update]]
            changed = True
    return changed

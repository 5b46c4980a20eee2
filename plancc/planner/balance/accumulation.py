"""Accumulation-aware ordering (docs/spec.md §5, stage 3): whole microbatches reordered so every update's label total is even.

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

from plancc.config.settings import PlanSettings
from plancc.core.jit import numba
from plancc.core.plan_arrays import Batches, SampleArrays, batch_targets, permute_batches
from plancc.planner.balance import _common as common
from plancc.planner.balance._subset_tables import radix_order

BLOCK_UPDATES = 16
MAX_TRADES = 256  # per block
PASSES = 2  # contiguous blocks, then stratified groups of updates


@numba.njit(cache=True)
def _assign_block(values, n_updates, per_update):
    """New order (positions into `values`) grouping them into `n_updates` updates of `per_update` with even totals:
    largest first into the lightest update with a free slot, then trades between the heaviest and the lightest.

    Args:
        values: int64 (n_updates * per_update,) — label count of each microbatch of the block.
        n_updates: int — updates of the block.
        per_update: int — microbatches an update.
    Returns: int64 (n_updates * per_update,) — positions into `values`, update by update.
    """
    n = values.shape[0]
    order, scratch, digits = np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64), np.empty(257, dtype=np.int64)
    radix_order(values.max() - values, n, order, scratch, digits)  # largest first, ties in position order
    total = np.zeros(n_updates, dtype=np.int64)
    filled = np.zeros(n_updates, dtype=np.int64)
    update_of = np.empty(n, dtype=np.int64)
    for x in range(n):
        mb = order[x]
        best = -1
        for update in range(n_updates):
            if filled[update] < per_update and (best < 0 or total[update] < total[best]):
                best = update
        update_of[mb] = best
        total[best] += values[mb]
        filled[best] += 1
    for _ in range(MAX_TRADES):
        heavy, light = 0, 0  # the first heaviest and the first lightest update
        for update in range(n_updates):
            if total[update] > total[heavy]:
                heavy = update
            if total[update] < total[light]:
                light = update
        gap = total[heavy] - total[light]
        if gap <= 0:
            break
        best_gap, best_from, best_to = gap, -1, -1
        for give in range(n):
            if update_of[give] != heavy:
                continue
            for take in range(n):
                if update_of[take] != light:
                    continue
                moved = values[give] - values[take]
                new_gap = abs(gap - 2 * moved)
                if moved > 0 and new_gap < best_gap:
                    best_gap, best_from, best_to = new_gap, give, take
        if best_from < 0:
            break
        moved = values[best_from] - values[best_to]
        update_of[best_from] = light
        update_of[best_to] = heavy
        total[heavy] -= moved
        total[light] += moved
    radix_order(update_of, n, order, scratch, digits)  # update by update, each in position order
    return order


def order_for_accumulation(batches: Batches, samples: SampleArrays, settings: PlanSettings) -> Batches:
    """The stage: `batches`'s complete updates reordered by `update_order` on their microbatch label counts."""
    per_update = settings.batches_per_update
    n_span = common.span(batches, settings)
    if per_update < 2 or n_span // per_update < 2:
        return batches
    order = update_order(batch_targets(batches, samples, settings.shift)[:n_span].astype(np.int64), per_update)
    if order is None:
        return batches
    perm = np.arange(batches.num_batches, dtype=np.int64)
    perm[:n_span] = order
    return permute_batches(batches, perm)


def update_order(labels: np.ndarray, per_update: int) -> np.ndarray | None:
    """A new order of the microbatches of `labels` (label count each; a whole number of updates of `per_update`)
    whose update totals are more even, or None if no block's variance drops (see the module docstring)."""
    n_upd = labels.shape[0] // per_update
    slots = np.arange(labels.shape[0], dtype=np.int64).reshape(n_upd, per_update)  # microbatch in each slot
    changed = False
    for p in range(PASSES):
        totals = labels[slots].sum(axis=1)
        if p == 0:  # neighbouring updates first
            bounds, members = common.contiguous_windows(n_upd, BLOCK_UPDATES)
        else:  # then groups of updates spanning the whole range of totals, so every group's mean is the global one
            bounds, members = common.stratified_windows(totals, BLOCK_UPDATES)
        group = np.repeat(np.arange(bounds.shape[0] - 1), np.diff(bounds))
        changed |= _reorder_groups(labels, slots, bounds, members[np.lexsort((members, group))], per_update)
    return slots.reshape(-1) if changed else None


@numba.njit(cache=True)
def _reorder_groups(labels, slots, bounds, members, per_update):
    """Each group of updates reassigned by `_assign_block`, in place in `slots`, where its update totals' variance
    drops; True if any did. A group's label total is fixed, so the variance drops exactly when the sum of squared
    totals does (integers: no rounding decides).

    Args:
        labels: int64 (microbatches,) — label count of each microbatch.
        slots: int64 (updates, per_update) — the microbatch in each slot of each update, changed in place.
        bounds, members: int64 — CSR of the groups (bounds per group over `members`, update indices ascending).
        per_update: int — microbatches an update.
    """
    changed = False
    for group in range(bounds.shape[0] - 1):
        updates = members[bounds[group]:bounds[group + 1]]
        k = updates.shape[0]
        if k < 2:
            continue
        held = np.empty(k * per_update, dtype=np.int64)  # (loops, not slice copies: see `radix_order`)
        for i in range(k):
            for j in range(per_update):
                held[i * per_update + j] = slots[updates[i], j]
        values = labels[held]
        new = _assign_block(values, k, per_update)
        before = 0
        after = 0
        for i in range(k):
            total_before = 0
            total_after = 0
            for j in range(i * per_update, (i + 1) * per_update):
                total_before += values[j]
                total_after += values[new[j]]
            before += total_before * total_before
            after += total_after * total_after
        if after < before:
            for i in range(k):
                for j in range(per_update):
                    slots[updates[i], j] = held[new[i * per_update + j]]
            changed = True
    return changed

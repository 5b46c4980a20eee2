"""Rank ordering (SPEC 5, stage 5, W > 1): ranks do similar work at the same micro-step.

Inside each complete update, microbatch `m*W + r` runs on rank `r` at micro-step `m`. The update's microbatches are
sorted by (work, labels) and dealt `W` at a time into micro-steps, which groups similar work into the same step
(consecutive runs of a sorted list minimize the sum of ranges). Work is the padded token slots (`--cost tokens`) or
the attention work, the sum of squared segment lengths (`--cost attention`): at equal tokens, a microbatch of one
long sample spends far more on attention than one of many short ones, and ranks wait on the slowest. An update's new order is kept only when neither the
sum nor the maximum of its per-step cost spreads grows and one of them (or, at equal cost spread, the label spread)
shrinks. Update membership never changes; the tail stays in place.
"""

from __future__ import annotations

import numpy as np

from plancc.balance import _common as c
from plancc.config import PlanSettings
from plancc.plan import Batches, SampleArrays, batch_attention, batch_cost, batch_targets, permute_batches


def _spreads(x: np.ndarray, W: int) -> tuple[np.ndarray, np.ndarray]:
    """(sum, max) over micro-steps of each update's rank spread; x has shape (updates, W*G)."""
    steps = x.reshape(x.shape[0], -1, W)
    spread = steps.max(axis=2) - steps.min(axis=2)
    return spread.sum(axis=1), spread.max(axis=1)


def order_ranks(b: Batches, s: SampleArrays, settings: PlanSettings) -> Batches:
    W, P = settings.world_size, settings.batches_per_update
    n_span = c.span(b, settings)
    if W < 2 or n_span == 0:
        return b
    n_upd = n_span // P
    if settings.cost == "attention":
        cost = batch_attention(b, s, settings.mode, settings.pad_multiple)[:n_span].reshape(n_upd, P)
    else:
        cost = batch_cost(b, s, settings.pad_multiple)[:n_span].reshape(n_upd, P)
    labels = batch_targets(b, s, settings.shift)[:n_span].reshape(n_upd, P)
    new = np.lexsort((-labels, -cost), axis=1)  # most work first, then most labels; ties keep their order
    rows = np.arange(n_upd)[:, None]
    c_sum0, c_max0 = _spreads(cost, W)
    c_sum1, c_max1 = _spreads(cost[rows, new], W)
    l_sum0, l_max0 = _spreads(labels, W)
    l_sum1, l_max1 = _spreads(labels[rows, new], W)
    not_worse = (c_sum1 <= c_sum0) & (c_max1 <= c_max0)
    better = (c_sum1 < c_sum0) | (c_max1 < c_max0)
    tie_better = (c_sum1 == c_sum0) & (c_max1 == c_max0) & (l_sum1 <= l_sum0) & (l_max1 <= l_max0) & (
        (l_sum1 < l_sum0) | (l_max1 < l_max0))
    keep = not_worse & (better | tie_better)
    if not keep.any():
        return b
    local = np.where(keep[:, None], new, np.arange(P)[None, :])
    perm = np.arange(b.num_batches, dtype=np.int64)
    perm[:n_span] = (local + rows * P).reshape(-1)
    return permute_batches(b, perm)

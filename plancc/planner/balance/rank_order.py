"""Rank ordering (docs/spec.md §5, stage 5, W > 1): ranks do similar work at the same micro-step and over the update.

Inside each complete update, microbatch `m*W + r` runs on rank `r` at micro-step `m`. Ranks wait for each other
at every micro-step that synchronises (FSDP) and at the update's gradient all-reduce (DDP with `no_sync`), so two
spreads matter: per micro-step (max - min over ranks) and per update (max - min of the ranks' totals).

1. Micro-steps: the update's microbatches are sorted by (work, labels) and dealt `W` at a time into micro-steps,
   which groups similar work into the same step (consecutive runs of a sorted list minimise the sum of ranges).
2. Ranks: a micro-step's members may go to its ranks in any order without changing its spread, so they are dealt
   to balance the ranks' running totals: steps widest spread first, each step's heaviest microbatch to the rank
   with the least work so far (longest-processing-time scheduling, W ranks as machines).

Work is the padded token slots (`--cost tokens`) or the attention work, the sum of squared segment lengths
(`--cost attention`): at equal tokens, a microbatch of one long sample spends far more on attention than one of
many short ones, and ranks wait on the slowest.

An update's new order is kept only when none of the per-step spread sum, the per-step spread maximum and the
rank-total spread grows and one of them (or, at equal work spreads, a label spread) shrinks; otherwise its own
micro-steps are kept and only step 2 is tried on them, kept when the rank-total spread shrinks. Update membership
never changes; the tail stays in place. Cost: two sorts of the span and G vectorised passes.
"""

from __future__ import annotations

import numpy as np

from plancc.config.settings import PlanSettings
from plancc.core.plan_arrays import (
    Batches,
    SampleArrays,
    batch_attention,
    batch_cost,
    batch_targets,
    permute_batches,
)
from plancc.planner.balance import _common as common


def order_ranks(batches: Batches, samples: SampleArrays, settings: PlanSettings) -> Batches:
    """`batches` with each complete update's microbatches reordered over (micro-step, rank) (module docstring)."""
    W, P = settings.world_size, settings.batches_per_update
    n_span = common.span(batches, settings)
    if W < 2 or n_span == 0:
        return batches
    n_upd = n_span // P
    work = rank_work(batches, samples, settings)[:n_span].reshape(n_upd, P)
    labels = batch_targets(batches, samples, settings.shift)[:n_span].reshape(n_upd, P)
    rows = np.arange(n_upd)[:, None]
    keep_own = np.arange(P)[None, :].repeat(n_upd, axis=0)
    grouped = deal_to_ranks(np.lexsort((-labels, -work), axis=1), work, W)  # most work first, ties keep order
    dealt = deal_to_ranks(keep_own, work, W)

    def score(order: np.ndarray) -> tuple[np.ndarray, ...]:
        x, y = work[rows, order], labels[rows, order]
        return (*step_spreads(x, W), total_spread(x, W), *step_spreads(y, W))

    base, new, own = score(keep_own), score(grouped), score(dealt)
    not_worse = (new[0] <= base[0]) & (new[1] <= base[1]) & (new[2] <= base[2])
    better = (new[0] < base[0]) | (new[1] < base[1]) | (new[2] < base[2])
    ties = (new[0] == base[0]) & (new[1] == base[1]) & (new[2] == base[2])
    tie_better = ties & (new[3] <= base[3]) & (new[4] <= base[4]) & ((new[3] < base[3]) | (new[4] < base[4]))
    take_new = not_worse & (better | tie_better)
    take_own = ~take_new & (own[2] < base[2])
    if not (take_new.any() or take_own.any()):
        return batches
    local = np.where(take_new[:, None], grouped, np.where(take_own[:, None], dealt, keep_own))
    perm = np.arange(batches.num_batches, dtype=np.int64)
    perm[:n_span] = (local + rows * P).reshape(-1)
    return permute_batches(batches, perm)


def rank_work(batches: Batches, samples: SampleArrays, settings: PlanSettings) -> np.ndarray:
    """Per microbatch, the work rank ordering evens out: token slots or attention work (`settings.cost`)."""
    if settings.cost == "attention":
        return batch_attention(batches, samples, settings.mode, settings.pad_multiple)
    return batch_cost(batches, samples, settings.pad_multiple)


def deal_to_ranks(order: np.ndarray, work: np.ndarray, W: int) -> np.ndarray:
    """Per update (row), `order`'s consecutive runs of W as micro-steps, each step's members dealt to ranks.

    Steps go widest spread first; inside a step the heaviest member goes to the rank with the least work so far.
    Returns local positions `m*W + r` -> microbatch, like `order`.
    """
    n_upd = order.shape[0]
    rows = np.arange(n_upd)[:, None]
    steps = order.reshape(n_upd, -1, W)  # (update, micro-step, rank); rank_order hands at least one update
    w = work[rows[:, :, None], steps]
    inner = np.argsort(-w, axis=2, kind="stable")
    steps = np.take_along_axis(steps, inner, axis=2)  # heaviest first inside each step
    w = np.take_along_axis(w, inner, axis=2)
    spread = w[:, :, 0] - w[:, :, -1]
    running = np.zeros((n_upd, W), dtype=np.int64)
    out = np.empty_like(order)
    for g in np.argsort(-spread, axis=1, kind="stable").T:  # the g-th widest step of every update
        to = np.argsort(running, axis=1, kind="stable")  # ranks, least work first
        pos = g[:, None] * W + to
        out[rows, pos] = steps[rows[:, 0], g]
        running[rows, to] += w[rows[:, 0], g]
    return out


def step_spreads(x: np.ndarray, W: int) -> tuple[np.ndarray, np.ndarray]:
    """(sum, max) over micro-steps of each update's rank spread; x has shape (updates, W*G)."""
    steps = x.reshape(x.shape[0], -1, W)
    spread = steps.max(axis=2) - steps.min(axis=2)
    return spread.sum(axis=1), spread.max(axis=1)


def total_spread(x: np.ndarray, W: int) -> np.ndarray:
    """Per update, max - min over ranks of a rank's total (x has shape (updates, W*G))."""
    totals = x.reshape(x.shape[0], -1, W).sum(axis=1)
    return totals.max(axis=1) - totals.min(axis=1)

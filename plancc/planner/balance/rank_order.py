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
micro-steps are kept and only step 2 is tried on them, kept when the rank-total spread shrinks.

3. Labels: two ranks swap their members of some micro-steps (any subset of the G steps) where that lowers the sum
   of squares of the ranks' label totals without raising the sum of squares or the spread of their work totals.
   A swap inside a step changes no step's spread, so it costs the work balance nothing, and it evens the labels
   each rank's gradient sums over. Each update takes its best such swap per pair of ranks, over two sweeps.

Update membership never changes; the tail stays in place. Cost: two sorts of the span, G vectorised passes and
2 * W * (W - 1) / 2 vectorised swap searches over 2^G - 1 step subsets.
"""

from __future__ import annotations

import itertools

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
    local = np.where(take_new[:, None], grouped, np.where(take_own[:, None], dealt, keep_own))
    local = even_rank_labels(local, work, labels, W)
    if (local == keep_own).all():
        return batches
    perm = np.arange(batches.num_batches, dtype=np.int64)
    perm[:n_span] = (local + rows * P).reshape(-1)
    return permute_batches(batches, perm)


SWEEPS = 2  # rounds over the rank pairs of step 3; a third finds next to nothing


def even_rank_labels(order: np.ndarray, work: np.ndarray, labels: np.ndarray, W: int) -> np.ndarray:
    """Step 3 (module docstring): `order` (updates, W*G; local position m*W + r -> microbatch) with members of
    micro-steps swapped between two ranks where that lowers the sum of squares of the ranks' label totals and does
    not raise that of their work totals. At a fixed pair total, a sum of squares that does not grow leaves both
    new totals between the old two, so the ranks' work spread cannot grow either."""
    n_upd = order.shape[0]
    rows = np.arange(n_upd)
    # (updates, G, W); work as floats: squared attention totals overflow int64
    o = order.reshape(n_upd, -1, W).copy()
    x = work[rows[:, None], order].reshape(o.shape).astype(np.float64)
    y = labels[rows[:, None], order].reshape(o.shape).astype(np.float64)
    G = o.shape[1]
    subsets = (np.arange(1, 1 << G)[:, None] >> np.arange(G)[None, :]) & 1  # (2^G - 1, G): steps swapped
    w_tot, l_tot = x.sum(axis=1), y.sum(axis=1)
    for _ in range(SWEEPS):
        for r1, r2 in itertools.combinations(range(W), 2):
            dw, dl = ((v[:, :, r2] - v[:, :, r1]) @ subsets.T for v in (x, y))  # (updates, subsets) moved to r1
            # half of (a + d)^2 + (b - d)^2 - a^2 - b^2 = 2d(a - b + d), for r1's total a and r2's total b
            l_gain = dl * (l_tot[:, r1] - l_tot[:, r2] + dl.T).T
            w_gain = dw * (w_tot[:, r1] - w_tot[:, r2] + dw.T).T
            score = np.where((l_gain < 0) & (w_gain <= 0), l_gain, 0.0)
            best = score.argmin(axis=1)
            take = score[rows, best] < 0
            swap = subsets[best].astype(bool) & take[:, None]  # (updates, G)
            for v in (o, x, y):
                v[swap, r1], v[swap, r2] = v[swap, r2], v[swap, r1]
            for tot, d in ((w_tot, dw), (l_tot, dl)):
                moved = np.where(take, d[rows, best], 0.0)
                tot[:, r1] += moved
                tot[:, r2] -= moved
    return o.reshape(order.shape)


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

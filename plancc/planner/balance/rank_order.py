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

3. Labels: two ranks may also swap their members of some micro-steps (any subset of the G steps) without changing
   any step's spread; that evens the label totals each rank's gradient sums over. Per update, every pair of ranks
   (in rounds of disjoint pairs) takes its best swap: two sweeps of swaps that lower the sum of squares of the
   ranks' label totals without raising that of their work totals (at a fixed pair total both new totals then lie
   between the old two), then one sweep at each of two falling prices that trade the two sums of squares (as
   shares of the update's totals), every rank's work total kept within the update's old [min, max]. The free
   sweeps and each price end on a candidate order, and each update takes one: the fewest rank label CV summed
   over the updates whose rank work CV summed is at most the free sweeps' (a Lagrange multiplier, found by
   bisection). So the work some updates give up for labels, others save: no update's slowest rank or rank work
   spread grows, and the mean rank work CV over the updates (for `--cost tokens`, the metrics' `rank_cost_cv`)
   ends at most where the free sweeps leave it.

Update membership never changes; the tail stays in place. Cost: two sorts of the span, G vectorised passes and
4 * (W - 1) vectorised rounds of W / 2 swap searches over 2^(G-1) - 1 step subsets (swapping the other steps
instead leaves the same two totals).
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
    local = np.where(take_new[:, None], grouped, np.where(take_own[:, None], dealt, keep_own))
    local = even_rank_labels(local, work, labels, W)
    if (local == keep_own).all():
        return batches
    perm = np.arange(batches.num_batches, dtype=np.int64)
    perm[:n_span] = (local + rows * P).reshape(-1)
    return permute_batches(batches, perm)


# Step 3's sweeps over the rank pairs, in order, each ending on a candidate: (price, sweeps). None: only swaps that
# raise no work sum of squares; a number: the price of the work shares' squares against the label shares'. 1e4 then
# 1e3 lower 200k flattened's rank label CV by about 0.007 over the free sweeps alone; a sweep at 1e2 after them
# would gain padded 0.0015 more for a fifth more time.
SCHEDULE = ((None, 2), (1e4, 1), (1e3, 1))


def even_rank_labels(order: np.ndarray, work: np.ndarray, labels: np.ndarray, W: int,
                     schedule: tuple[tuple[float | None, int], ...] = SCHEDULE) -> np.ndarray:
    """Step 3 (module docstring): `order` (updates, W*G; local position m*W + r -> microbatch) with members of
    micro-steps swapped between two ranks to even the ranks' label totals; each update takes one of the candidates
    that `schedule`'s sweeps end on (`choose`)."""
    blocks = np.array_split(np.arange(order.shape[0]), -(-order.shape[0] // BLOCK))
    candidates = np.concatenate([sweep_candidates(order[b], work[b], labels[b], W, schedule) for b in blocks], axis=1)
    w_cv, l_cv = (np.stack([rank_cv(x, c, W) for c in candidates]) for x in (work, labels))
    return candidates[choose(w_cv, l_cv), np.arange(order.shape[0])]


BLOCK = 512  # most updates swept at once: a round's arrays then stay in a core's cache (1.3-1.7x faster at 200k)


def sweep_candidates(order: np.ndarray, work: np.ndarray, labels: np.ndarray, W: int,
                     schedule: tuple[tuple[float | None, int], ...]) -> np.ndarray:
    """The candidate orders, (len(schedule), updates, W*G), that `schedule`'s stages end on (`even_rank_labels`)."""
    n_upd = order.shape[0]
    rows = np.arange(n_upd)[:, None]
    # work, labels and microbatch, (W, 3, G, updates): rank-major, cheap to index; floats: squared attention
    # totals overflow int64 (and every microbatch index is exact)
    v = np.stack([x[rows, order].reshape(n_upd, -1, W) for x in (work, labels)] + [order.reshape(n_upd, -1, W)])
    v = v.transpose(3, 0, 2, 1).astype(np.float64, order="C")
    tot = v[:, :2].sum(axis=2)  # (W, 2, updates)
    bounds = tot[:, 0].min(axis=0), tot[:, 0].max(axis=0)
    # a price weighs squares of shares of the update's totals, so one price fits every update and layout
    share = (np.maximum(tot[:, 1].sum(axis=0), 1) / np.maximum(tot[:, 0].sum(axis=0), 1)) ** 2
    G = v.shape[2]
    # swapping steps S or the others leaves the same two totals (exchanged), so S never holds step 0: the bits of
    # 2, 4, ..., 2^G - 2 over the steps
    subsets = ((np.arange(2, 1 << G, 2)[:, None] >> np.arange(G)) & 1).astype(np.float64)
    rounds, candidates = pair_rounds(W), []
    for price, sweeps in schedule:
        for _ in range(sweeps if G > 1 else 0):
            for r1, r2 in rounds:
                swap_pairs(v, tot, r1, r2, subsets, None if price is None else price * share, bounds)
        candidates.append(v[:, 2].astype(np.int64))
    return np.stack(candidates).transpose(0, 3, 2, 1).reshape(-1, *order.shape)


def pair_rounds(W: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Every pair of W ranks once, in rounds of disjoint pairs (round-robin), so a round swaps them all at once."""
    ring = list(range(W + W % 2))  # an odd W gets a dummy rank W, whose pair sits the round out
    out = []
    for _ in range(len(ring) - 1):
        pairs = [(ring[i], ring[-1 - i]) for i in range(len(ring) // 2)]
        r1, r2 = np.array([p for p in pairs if W not in p]).reshape(-1, 2).T
        out.append((r1, r2))
        ring.insert(1, ring.pop())
    return out


def swap_pairs(v: np.ndarray, tot: np.ndarray, r1: np.ndarray, r2: np.ndarray, subsets: np.ndarray,
               price: np.ndarray | None, bounds: tuple[np.ndarray, np.ndarray]) -> None:
    """In place (rank-major arrays of `even_rank_labels`): per update, the best swap of the members of some
    micro-steps (`subsets`, row i the bits of 2 * (i + 1) over the steps) between ranks r1[j] and r2[j] (disjoint
    pairs). It lowers the ranks' label sum of squares, raising no work sum of squares (`price` None); or it lowers
    that plus `price` (per update) times the work's, every work total staying within `bounds`."""
    v1, v2 = v[r1], v[r2]  # (pairs, 3, G, updates)
    d = subsets @ (v2[:, :2] - v1[:, :2])  # (pairs, 2, subsets, updates): moved to r1
    gap = tot[r1] - tot[r2]  # (pairs, 2, updates): r1's total less r2's
    if price is None:  # (a + d)^2 + (b - d)^2 <= a^2 + b^2 for d between 0 and b - a
        lo, hi = np.minimum(0, -gap[:, 0]), np.maximum(0, -gap[:, 0])
    else:
        lo = np.maximum(bounds[0] - tot[r1, 0], tot[r2, 0] - bounds[1])
        hi = np.minimum(bounds[1] - tot[r1, 0], tot[r2, 0] - bounds[0])
    # half the change of a^2 + b^2 when d moves from r2's total b to r1's a: d(a - b + d)
    score = d[:, 1] * (gap[:, 1, None] + d[:, 1])  # (pairs, subsets, updates)
    if price is not None:
        score += price * d[:, 0] * (gap[:, 0, None] + d[:, 0])
    score = np.where((d[:, 0] >= lo[:, None]) & (d[:, 0] <= hi[:, None]), score, 0.0)
    best = score.argmin(axis=1)[:, None]  # (pairs, 1, updates)
    take = np.take_along_axis(score, best, axis=1) < 0
    swap = ((2 * best + 2) >> np.arange(v.shape[2])[:, None] & 1).astype(bool) & take  # (pairs, G, updates)
    v[r1], v[r2] = np.where(swap[:, None], v2, v1), np.where(swap[:, None], v1, v2)
    moved = np.where(take, np.take_along_axis(d, best[:, None], axis=2)[:, :, 0], 0.0)  # (pairs, 2, updates)
    tot[r1] += moved
    tot[r2] -= moved


def choose(w_cv: np.ndarray, l_cv: np.ndarray) -> np.ndarray:
    """Per update (column), a candidate (row) of the rank work and label CVs (candidates, updates): the fewest label
    CV summed over the updates with the work CV summed at most candidate 0's, by the Lagrange multiplier
    (bisection) that just meets it; candidate 0 everywhere where that does not beat it (a multiplier reaches only
    the hull of each update's (work, label) points)."""
    cols = np.arange(w_cv.shape[1])
    budget = w_cv[0].sum()

    def pick(log_mu: float) -> np.ndarray:
        return (l_cv + 10.0 ** log_mu * w_cv).argmin(axis=0)

    lo, hi = -12.0, 12.0
    for _ in range(48):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if w_cv[pick(mid), cols].sum() <= budget else (mid, hi)
    k = pick(hi)
    if w_cv[k, cols].sum() > budget or l_cv[k, cols].sum() >= l_cv[0].sum():
        return np.zeros_like(k)
    return k


def rank_cv(x: np.ndarray, order: np.ndarray, W: int) -> np.ndarray:
    """Per update, the CV of the W ranks' totals of `x` (0 where they sum to 0); `order` (updates, W*G)."""
    totals = x[np.arange(order.shape[0])[:, None], order].reshape(order.shape[0], -1, W).sum(axis=1)
    totals = totals.astype(np.float64)
    mean = totals.mean(axis=1)
    return totals.std(axis=1) / np.where(mean > 0, mean, 1)


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

"""Padded: one-for-one swaps that even out microbatch costs, the last move of the fixed-count stage.

A padded microbatch costs its samples x its longest sample (rounded up to `--pad-multiple`), so one sample sets its
cost, and the label trades (`_exchange`) only promise not to raise the plan's cost CV: on real data that left it
where the shuffle put it, above the reference's, which trades for cost variance too and spends padding on it.
Passes alternate two pairings of the span's microbatches sorted by cost: the costliest with the cheapest (a long
non-leading sample lifts a cheap microbatch, spending padding) and neighbours in cost (a leading sample joins a
costlier microbatch, lowering its own, saving padding). Each pair makes the swap of a sample each that lowers the
plan's cost CV most per padding token spent, if the pair's label gap does not widen (label variance never rises),
the attention CV (padded rows x padded length squared) does not rise, no microbatch passes the peak, and the
padding spent stays within SPEND of what the label trades saved (padding stays below the stage input's). SPEND is
what it takes to match the reference's attention CV on every draw tried while staying under its padding: less
loses attention CV on some draws, more loses padding on others (docs/benchmarks.md has the figures).

Why it stops: after two passes in a row without a swap, at most PASSES. Cost per pass: a sort of the span's costs
and, per pair, (samples a microbatch)^2 candidate swaps.
"""

from __future__ import annotations

import numpy as np

from plancc.config.settings import PlanSettings
from plancc.core.jit import numba
from plancc.core.plan_arrays import Batches, SampleArrays, batch_cost, row_targets
from plancc.planner.balance import _common as common
from plancc.planner.sort import stable_order

PASSES = 16  # passes of pairings (two without a swap end it)
SPEND = 0.22  # share of the padding the label trades saved that evening the costs may spend
SPEND_UNIT = 4  # a swap's gain is per padding token it spends plus this many pad multiples


def even_padded_costs(batches: Batches, samples: SampleArrays, settings: PlanSettings, total_cost: int) -> Batches:
    """`batches` (padded) with samples swapped between microbatches of its span to lower the cost CV (module docstring),
    its total cost (padded size) raised to at most `total_cost`; `batches` if no swap lowers it."""
    n_span = common.span(batches, settings)
    if n_span < 2:
        return batches
    head, *tail = common.split(batches, n_span)
    lengths = samples.length[head.samples].astype(np.int64, copy=False)
    # a row per sample (a copy: the sums are shared)
    targets = row_targets(head, samples, settings.shift).astype(np.int64)
    cost = batch_cost(batches, samples, settings.pad_multiple)
    peak = int(cost.max())
    budget = SPEND * float(total_cost - cost.sum())
    take = _swap_passes(head.batch_bounds.astype(np.int64), lengths, targets, int(settings.pad_multiple), peak,
                        max(budget, 0.0), PASSES)
    if (take == np.arange(take.shape[0])).all():
        return batches
    return common.join(Batches(head.samples[take], head.row_bounds, head.batch_bounds), *tail)


@numba.njit(cache=True, inline="always")
def _cost(size, longest, pad_multiple):
    """A padded microbatch's cost: `size` samples times its `longest` sample rounded up to `pad_multiple`."""
    return size * (-(-longest // pad_multiple) * pad_multiple)


@numba.njit(cache=True)
def _longest_without(bounds, length, mb, skip):
    """Longest sample of microbatch `mb` other than position `skip` (-1: none skipped).

    Args:
        bounds: int64 (microbatches + 1,) — CSR of positions per microbatch.
        length: int64 (positions,) — tokens of each position's sample.
        mb, skip: int.
    """
    out = 0
    for x in range(bounds[mb], bounds[mb + 1]):
        if x != skip and length[x] > out:
            out = length[x]
    return out


@numba.njit(cache=True)
def _swap_passes(bounds, length, target, pad_multiple, peak, budget, passes):
    """For each position, the position whose sample moves there (the module docstring's passes).

    Args:
        bounds: int64 (microbatches + 1,) — CSR of positions per microbatch.
        length: int64 (positions,) — tokens of each position's sample.
        target: int64 (positions,) — its targets (labels).
        pad_multiple: int — `--pad-multiple`.
        peak: int — no microbatch's cost above this.
        budget: float — padding tokens the swaps may spend in all.
        passes: int — at most this many passes.
    Returns: int64 (positions,).
    """
    n_mb = bounds.shape[0] - 1
    length = length.copy()
    target = target.copy()
    take = np.arange(length.shape[0])
    cost = np.zeros(n_mb, dtype=np.float64)
    labels = np.zeros(n_mb, dtype=np.int64)
    for mb in range(n_mb):
        cost[mb] = _cost(bounds[mb + 1] - bounds[mb], _longest_without(bounds, length, mb, -1), pad_multiple)
        for x in range(bounds[mb], bounds[mb + 1]):
            labels[mb] += target[x]
    att = np.zeros(n_mb, dtype=np.float64)  # attention work: rows x padded length^2 = cost^2 / rows
    for mb in range(n_mb):
        att[mb] = cost[mb] * cost[mb] / max(bounds[mb + 1] - bounds[mb], 1)
    sums = np.array([cost.sum(), (cost * cost).sum(), att.sum(), (att * att).sum()])  # S and Q of cost, attention
    idle = 0
    for p in range(passes):
        if peak <= 8 * n_mb:  # costs are whole numbers up to the peak: a counting sort, the same stable order
            order = stable_order(cost.astype(np.int64), peak + 1)
        else:
            order = np.argsort(cost, kind="mergesort")
        swaps = 0
        extremes = p % 2 == 0
        for q in range(n_mb // 2 if extremes else n_mb - 1):
            if not extremes and q % 2 != (p // 2) % 2:
                continue
            lo = order[q]
            hi = order[n_mb - 1 - q] if extremes else order[q + 1]
            x, y, cost_hi, cost_lo = _best_swap(bounds, length, target, pad_multiple, peak, budget, hi, lo, cost,
                                                labels, att, sums)
            if x < 0:
                continue
            budget -= max(cost_hi + cost_lo - cost[hi] - cost[lo], 0.0)
            _make_swap(bounds, hi, lo, target[x] - target[y], cost_hi, cost_lo, cost, labels, att, sums)
            take[x], take[y] = take[y], take[x]
            length[x], length[y] = length[y], length[x]
            target[x], target[y] = target[y], target[x]
            swaps += 1
        idle = 0 if swaps else idle + 1
        if idle == 2:
            break
    return take


@numba.njit(cache=True)
def _best_swap(bounds, length, target, pad_multiple, peak, budget, hi, lo, cost, labels, att, sums):
    """The swap of a sample of microbatch `hi` for one of `lo` that lowers the cost CV most per padding token
    spent, within the rules of the module docstring: (position in hi, position in lo, hi's and lo's new costs),
    positions -1 if none.

    Args:
        bounds, length, target, pad_multiple, peak, budget: as `_swap_passes` (`budget`: what is left of it).
        hi, lo: int — the pair of microbatches.
        cost, att: float64 (microbatches,) — each one's cost and attention work.
        labels: int64 (microbatches,) — each one's targets.
        sums: float64 (4,) — sum and sum of squares of `cost`, then of `att`.
    """
    total, squares, att_total, att_squares = sums[0], sums[1], sums[2], sums[3]
    size_hi = bounds[hi + 1] - bounds[hi]
    size_lo = bounds[lo + 1] - bounds[lo]
    now = squares / (total * total)
    best = 0.0
    best_x, best_y = -1, -1
    best_hi, best_lo = 0.0, 0.0
    gap = labels[hi] - labels[lo]
    for x in range(bounds[hi], bounds[hi + 1]):
        rest_hi = _longest_without(bounds, length, hi, x)
        for y in range(bounds[lo], bounds[lo + 1]):
            moved = target[x] - target[y]  # labels that move from hi to lo
            if abs(gap - 2 * moved) > abs(gap):
                continue
            c_hi = float(_cost(size_hi, max(rest_hi, length[y]), pad_multiple))
            c_lo = float(_cost(size_lo, max(_longest_without(bounds, length, lo, y), length[x]), pad_multiple))
            if c_hi + c_lo > cost[hi] + cost[lo] + budget or c_hi > peak or c_lo > peak:
                continue
            s1 = total + c_hi + c_lo - cost[hi] - cost[lo]
            q1 = squares + c_hi * c_hi + c_lo * c_lo - cost[hi] * cost[hi] - cost[lo] * cost[lo]
            gain = (now - q1 / (s1 * s1)) / (max(c_hi + c_lo - cost[hi] - cost[lo], 0.0) + SPEND_UNIT * pad_multiple)
            if gain <= best:
                continue
            a_hi, a_lo = c_hi * c_hi / size_hi, c_lo * c_lo / size_lo
            as1 = att_total + a_hi + a_lo - att[hi] - att[lo]
            aq1 = att_squares + a_hi * a_hi + a_lo * a_lo - att[hi] * att[hi] - att[lo] * att[lo]
            if aq1 * att_total * att_total > att_squares * as1 * as1:
                continue  # the attention CV would rise
            best, best_x, best_y, best_hi, best_lo = gain, x, y, c_hi, c_lo
    return best_x, best_y, best_hi, best_lo


@numba.njit(cache=True)
def _make_swap(bounds, hi, lo, moved, cost_hi, cost_lo, cost, labels, att, sums):
    """Book a swap between microbatches `hi` and `lo`: labels, costs, attention work and their sums, in place.

    Args:
        bounds, hi, lo, cost, labels, att, sums: as `_best_swap` (the last four changed in place).
        moved: int — labels that go from hi to lo.
        cost_hi, cost_lo: float — the pair's costs after the swap.
    """
    labels[hi] -= moved
    labels[lo] += moved
    size_hi = bounds[hi + 1] - bounds[hi]
    size_lo = bounds[lo + 1] - bounds[lo]
    sums[0] += cost_hi + cost_lo - cost[hi] - cost[lo]
    sums[1] += cost_hi * cost_hi + cost_lo * cost_lo - cost[hi] * cost[hi] - cost[lo] * cost[lo]
    a_hi, a_lo = cost_hi * cost_hi / size_hi, cost_lo * cost_lo / size_lo
    sums[2] += a_hi + a_lo - att[hi] - att[lo]
    sums[3] += a_hi * a_hi + a_lo * a_lo - att[hi] * att[hi] - att[lo] * att[lo]
    cost[hi], cost[lo], att[hi], att[lo] = cost_hi, cost_lo, a_hi, a_lo

"""Padded: one-for-one swaps that even out microbatch costs, the last move of the fixed-count stage.

A padded microbatch costs its samples x its longest sample (rounded up to `--pad-multiple`), so one sample sets its
cost, and the label trades (`_exchange`) only promise not to raise the plan's cost CV: on real data that left it
where the shuffle put it (1,000 Alpaca rows, DeepSeek BPE, 4 a microbatch: 0.346, against 0.328 for the reference,
which trades for cost variance too, and spends padding on it). Passes alternate two pairings of the span's
microbatches sorted by cost: the costliest with the cheapest (a long non-leading sample lifts a cheap microbatch,
spending padding) and neighbours in cost (a leading sample joins a costlier microbatch, lowering its own, saving
padding). Each pair makes the swap of a sample each that lowers the plan's cost CV most per padding token spent,
if the pair's label gap does not widen (label variance never rises), the attention CV (padded rows x padded length
squared) does not rise, no microbatch passes the peak, and the padding spent stays within SPEND of what the label
trades saved (padding stays below the stage input's). 20k SFT mix, W=8, G=4, data seeds 0/1: cost CV 0.590/0.595
-> 0.582/0.587, attention CV 1.365/1.379 -> 1.346/1.359, padding 10.43/10.21M -> 10.57/10.35M (the reference:
0.598/0.601, 1.356/1.366, 10.74/10.56M). SPEND is what it takes to match the reference's attention CV on every
draw tried while staying under its padding (0.18 loses one 20k draw's attention CV, 0.25 one 200k draw's
padding).

Why it stops: after two passes in a row without a swap, at most PASSES. Cost per pass: a sort of the span's costs
and, per pair, (samples a microbatch)^2 candidate swaps.
"""

from __future__ import annotations

import numpy as np

from plancc.balance import _common as c
from plancc.config import PlanSettings
from plancc.jit import numba
from plancc.plan import Batches, SampleArrays, batch_cost, row_targets

PASSES = 16  # passes of pairings (two without a swap end it)
SPEND = 0.22  # share of the padding the label trades saved that evening the costs may spend
SPEND_UNIT = 4  # a swap's gain is per padding token it spends plus this many pad multiples


def even_padded_costs(b: Batches, s: SampleArrays, settings: PlanSettings, total_cost: int) -> Batches:
    """`b` (padded) with samples swapped between microbatches of its span to lower the cost CV (module docstring),
    its total cost (padded size) raised to at most `total_cost`; `b` if no swap lowers it."""
    n_span = c.span(b, settings)
    if n_span < 2:
        return b
    head, *tail = c.split(b, n_span)
    lengths = s.length[head.samples].astype(np.int64, copy=False)
    targets = row_targets(head, s, settings.shift).astype(np.int64)  # a row per sample (a copy: the sums are shared)
    cost = batch_cost(b, s, settings.pad_multiple)
    peak = int(cost.max())
    budget = SPEND * float(total_cost - cost.sum())
    take = _swap_passes(head.batch_bounds.astype(np.int64), lengths, targets, int(settings.pad_multiple), peak,
                        max(budget, 0.0), PASSES)
    if (take == np.arange(take.shape[0])).all():
        return b
    return c.join(Batches(head.samples[take], head.row_bounds, head.batch_bounds), *tail)


@numba.njit(cache=True, inline="always")
def _cost(size, longest, pm):
    return size * (-(-longest // pm) * pm)


@numba.njit(cache=True)
def _longest_without(bounds, length, m, skip):
    """Longest sample of microbatch `m` other than position `skip`."""
    out = 0
    for x in range(bounds[m], bounds[m + 1]):
        if x != skip and length[x] > out:
            out = length[x]
    return out


@numba.njit(cache=True)
def _swap_passes(bounds, length, target, pm, peak, budget, passes):
    """For each position, the position whose sample moves there."""
    n_mb = bounds.shape[0] - 1
    n = length.shape[0]
    length = length.copy()
    target = target.copy()
    take = np.arange(n)
    cost = np.zeros(n_mb, dtype=np.float64)
    labels = np.zeros(n_mb, dtype=np.int64)
    for m in range(n_mb):
        cost[m] = _cost(bounds[m + 1] - bounds[m], _longest_without(bounds, length, m, -1), pm)
        for x in range(bounds[m], bounds[m + 1]):
            labels[m] += target[x]
    big_s = cost.sum()
    big_q = (cost * cost).sum()
    att = np.zeros(n_mb, dtype=np.float64)  # attention work: rows x padded length^2 = cost^2 / rows
    for m in range(n_mb):
        att[m] = cost[m] * cost[m] / max(bounds[m + 1] - bounds[m], 1)
    att_s = att.sum()
    att_q = (att * att).sum()
    idle = 0
    for p in range(passes):
        order = np.argsort(cost, kind="mergesort")
        swaps = 0
        extremes = p % 2 == 0
        for q in range(n_mb // 2 if extremes else n_mb - 1):
            if not extremes and q % 2 != (p // 2) % 2:
                continue
            lo = order[q]
            hi = order[n_mb - 1 - q] if extremes else order[q + 1]
            size_hi = bounds[hi + 1] - bounds[hi]
            size_lo = bounds[lo + 1] - bounds[lo]
            now = big_q / (big_s * big_s)
            best = 0.0
            bx, by = -1, -1
            bc_hi, bc_lo = 0.0, 0.0
            gap = labels[hi] - labels[lo]
            for x in range(bounds[hi], bounds[hi + 1]):
                rest_hi = _longest_without(bounds, length, hi, x)
                for y in range(bounds[lo], bounds[lo + 1]):
                    d = target[x] - target[y]  # labels that move from hi to lo
                    if abs(gap - 2 * d) > abs(gap):
                        continue
                    c_hi = float(_cost(size_hi, max(rest_hi, length[y]), pm))
                    c_lo = float(_cost(size_lo, max(_longest_without(bounds, length, lo, y), length[x]), pm))
                    if c_hi + c_lo > cost[hi] + cost[lo] + budget or c_hi > peak or c_lo > peak:
                        continue
                    s1 = big_s + c_hi + c_lo - cost[hi] - cost[lo]
                    q1 = big_q + c_hi * c_hi + c_lo * c_lo - cost[hi] * cost[hi] - cost[lo] * cost[lo]
                    v = (now - q1 / (s1 * s1)) / (max(c_hi + c_lo - cost[hi] - cost[lo], 0.0) + SPEND_UNIT * pm)
                    if v <= best:
                        continue
                    a_hi, a_lo = c_hi * c_hi / size_hi, c_lo * c_lo / size_lo
                    as1 = att_s + a_hi + a_lo - att[hi] - att[lo]
                    aq1 = att_q + a_hi * a_hi + a_lo * a_lo - att[hi] * att[hi] - att[lo] * att[lo]
                    if aq1 * att_s * att_s > att_q * as1 * as1:
                        continue  # the attention CV would rise
                    best, bx, by, bc_hi, bc_lo = v, x, y, c_hi, c_lo
            if bx < 0:
                continue
            d = target[bx] - target[by]
            labels[hi] -= d
            labels[lo] += d
            budget -= max(bc_hi + bc_lo - cost[hi] - cost[lo], 0.0)
            big_s += bc_hi + bc_lo - cost[hi] - cost[lo]
            big_q += bc_hi * bc_hi + bc_lo * bc_lo - cost[hi] * cost[hi] - cost[lo] * cost[lo]
            a_hi, a_lo = bc_hi * bc_hi / size_hi, bc_lo * bc_lo / size_lo
            att_s += a_hi + a_lo - att[hi] - att[lo]
            att_q += a_hi * a_hi + a_lo * a_lo - att[hi] * att[hi] - att[lo] * att[lo]
            cost[hi], cost[lo], att[hi], att[lo] = bc_hi, bc_lo, a_hi, a_lo
            take[bx], take[by] = take[by], take[bx]
            length[bx], length[by] = length[by], length[bx]
            target[bx], target[by] = target[by], target[bx]
            swaps += 1
        idle = 0 if swaps else idle + 1
        if idle == 2:
            break
    return take

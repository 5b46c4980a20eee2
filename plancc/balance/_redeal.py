"""Re-dealing samples within classes of equal length (or equal targets): the free move that starts stage 2.

Two samples of the same length can swap positions anywhere in the plan without changing the token count of any
row: capacity, padding, every microbatch's cost and the peak stay exactly as they are, in every layout. So the
positions a length occupies are kept and only which of its samples fills each one is chosen again, to even out
the microbatch label totals::

    length 812 sits in microbatches 3, 3, 9, 17; its samples carry 700, 40, 380, 12 labels
    microbatch 17 is furthest below its share, then 9, then 3  ->  17 gets 700, 9 gets 380, 3 gets 40 and 12

Lengths are dealt one after another, widest label spread first, each sample (most labels first) to the position
whose microbatch is lowest in expected total: labels dealt so far plus, for each position still open, the mean
of its length. This is the longest-processing-time rule of scheduling, with the open positions' means standing in
for what is still to come. It needs no free space, of which first-fit-decreasing leaves none: at capacity 4096
(rows 99.97% full, ~7 samples a row) it takes the label CV of 200k samples from 0.43 to 0.25 in 0.05 s, where
pair trades from the plain packing needed four passes to reach 0.20 (from this start they end at 0.19).

The same move with the roles swapped serves `flattened`, where a microbatch's tokens are its cost: samples with
the same number of targets are re-dealt to even out token totals, every label total unchanged
(`deal_equal_labels`; 1M samples: cost CV 0.43 -> 0.19).

Classes may be widened to values that agree to `quantum` (`length // quantum`, `targets // quantum`): the dealt
total then gains freedom while the other moves by less than `quantum` a sample. Only `flattened` uses this
(`fixed_count` alternates widened deals, coarse to fine, under its own guard): elsewhere a length change moves
padding or overflows a row. Cost: a counting sort by class and one heap pass, O(n log W) (0.05 s at 200k).

Under `--shift row` a row's first sample loses its first label, so row starts and the other positions are dealt
apart. The tail is not touched (SPEC 5), and a result is kept only if it lowers its objective.
"""

from __future__ import annotations

import numpy as np

from plancc.balance import _common as c
from plancc.config import PlanSettings
from plancc.jit import numba
from plancc.plan import Batches, SampleArrays, batch_cost, batch_targets, batch_tokens


def deal_equal_lengths(b: Batches, s: SampleArrays, settings: PlanSettings, quantum: int = 1) -> Batches:
    """`b` with the samples of each length re-dealt over that length's positions: lower label variance, every
    row's tokens unchanged. With `quantum` > 1 (flattened only) samples whose lengths agree to `quantum` tokens
    share a class: more freedom for the labels, tokens moved by less than `quantum` a sample, kept only if
    neither the peak nor the total cost grows."""
    targets, later = _position_targets(b, s, settings.shift)
    new = _redeal(b, settings, s.length[b.samples].astype(np.int64, copy=False) // quantum, targets, later)
    if new is b or (quantum > 1 and not _cost_kept(b, new, s, settings)):
        return b
    sse = [c.label_sse(batch_targets(x, s, settings.shift)) for x in (b, new)]
    return new if sse[1] < sse[0] else b


def deal_equal_labels(b: Batches, s: SampleArrays, settings: PlanSettings, quantum: int = 1) -> Batches:
    """`b` with the samples of each target count re-dealt over their positions: lower token variance, every
    microbatch's labels unchanged (with `quantum` > 1: target counts that agree to `quantum`, labels moved by less
    than that a sample). For `flattened`, where a microbatch's tokens are its cost; kept only if neither the peak
    nor the total cost grows."""
    targets, later = _position_targets(b, s, settings.shift)
    new = _redeal(b, settings, targets // quantum, s.length[b.samples].astype(np.int64, copy=False), later)
    if new is b or not _cost_kept(b, new, s, settings):
        return b
    sse = [c.label_sse(batch_tokens(x, s)) for x in (b, new)]
    return new if sse[1] < sse[0] else b


def trim_peak(b: Batches, s: SampleArrays, settings: PlanSettings) -> Batches:
    """Flattened: lower the heaviest microbatch of the complete updates, again and again, by swapping one of its
    samples for a shorter one with the same targets (and row role) from a microbatch that stays below it. Every
    microbatch keeps its labels; each swap lowers the larger of the pair at a constant pair total, so token
    variance and the peak only drop. Stops when the heaviest microbatch has no such swap."""
    n_span = c.span(b, settings)
    if n_span < 2:
        return b
    head, *tail = c.split(b, n_span)
    targets, later = _position_targets(head, s, settings.shift)
    key = targets if later is None else 2 * targets + later
    mb_of = head.batch_of_row()[head.row_of_sample()]
    bounds = head.row_bounds[head.batch_bounds]
    take = _trim(key, s.length[head.samples].astype(np.int64, copy=False), mb_of, bounds, int(settings.pad_multiple))
    return c.join(Batches(head.samples[take], head.row_bounds, head.batch_bounds), *tail)


def _cost_kept(b: Batches, new: Batches, s: SampleArrays, settings: PlanSettings) -> bool:
    """Neither the peak nor the total microbatch cost of `new` above `b`'s."""
    cost = [batch_cost(x, s, settings.pad_multiple) for x in (b, new)]
    return bool(cost[1].max() <= cost[0].max() and cost[1].sum() <= cost[0].sum())


def _position_targets(b: Batches, s: SampleArrays, shift: str) -> tuple[np.ndarray, np.ndarray | None]:
    """(targets each plan position adds, which positions are not a row's first or None): under `--shift row`
    only a row's first sample loses its first label, so row starts and the rest are dealt apart."""
    targets = s.targets(shift)[b.samples].astype(np.int64, copy=False)
    if shift != "row":
        return targets, None
    later = np.ones(targets.shape[0], dtype=bool)
    later[b.row_bounds[:-1]] = False
    targets[later] = s.label_count[b.samples[later]]
    return targets, later


def _redeal(b: Batches, settings: PlanSettings, key: np.ndarray, value: np.ndarray, later: np.ndarray | None
            ) -> Batches:
    """Permute the samples of the complete updates within classes of equal `key` (and row role) to even out the
    microbatch totals of `value`; the tail is copied through."""
    n_span = c.span(b, settings)
    if n_span < 2:
        return b
    head, *tail = c.split(b, n_span)
    p_end = head.samples.shape[0]
    key, value = key[:p_end], value[:p_end]
    if later is not None:
        key = 2 * key + later[:p_end]
    mb_of = head.batch_of_row()[head.row_of_sample()]
    take = _deal(key, value, mb_of, head.num_batches)
    return c.join(Batches(head.samples[take], head.row_bounds, head.batch_bounds), *tail)


@numba.njit(cache=True)
def _by_key(key):
    """Positions grouped by (non-negative) key, in position order inside a key: (CSR bounds per key value,
    positions). A counting sort."""
    n = key.shape[0]
    top = 0
    for i in range(n):
        top = max(top, key[i])
    bounds = np.zeros(top + 2, dtype=np.int64)
    for i in range(n):
        bounds[key[i] + 1] += 1
    for k in range(top + 1):
        bounds[k + 1] += bounds[k]
    pos = np.empty(n, dtype=np.int64)
    fill = bounds[:-1].copy()
    for i in range(n):
        pos[fill[key[i]]] = i
        fill[key[i]] += 1
    return bounds, pos


@numba.njit(cache=True)
def _deal(key, value, mb_of, n_mb):
    """For each position, the position whose sample moves there (a permutation within each key)."""
    n = key.shape[0]
    bounds, pos = _by_key(key)
    top = bounds.shape[0] - 2
    # expected total per microbatch: every position counts its key's mean until it is dealt
    mean = np.zeros(top + 1)
    spread = np.zeros(top + 1, dtype=np.int64)
    expect = np.zeros(n_mb)
    longest = 0
    for k in range(top + 1):
        lo, hi = bounds[k], bounds[k + 1]
        longest = max(longest, hi - lo)
        if hi == lo:
            continue
        vmin = value[pos[lo]]
        vmax = vmin
        total = 0
        for x in range(lo, hi):
            v = value[pos[x]]
            total += v
            vmin = min(vmin, v)
            vmax = max(vmax, v)
        mean[k] = total / (hi - lo)
        spread[k] = vmax - vmin
        for x in range(lo, hi):
            expect[mb_of[pos[x]]] += mean[k]
    take = np.arange(n)
    heap_key = np.empty(longest)
    heap_at = np.empty(longest, dtype=np.int64)
    for k in np.argsort(-spread, kind="mergesort"):
        lo, hi = bounds[k], bounds[k + 1]
        if hi - lo < 2 or spread[k] == 0:
            continue
        group = pos[lo:hi]
        samples_first = group[np.argsort(-value[group], kind="mergesort")]
        slots = group[np.argsort(mb_of[group], kind="mergesort")]  # a microbatch's positions side by side
        h = 0  # a min-heap of microbatches by expected total; heap_at: the microbatch's next open slot
        for x in range(hi - lo):
            if x == 0 or mb_of[slots[x]] != mb_of[slots[x - 1]]:
                heap_key[h] = expect[mb_of[slots[x]]]
                heap_at[h] = x
                h += 1
        for i in range(h // 2 - 1, -1, -1):
            _sift_down(heap_key, heap_at, h, i)
        for src in samples_first:
            x = heap_at[0]
            m = mb_of[slots[x]]
            take[slots[x]] = src
            expect[m] += value[src] - mean[k]
            if x + 1 < hi - lo and mb_of[slots[x + 1]] == m:
                heap_at[0] = x + 1
                heap_key[0] = expect[m]
            else:
                h -= 1
                heap_key[0] = heap_key[h]
                heap_at[0] = heap_at[h]
            _sift_down(heap_key, heap_at, h, 0)
    return take


@numba.njit(cache=True)
def _sift_down(heap_key, heap_at, h, i):
    """Restore the min-heap below entry i (ties keep the lower index on top: deterministic)."""
    while True:
        child = 2 * i + 1
        if child >= h:
            return
        if child + 1 < h and heap_key[child + 1] < heap_key[child]:
            child += 1
        if heap_key[child] >= heap_key[i]:
            return
        heap_key[child], heap_key[i] = heap_key[i], heap_key[child]
        heap_at[child], heap_at[i] = heap_at[i], heap_at[child]
        i = child


@numba.njit(cache=True)
def _trim(key, length, mb_of, bounds, pm):
    """For each position, the position whose sample moves there (`trim_peak`): swaps within classes of `key`,
    never raising the pair's cost rounded up to `pm`."""
    n = key.shape[0]
    n_mb = bounds.shape[0] - 1
    take = np.arange(n)
    length = length.copy()
    tokens = np.zeros(n_mb, dtype=np.int64)
    for i in range(n):
        tokens[mb_of[i]] += length[i]
    starts, members = _by_key(key)
    for _ in range(n):
        h = np.argmax(tokens)
        best, bx, by = tokens[h], -1, -1
        for x in range(bounds[h], bounds[h + 1]):
            for j in range(starts[key[x]], starts[key[x] + 1]):
                y = members[j]
                d = length[x] - length[y]
                if d <= 0 or mb_of[y] == h:
                    continue
                m = mb_of[y]
                new_max = max(tokens[h] - d, tokens[m] + d)
                if new_max >= best:
                    continue
                if pm > 1 and (_slots(tokens[h] - d, pm) + _slots(tokens[m] + d, pm)
                               > _slots(tokens[h], pm) + _slots(tokens[m], pm)):
                    continue  # rounding up to --pad-multiple would raise the pair's cost
                best, bx, by = new_max, x, y
        if bx < 0:
            break
        d = length[bx] - length[by]
        tokens[h] -= d
        tokens[mb_of[by]] += d
        take[bx], take[by] = take[by], take[bx]
        length[bx], length[by] = length[by], length[bx]
    return take


@numba.njit(cache=True, inline="always")
def _slots(tokens, pm):
    """`tokens` rounded up to a multiple of `pm`, in units of `pm`."""
    return -(-tokens // pm)

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
for what is still to come. It needs no free space, of which first-fit-decreasing leaves none: on rows of few
samples that are nearly full it gets most of the way pair trades get in a fraction of their time, and the trades
end lower from its start than from the plain packing (docs/benchmarks.md).

The same move with the roles swapped serves `flattened`, where a microbatch's tokens are its cost: samples with
the same number of targets are re-dealt to even out token totals, every label total unchanged
(`deal_equal_labels`).

Classes may be widened to values that agree to `quantum` (`length // quantum`, `targets // quantum`): the dealt
total then gains freedom while the other moves by less than `quantum` a sample. Only `flattened` uses this
(`fixed_count` alternates widened deals, coarse to fine, under its own guard): elsewhere a length change moves
padding or overflows a row. Cost: a counting sort by class and one heap pass, O(n log W).

Under `--shift row` a row's first sample loses its first label, so row starts and the other positions are dealt
apart. The tail is not touched (docs/spec.md §5), and a result is kept only if it lowers its objective.
"""

from __future__ import annotations

import numpy as np

from plancc.config.settings import PlanSettings
from plancc.core.jit import numba
from plancc.core.plan_arrays import Batches, SampleArrays, batch_cost, batch_targets, batch_tokens
from plancc.planner.balance import _common as common
from plancc.planner.sort import stable_order


def deal_equal_lengths(batches: Batches, samples: SampleArrays, settings: PlanSettings, quantum: int = 1) -> Batches:
    """`batches` with the samples of each length re-dealt over that length's positions: lower label variance, every
    row's tokens unchanged. With `quantum` > 1 (flattened only) samples whose lengths agree to `quantum` tokens
    share a class: more freedom for the labels, tokens moved by less than `quantum` a sample, kept only if
    neither the peak nor the total cost grows."""
    targets, later = _position_targets(batches, samples, settings.shift)
    lengths = samples.length[batches.samples].astype(np.int64, copy=False)
    new = _redeal(batches, settings, lengths // quantum, targets, later)
    if new is batches or (quantum > 1 and not _cost_kept(batches, new, samples, settings)):
        return batches
    sse = [common.label_sse(batch_targets(x, samples, settings.shift)) for x in (batches, new)]
    return new if sse[1] < sse[0] else batches


def deal_equal_labels(batches: Batches, samples: SampleArrays, settings: PlanSettings, quantum: int = 1) -> Batches:
    """`batches` with the samples of each target count re-dealt over their positions: lower token variance, every
    microbatch's labels unchanged (with `quantum` > 1: target counts that agree to `quantum`, labels moved by less
    than that a sample). For `flattened`, where a microbatch's tokens are its cost; kept only if neither the peak
    nor the total cost grows."""
    targets, later = _position_targets(batches, samples, settings.shift)
    lengths = samples.length[batches.samples].astype(np.int64, copy=False)
    new = _redeal(batches, settings, targets // quantum, lengths, later)
    if new is batches or not _cost_kept(batches, new, samples, settings):
        return batches
    sse = [common.label_sse(batch_tokens(x, samples)) for x in (batches, new)]
    return new if sse[1] < sse[0] else batches


def trim_peak(batches: Batches, samples: SampleArrays, settings: PlanSettings) -> Batches:
    """Flattened: lower the heaviest microbatch of the complete updates, again and again, by swapping one of its
    samples for a shorter one with the same targets (and row role) from a microbatch that stays below it. Every
    microbatch keeps its labels; each swap lowers the larger of the pair at a constant pair total, so token
    variance and the peak only drop. Stops when the heaviest microbatch has no such swap."""
    n_span = common.span(batches, settings)
    if n_span < 2:
        return batches
    head, *tail = common.split(batches, n_span)
    targets, later = _position_targets(head, samples, settings.shift)
    key = targets if later is None else 2 * targets + later
    mb_of = head.batch_of_row()[head.row_of_sample()]
    bounds = head.row_bounds[head.batch_bounds]
    lengths = samples.length[head.samples].astype(np.int64, copy=False)
    take = _trim(key, lengths, mb_of, bounds, int(settings.pad_multiple))
    return common.join(Batches(head.samples[take], head.row_bounds, head.batch_bounds), *tail)


def _cost_kept(batches: Batches, new: Batches, samples: SampleArrays, settings: PlanSettings) -> bool:
    """Neither the peak nor the total microbatch cost of `new` above `batches`'s."""
    cost = [batch_cost(x, samples, settings.pad_multiple) for x in (batches, new)]
    return bool(cost[1].max() <= cost[0].max() and cost[1].sum() <= cost[0].sum())


def _position_targets(batches: Batches, samples: SampleArrays, shift: str) -> tuple[np.ndarray, np.ndarray | None]:
    """(targets each plan position adds, which positions are not a row's first or None): under `--shift row`
    only a row's first sample loses its first label, so row starts and the rest are dealt apart."""
    targets = samples.targets(shift)[batches.samples].astype(np.int64, copy=False)
    if shift != "row":
        return targets, None
    later = np.ones(targets.shape[0], dtype=bool)
    later[batches.row_bounds[:-1]] = False
    targets[later] = samples.label_count[batches.samples[later]]
    return targets, later


def _redeal(batches: Batches, settings: PlanSettings, key: np.ndarray, value: np.ndarray, later: np.ndarray | None
            ) -> Batches:
    """Permute the samples of the complete updates within classes of equal `key` (and row role) to even out the
    microbatch totals of `value`; the tail is copied through."""
    n_span = common.span(batches, settings)
    if n_span < 2:
        return batches
    head, *tail = common.split(batches, n_span)
    p_end = head.samples.shape[0]
    key, value = key[:p_end], value[:p_end]
    if later is not None:
        key = 2 * key + later[:p_end]
    mb_of = head.batch_of_row()[head.row_of_sample()]
    take = _deal(key, value, mb_of, head.num_batches)
    return common.join(Batches(head.samples[take], head.row_bounds, head.batch_bounds), *tail)


@numba.njit(cache=True)
def _by_key(key, order):
    """The positions `order` lists, grouped by key, in their `order` inside a key (a stable counting sort).

    Args:
        key: int64 (positions,) — non-negative class of each position.
        order: int64 (positions,) — every position once.
    Returns: (int64 (max key + 2,) CSR bounds per key value, int64 (positions,) positions).
    """
    n = key.shape[0]
    top = 0
    for i in range(n):
        top = max(top, key[i])
    bounds = np.zeros(top + 2, dtype=np.int64)
    for i in range(n):
        bounds[key[i] + 1] += 1
    for cls in range(top + 1):
        bounds[cls + 1] += bounds[cls]
    positions = np.empty(n, dtype=np.int64)
    fill = bounds[:-1].copy()
    for i in order:
        positions[fill[key[i]]] = i
        fill[key[i]] += 1
    return bounds, positions


@numba.njit(cache=True)
def _class_means(bounds, positions, value, mb_of, n_mb):
    """Per class, the mean and the spread (max - min) of its values, and per microbatch the total it would hold
    if each of its positions held its class's mean.

    Args:
        bounds, positions: `_by_key`'s CSR of positions per class.
        value: int64 (positions,) — the value each position's sample holds now.
        mb_of: int64 (positions,) — microbatch of each position.
        n_mb: int — microbatches.
    Returns: (float64 (classes,), int64 (classes,), float64 (n_mb,)).
    """
    n_classes = bounds.shape[0] - 1
    mean = np.zeros(n_classes)
    spread = np.zeros(n_classes, dtype=np.int64)
    expect = np.zeros(n_mb)
    for cls in range(n_classes):
        lo, hi = bounds[cls], bounds[cls + 1]
        if hi == lo:
            continue
        low = value[positions[lo]]
        high = low
        total = 0
        for x in range(lo, hi):
            v = value[positions[x]]
            total += v
            low = min(low, v)
            high = max(high, v)
        mean[cls] = total / (hi - lo)
        spread[cls] = high - low
        for x in range(lo, hi):
            expect[mb_of[positions[x]]] += mean[cls]
    return mean, spread, expect


@numba.njit(cache=True)
def _deal(key, value, mb_of, n_mb):
    """For each position, the position whose sample moves there: a permutation within each class of `key` that
    deals the class's samples, most `value` first, each to the microbatch lowest in expected total.

    Args:
        key: int64 (positions,) — class of each position (non-negative).
        value: int64 (positions,) — what is evened out (labels, or tokens) per position's sample, non-negative.
        mb_of: int64 (positions,) — microbatch of each position, non-decreasing (positions in plan order).
        n_mb: int — microbatches.
    Returns: int64 (positions,).
    """
    bounds, positions = _by_key(key, np.arange(key.shape[0]))
    mean, spread, expect = _class_means(bounds, positions, value, mb_of, n_mb)
    # each class's positions most value first (ties in position order): one counting sort by value, then by key
    most_first = _by_key(key, stable_order(value, np.max(value) + 1 if key.shape[0] else 1, True))[1]
    take = np.arange(key.shape[0])
    longest = np.max(np.diff(bounds)) if bounds.shape[0] > 1 else 0
    heap_key = np.empty(longest + 1)  # a min-heap of microbatches by expected total (+ a sentinel past its end)
    heap_at = np.empty(longest, dtype=np.int64)  # each one's next open slot
    for cls in np.argsort(-spread, kind="mergesort"):
        lo, hi = bounds[cls], bounds[cls + 1]
        if hi - lo < 2 or spread[cls] == 0:
            continue
        samples_first = most_first[lo:hi]
        slots = positions[lo:hi]  # in position order: a microbatch's positions side by side
        size = 0
        for x in range(hi - lo):
            if x == 0 or mb_of[slots[x]] != mb_of[slots[x - 1]]:
                heap_key[size] = expect[mb_of[slots[x]]]
                heap_at[size] = x
                size += 1
        for i in range(size // 2 - 1, -1, -1):
            _sift_down(heap_key, heap_at, size, i)
        for src in samples_first:
            x = heap_at[0]
            mb = mb_of[slots[x]]
            take[slots[x]] = src
            expect[mb] += value[src] - mean[cls]
            if x + 1 < hi - lo and mb_of[slots[x + 1]] == mb:
                heap_at[0] = x + 1
                heap_key[0] = expect[mb]
            else:
                size -= 1
                heap_key[0] = heap_key[size]
                heap_at[0] = heap_at[size]
            _sift_down(heap_key, heap_at, size, 0)
    return take


@numba.njit(cache=True)
def _sift_down(heap_key, heap_at, size, entry):
    """Restore the min-heap below `entry` (ties keep the lower index on top: deterministic).

    The smaller child is chosen without a branch (a sentinel of infinity past the heap's end stands in for a
    missing right child): which child is smaller follows no pattern, so a branch there is mispredicted about every
    other level, and the sifts are most of a deal's time.

    Args:
        heap_key: float64 (> size,) — the heap's keys; `heap_key[size]` is overwritten.
        heap_at: int64 (>= size,) — what each entry carries, moved with its key.
        size: int — entries in the heap.
        entry: int — the entry to sift down.
    """
    heap_key[size] = np.inf
    key, at = heap_key[entry], heap_at[entry]
    child = 2 * entry + 1
    while child < size:
        child += heap_key[child + 1] < heap_key[child]
        if heap_key[child] >= key:
            break
        heap_key[entry], heap_at[entry] = heap_key[child], heap_at[child]
        entry = child
        child = 2 * entry + 1
    heap_key[entry], heap_at[entry] = key, at


@numba.njit(cache=True)
def _trim(key, length, mb_of, bounds, pad_multiple):
    """For each position, the position whose sample moves there (`trim_peak`): swaps within classes of `key`,
    never raising the pair's cost rounded up to `pad_multiple`.

    Args:
        key: int64 (positions,) — class of each position: samples of one class may swap.
        length: int64 (positions,) — tokens of each position's sample.
        mb_of: int64 (positions,) — microbatch of each position.
        bounds: int64 (microbatches + 1,) — CSR of positions per microbatch.
        pad_multiple: int — `--pad-multiple`.
    Returns: int64 (positions,).
    """
    n = key.shape[0]
    take = np.arange(n)
    length = length.copy()
    tokens = np.zeros(bounds.shape[0] - 1, dtype=np.int64)
    for i in range(n):
        tokens[mb_of[i]] += length[i]
    starts, members = _by_key(key, np.arange(n))
    for _ in range(n):
        heaviest = np.argmax(tokens)
        best, best_x, best_y = tokens[heaviest], -1, -1
        for x in range(bounds[heaviest], bounds[heaviest + 1]):
            for j in range(starts[key[x]], starts[key[x] + 1]):
                y = members[j]
                moved = length[x] - length[y]
                if moved <= 0 or mb_of[y] == heaviest:
                    continue
                other = mb_of[y]
                new_max = max(tokens[heaviest] - moved, tokens[other] + moved)
                if new_max >= best:
                    continue
                if pad_multiple > 1 and (
                        _slots(tokens[heaviest] - moved, pad_multiple) + _slots(tokens[other] + moved, pad_multiple)
                        > _slots(tokens[heaviest], pad_multiple) + _slots(tokens[other], pad_multiple)):
                    continue  # rounding up to --pad-multiple would raise the pair's cost
                best, best_x, best_y = new_max, x, y
        if best_x < 0:
            break
        moved = length[best_x] - length[best_y]
        tokens[heaviest] -= moved
        tokens[mb_of[best_y]] += moved
        take[best_x], take[best_y] = take[best_y], take[best_x]
        length[best_x], length[best_y] = length[best_y], length[best_x]
    return take


@numba.njit(cache=True, inline="always")
def _slots(tokens, pad_multiple):
    """`tokens` rounded up to a multiple of `pad_multiple`, in units of `pad_multiple` (ints)."""
    return -(-tokens // pad_multiple)

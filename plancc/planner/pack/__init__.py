"""Packing algorithms, one per module, and the layout builder of the `before` plan.

`plain` packs the plain plan by best fit (`best_fit`, which also fills pre-filled rows; `left_out` and
`exact_fill` close the items a packing leaves out); `random_groups` groups samples for padded and flattened;
`label_aware` repacks given rows so their label counts start close (microbatch balance starts from it).
"""

from __future__ import annotations

import numpy as np

from plancc.config.settings import PlanSettings
from plancc.core.choices import Mode
from plancc.core.layout import tail_batches
from plancc.core.plan_arrays import (
    Batches,
    SampleArrays,
    batch_cost,
    batch_targets,
    from_rows,
    permute_batches,
)
from plancc.planner.pack.plain import pack_best_fit
from plancc.planner.pack.random_groups import group_fixed

CANDIDATES = 4096  # microbatches before the tail that may take its place


def initial_batches(samples: SampleArrays, settings: PlanSettings, rng: np.random.Generator) -> Batches:
    """The `before` plan of one epoch: `shuffled_batches`, its incomplete final update made of the most ordinary
    microbatches (`ordinary_tail`)."""
    return ordinary_tail(shuffled_batches(samples, settings, rng), samples, settings)


def shuffled_batches(samples: SampleArrays, settings: PlanSettings, rng: np.random.Generator) -> Batches:
    """Shuffled, packed (or grouped) microbatches in the chosen layout."""
    if settings.mode == Mode.PACKED:
        order, row_bounds = pack_best_fit(samples.length, settings.row_capacity, rng)
        rows_per_batch = settings.micro_batch_size if settings.real_batches else 1
        return from_rows(order, row_bounds, rows_per_batch)
    order, groups = group_fixed(len(samples), settings.micro_batch_size, rng)
    if settings.mode == Mode.PADDED:  # one row per sample
        return Batches(order, np.arange(len(samples) + 1, dtype=np.int64), groups)
    return Batches(order, groups, np.arange(groups.shape[0], dtype=np.int64))  # flattened: one row per group


def ordinary_tail(batches: Batches, samples: SampleArrays, settings: PlanSettings) -> Batches:
    """`batches` with its incomplete final update (the tail) made of the microbatches nearest the mean in labels and
    cost, taken from the tail and the CANDIDATES microbatches before it.

    No balancing stage touches the tail (docs/spec.md §5), so a tail drawn at random keeps the spread of the plain packing:
    on rows of few samples a few dozen tail microbatches held a visible share of the balanced plan's label
    variance, and the flattened plan's peak cost sat in its tail. The candidates are a random
    draw already (the shuffled order), so the nearest of a few thousand sit within a percent of the mean; the rest
    keep their order, and a last microbatch holding fewer rows or samples than the first stays last. `--drop-last`
    drops this same tail (what is dropped is what the plan without it would hold last).
    """
    n = batches.num_batches
    k = tail_batches(n, settings.world_size, settings.grad_accum)
    if k == 0 or k == n:
        return batches
    first = max(n - k - CANDIDATES, 0)
    p0 = int(batches.row_bounds[batches.batch_bounds[first]])
    r0 = int(batches.batch_bounds[first])
    part = Batches(batches.samples[p0:], batches.row_bounds[r0:] - p0, batches.batch_bounds[first:] - r0)
    labels = batch_targets(part, samples, settings.shift).astype(np.float64)
    cost = batch_cost(part, samples, settings.pad_multiple).astype(np.float64)
    far = (labels / max(labels.mean(), 1.0) - 1.0) ** 2 + (cost / max(cost.mean(), 1.0) - 1.0) ** 2
    rows, size = batches.rows_per_batch(), np.diff(batches.row_bounds[batches.batch_bounds])
    short_last = bool(rows[-1] < rows[0] or (size[-1] < size[0] and settings.mode != Mode.PACKED))
    m = far.shape[0] - short_last  # a short last microbatch is in the tail already, and stays last
    tail = np.sort(np.argsort(far[:m], kind="stable")[: k - short_last])
    tail = np.append(tail, far.shape[0] - 1) if short_last else tail
    keep = np.ones(far.shape[0], dtype=bool)
    keep[tail] = False
    part = permute_batches(part, np.concatenate([np.flatnonzero(keep), tail]))
    return Batches(np.concatenate([batches.samples[:p0], part.samples]),
                   np.concatenate([batches.row_bounds[:r0], part.row_bounds + p0]),
                   np.concatenate([batches.batch_bounds[:first], part.batch_bounds + r0]))


__all__ = ["group_fixed", "initial_batches", "ordinary_tail", "pack_best_fit", "shuffled_batches"]

"""Microbatch balance for `packed`: equalize supervised-label counts across microbatches (docs/spec.md §5, stage 2).

Three steps.
1. The complete updates are repacked label-aware into the same rows (`pack.label_aware`): every row mixes long
   and short samples at a label count near the mean, kept only if no microbatch's padded cost passes the plan's
   peak and the total does not grow. It works best on rows of many samples (it closes rows left open by
   re-packing a stride of them); on rows of a few samples it gains less. Where it cannot close the rows, it is
   skipped.
2. Where step 1 cannot close the rows, samples of equal length are re-dealt over their positions instead
   (`_redeal`): free at any fill, every row's tokens unchanged. After a repacking into rows of many samples it
   lowers the start's CV too, but the trades then end higher: they live on the repacked rows' mix of sizes, which
   the deal scrambles. Rows of few samples (under FEW on average) are re-dealt after the repacking as well: there
   the trades end lower from it than from the repacking or the deal alone.
3. Samples are traded between pairs of microbatches inside windows of at most `balance_window` microbatches, for
   `balance_passes` passes (see `_exchange` for the trade). Windows are stratified: each pass sorts the
   microbatches by label count and deals them round-robin into windows, so every window holds heavy and light
   microbatches and its mean sits near the plan's mean. Rows of few samples (under FEW) get FEW_PASSES times
   `balance_passes` passes: there each pass finds trades the rounds of the last one did not (more rounds a
   window instead gain nothing), while rows of many samples converge in `balance_passes`.

Every step keeps every row within its capacity (and the plan's peak cost), never raises the padded cost, and
never adds or removes a row; the tail is not touched. The result replaces the input only if its label variance
is lower.

What it trades: label balance for nothing else (tokens per row may move, the padded cost and the peak never grow).
Why it stops: step 1 is one deal and one best fit per rung of a three-rung ladder; step 2 is one pass; step 3
stops after `balance_passes` passes (FEW_PASSES times that for rows of few samples), or a pass without a trade,
each window after at most ROUNDS rounds (or after IDLE rounds that barely help, see `_exchange`). Cost: steps 1-2
are O(n) plus a best fit (O(n log C)); step 3 is O(microbatches x rounds x passes) trade searches, in parallel over
windows; the trades take most of the stage's time, the first pass the most (docs/benchmarks.md).

The spare space balancing trades through comes from the plain packing: it keeps best fit's rows above the rows
lower bound while within 0.01% of it (`pack.plain`), since rows at exactly the bound leave step 1 nothing to
close its rows with.

Against the reference's swap-then-repack on contiguous windows: its repacking can only close a window again when
the window holds a half-empty row, since first-fit-decreasing fills rows to 99.99%; here the repacking spans the
whole epoch at the same row count, and the trades (up to three samples a side, a new partner every round) find
the equal-length exchanges that remain. The before plan stays the plain first-fit-decreasing packing.
"""

from __future__ import annotations

import numpy as np

from plancc.config.settings import PlanSettings
from plancc.core.plan_arrays import Batches, SampleArrays, batch_cost, batch_targets
from plancc.planner.balance import _common as common
from plancc.planner.balance._redeal import deal_equal_lengths
from plancc.planner.pack.label_aware import label_excess, pack_by_excess

ROUNDS = 64  # pairing rounds per window and pass (a window stops early after IDLE idle rounds)
TOL = 0.02  # label gaps under 2% of the mean microbatch are not worth a trade
FEW = 16  # rows holding fewer samples than this on average are re-dealt after the repacking too
FEW_PASSES = 3  # ... and traded over this many times `--balance-passes` passes (see step 3)


def balance_microbatches(batches: Batches, samples: SampleArrays, settings: PlanSettings, *,
                         rng: np.random.Generator) -> Batches:
    """The stage (steps 1-3 of the module docstring); `batches` unchanged unless the label variance drops."""
    window = settings.balance_window
    start = repack_label_aware(batches, samples, n_span=common.span(batches, settings), capacity=settings.row_capacity,
                               pad_multiple=settings.pad_multiple, shift=settings.shift, rng=rng)
    few = batches.samples.shape[0] < FEW * batches.num_rows
    if start is batches or few:  # see step 2
        start = deal_equal_lengths(start, samples, settings)
    out = common.exchange(start, samples, settings,
                          windows=lambda pass_index, labels: common.stratified_windows(labels, window),
                          passes=settings.balance_passes * (FEW_PASSES if few else 1), rounds=ROUNDS, tol_share=TOL)
    sse = [common.label_sse(batch_targets(x, samples, settings.shift)) for x in (batches, out)]
    return out if sse[1] < sse[0] else batches


def repack_label_aware(batches: Batches, samples: SampleArrays, *, n_span: int, capacity: int, pad_multiple: int,
                       shift: str, rng: np.random.Generator) -> Batches:
    """`batches` with its first `n_span` microbatches repacked by `pack_label_aware` into the same rows (of at most
    `capacity` tokens); `batches` if that does not fit or would raise the peak or the total padded cost."""
    if n_span < 2:
        return batches
    head, *tail = common.split(batches, n_span)
    cost = batch_cost(batches, samples, pad_multiple)
    peak = int(cost.max())
    capacity = min(capacity, peak // int(head.rows_per_batch().max()))
    lengths = samples.length[head.samples]  # as stored (int32): every sum over them is taken in int64
    values = common.item_values(head, samples, shift)
    pinned = np.zeros(lengths.shape[0], dtype=bool)
    start_tok = np.zeros(head.num_rows, dtype=np.int64)
    start_val = np.zeros(head.num_rows, dtype=np.int64)
    free = slice(None)  # every sample moves: views, not copies, of the 10M lengths and values
    if shift == "row":  # a row's first sample decides its target count: it stays first in its row
        rows = np.flatnonzero(head.samples_per_row() > 0)
        first = head.row_bounds[rows]
        pinned[first] = True
        start_tok[rows], start_val[rows] = lengths[first], values[first]
        free = ~pinned
    excess, start_excess = label_excess(lengths[free], values[free], start_tok, start_val)
    del values  # what `pack_label_aware` does, with each item-sized array freed once used
    assign = pack_by_excess(lengths[free], excess, start_excess, capacity, start_tok, rng)
    del lengths, excess
    if assign is None:
        return batches
    row_of = head.row_of_sample()
    row_of[free] = assign
    del assign
    new = common.rebuild_rows(head, row_of, pinned)
    new_cost = batch_cost(new, samples, pad_multiple)
    if new_cost.max() > peak or new_cost.sum() > cost[:n_span].sum():
        return batches
    return common.join(new, *tail)

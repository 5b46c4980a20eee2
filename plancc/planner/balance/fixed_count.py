"""Microbatch balance for the fixed-count layouts `padded` and `flattened` (docs/spec.md §4/5, stage 2).

Every microbatch keeps exactly `micro_batch_size` samples; what moves is which samples share one. Five moves:

1. Deals (`_redeal`): samples of equal length are re-dealt over their positions to even out label totals. No
   microbatch's tokens or cost change.
2. Flattened only (cost = tokens): deals of near-equal target counts (even out tokens, labels nearly unchanged)
   and of near-equal lengths (even out labels) in turn, classes 256, 64, 16, 4, 1 wide, coarse to fine. Each is
   kept only if it lowers CV_labels^2 + CV_tokens^2 without raising the peak; the result only if neither
   variance ends above the stage input's (else the exact deals alone). Coarse classes buy freedom for the one
   total at a small price in the other.
3. Pair trades, one-for-one or two-for-two (`_exchange`, exact mode), between the heaviest and lightest
   microbatches of windows (see `microbatch`):
   - `flattened`: a trade must narrow the label gap or the token gap and widen neither, within the plan's peak,
     so label variance and token variance both never grow; the score weighs the two gaps by their means.
     Windows are stratified by labels.
   - `padded` (cost = samples x longest sample, rounded up to `--pad-multiple`): a trade must narrow the label
     gap without raising the pair's total cost or any microbatch above the plan's peak, so padding never grows.
     A trade that saves padding lowers a cost, and lowering costs below the mean spreads them (unguarded, the
     cost CV rises as padding falls). So windows are formed inside the upper and the lower half of the
     costs (there trades mostly pull high costs down), and a window's trades are kept only while the plan's cost
     CV stays at or below the stage input's (`exchange_within_cost_cv`), over twice `--balance-passes` passes,
     since each keeps only part of its windows. Windows hold at most 16 microbatches here: the finer the unit
     the guard keeps or drops, the more trades it keeps, down to a point: 8 keeps fewer than 16 again.
4. Flattened only, last: the heaviest microbatch of the complete updates swaps a long sample for a shorter one
   with the same targets from a microbatch that stays below it, until no such swap lowers it (`trim_peak`):
   labels unchanged, token variance and the peak only drop. Trades may lift a microbatch up to the plan's peak,
   which the untouched tail can set, far above what the complete updates need.

5. Padded only, last: swaps of a sample each that lower the cost CV (and never raise the label variance or the
   attention CV), spending at most a share (`_cost_spread.SPEND`) of the padding the trades saved: the trades above
   only hold the cost CV, the reference lowers it.

Why it stops: deals are one pass each; the peak trim when the heaviest microbatch has no swap; trades per window
after IDLE idle rounds and per pass when no window traded (or, padded, none was kept). Cost: each deal a counting
sort and a heap pass, the trim a scan of a class per swap; trades as in `_exchange`.
Microbatches of more than 62 samples (bit-mask width) are left as they are.
"""

from __future__ import annotations

import numpy as np

from plancc.config.settings import PlanSettings
from plancc.core.plan_arrays import Batches, SampleArrays, batch_cost, batch_targets, batch_tokens
from plancc.planner.balance import _common as common
from plancc.planner.balance._cost_spread import even_padded_costs
from plancc.planner.balance._redeal import deal_equal_labels, deal_equal_lengths, trim_peak
from plancc.planner.balance._subset_tables import LOCAL

ROUNDS = 32  # pairing rounds per window and pass (stops early after IDLE idle rounds)
QUANTA = (256, 64, 16, 4, 1)  # flattened: class widths of the alternating deals, coarse to fine
PADDED_WINDOW = 16  # padded: windows are the unit the cost-CV guard keeps or drops; small ones keep more trades


def balance_fixed_count(batches: Batches, samples: SampleArrays, settings: PlanSettings) -> Batches:
    """Stage 2 for `padded` and `flattened`: deals, then pair trades (module docstring)."""
    if not 2 <= settings.micro_batch_size <= LOCAL:
        return batches
    window = settings.balance_window
    start = deal_equal_lengths(batches, samples, settings)
    if settings.mode == "flattened":
        start = _alternate_deals(batches, start, samples, settings)
        traded = common.exchange(start, samples, settings,
                                 windows=lambda pass_index, labels: common.stratified_windows(labels, window),
                                 passes=settings.balance_passes, rounds=ROUNDS)
        return trim_peak(traded, samples, settings)
    window = min(window, PADDED_WINDOW)
    traded = exchange_within_cost_cv(start, samples, settings,
                                     lambda labels, cost: cost_halves_windows(labels, cost, window),
                                     passes=2 * settings.balance_passes, rounds=ROUNDS)
    return even_padded_costs(traded, samples, settings, int(batch_cost(batches, samples, settings.pad_multiple).sum()))


def exchange_within_cost_cv(batches: Batches, samples: SampleArrays, settings: PlanSettings, windows, *, passes: int,
                            rounds: int) -> Batches:
    """Padded: pair trades (`_common.exchange`) one pass at a time over `windows(mb_labels, mb_costs)` of the span,
    a window's trades kept only while the plan's cost CV stays at or below `batches`'s.

    Windows share no microbatch, and a window's trades keep its label total and only lower its squared labels, so
    any subset of windows may be kept: they are taken in order of cost-CV change per padding token saved, each
    while the bound holds. Never raises the label variance, the total or the peak cost, or the cost CV.
    """
    n_span = common.span(batches, settings)
    if n_span < 2:
        return batches
    work = _work(batches, samples, settings)
    bound = float(batches.num_batches * (work * work).sum() / work.sum() ** 2)  # n Q / S^2 = CV^2 + 1
    for _ in range(passes):
        w = windows(batch_targets(batches, samples, settings.shift)[:n_span],
                    batch_cost(batches, samples, settings.pad_multiple)[:n_span])
        new = common.exchange(batches, samples, settings, windows=lambda pass_index, labels, w=w: w, passes=1, rounds=rounds)
        kept = _windows_within(batches, new, *w, samples, settings, bound)
        if kept is batches:
            break
        batches = kept
    return batches


def _work(batches: Batches, samples: SampleArrays, settings: PlanSettings) -> np.ndarray:
    """Per microbatch, as floats, what the guard keeps from spreading: the cost (token slots).

    Not the attention work (padded rows x padded length squared): holding its CV too, measured with `--cost
    attention`, kept fewer trades (more padding, a higher label CV) for no gain a rank sees; rank
    ordering evens attention out where ranks wait on it."""
    return batch_cost(batches, samples, settings.pad_multiple).astype(np.float64)


def cost_halves_windows(labels: np.ndarray, cost: np.ndarray, window: int) -> tuple[np.ndarray, np.ndarray]:
    """Windows (CSR bounds, members) stratified by labels inside the lower and the upper half of the costs."""
    order = np.argsort(cost, kind="stable")
    bounds, members = [np.zeros(1, dtype=np.int64)], []
    for half in (order[: order.shape[0] // 2], order[order.shape[0] // 2:]):
        w_bounds, w_members = common.stratified_windows(labels[half], window)
        bounds.append(w_bounds[1:] + bounds[-1][-1])
        members.append(half[w_members])
    return np.concatenate(bounds), np.concatenate(members).astype(np.int64)


def _windows_within(batches: Batches, new: Batches, w_bounds: np.ndarray, w_members: np.ndarray, samples: SampleArrays,
                    settings: PlanSettings, bound: float) -> Batches:
    """`batches` with the microbatches of the windows of `new` that keep n * sum(x^2) / sum(x)^2 <= `bound` for the
    costs x (`_work`). The greedy walk over windows is sequential, so it runs on Python floats (numpy calls per
    window, tens of thousands a plan, cost a twentieth of the stage)."""
    n_win = w_bounds.shape[0] - 1
    win_of = np.full(batches.num_batches, -1, dtype=np.int64)
    win_of[w_members] = np.repeat(np.arange(n_win, dtype=np.int64), np.diff(w_bounds))
    x0, x1 = _work(batches, samples, settings), _work(new, samples, settings)
    inside = win_of >= 0
    d_sum = np.bincount(win_of[inside], weights=(x1 - x0)[inside], minlength=n_win)
    d_sq = np.bincount(win_of[inside], weights=(x1 * x1 - x0 * x0)[inside], minlength=n_win)
    batch_of_pos = batches.batch_of_row()[batches.row_of_sample()]
    span_pos = win_of[batch_of_pos] >= 0
    moved = np.zeros(n_win, dtype=bool)
    moved[np.unique(win_of[batch_of_pos][(new.samples != batches.samples) & span_pos])] = True
    n = batches.num_batches
    total, squares = float(x0.sum()), float((x0 * x0).sum())
    # first-order change of the cost's CV^2 bound expression per token saved: most CV-friendly first
    slope = (n * d_sq - bound * 2 * total * d_sum) / np.maximum(-d_sum, 1.0)
    take = np.zeros(n_win, dtype=bool)
    d_sum_of, d_sq_of = d_sum.tolist(), d_sq.tolist()
    order = np.argsort(slope, kind="stable")
    for w in order[moved[order]].tolist():
        t, q = total + d_sum_of[w], squares + d_sq_of[w]
        if n * q <= bound * t * t:
            take[w], total, squares = True, t, q
    if not take.any():
        return batches
    pick = np.zeros(batches.samples.shape[0], dtype=bool)
    pick[span_pos] = take[win_of[batch_of_pos][span_pos]]
    return Batches(np.where(pick, new.samples, batches.samples), batches.row_bounds, batches.batch_bounds)


def _alternate_deals(batches: Batches, start: Batches, samples: SampleArrays, settings: PlanSettings) -> Batches:
    """Flattened: deals of near-equal target counts (evening tokens) and near-equal lengths (evening labels) in
    turn, classes `QUANTA` wide, coarse to fine. Each is kept only if it lowers the sum of the two squared CVs;
    the result only if neither variance ends above the stage input `batches`'s, else `start` (the exact length deal of
    `batches`) with the exact label deal, which is always safe."""
    def objective(x: Batches) -> tuple[float, float]:
        return (common.label_sse(batch_targets(x, samples, settings.shift)), common.label_sse(batch_tokens(x, samples)))

    labels0, tokens0 = objective(batches)
    scale = (float(batch_targets(batches, samples, settings.shift).mean()) ** 2 or 1.0,
             float(batch_tokens(batches, samples).mean()) ** 2)
    best = start
    best_j = sum(x / y for x, y in zip(objective(start), scale, strict=True))
    for q in QUANTA:
        for deal in (deal_equal_labels, deal_equal_lengths):
            new = deal(best, samples, settings, quantum=q)
            if new is best:
                continue
            lab, tok = objective(new)
            j = lab / scale[0] + tok / scale[1]
            if j < best_j:
                best, best_j = new, j
    lab, tok = objective(best)
    return best if lab <= labels0 and tok <= tokens0 else deal_equal_labels(start, samples, settings)

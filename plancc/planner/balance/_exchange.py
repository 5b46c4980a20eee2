"""Subset trades between two microbatches: the local move behind microbatch, fixed-count and within-update balance.

A window is a set of at most 64 microbatches. Each round sorts them by label count and pairs the heaviest half with
the lightest half — round 0 heaviest with lightest, round r rotating the light partners by r — and each pair
trades the subsets of samples (up to three a side) that bring their label counts closest to each other::

    row A (high):  [a1 a2 a3 a4]  labels 900        give {a2}     (len 310, 250 labels)
    row B (low):   [b1 b2 b3]     labels 300        take {b3, b1} (len 305,  40 labels)
    after:         A 690, B 510   — lengths moved net 5 tokens, which fit B's free space

Rows filled to 99.99% by first-fit-decreasing leave almost no free space, so a trade needs subsets of (nearly)
equal length: single swaps rarely find one, subsets of two and three samples multiply the candidates (a row of 27
samples has 378 subsets of size <= 2; only the first SUB_CAP are kept: a longer table finds barely better trades
for much more time), and the feasible ones are found by a merge join of the two rows' length-sorted tables (cached
per row, rebuilt only after the row trades). Rotating partners matters as much: a heavy row of a few long samples
shares equal-length subsets with only some rows, and meets a new one every round.

A trade is taken only if it strictly narrows the pair's label gap (for `flattened`, neither the label gap nor the
token gap may widen), and only if neither microbatch's padded cost grows past the plan's peak nor the pair's cost
total past what it was. The pair's label total is unchanged, so a narrower gap always lowers the plan's label
variance: every trade is an improvement, and no change is kept that is not one.

It stops on its own: a window ends after `rounds` pairing rounds, or after IDLE rounds in a row that lower its
spread by under MIN_GAIN; a pass ends when its windows do; the caller runs at most `balance_passes` passes and
stops after one that makes no trade. Cost per round and pair: the two rows' subset tables (at most SUB_CAP
subsets, rebuilt only after their row traded: O(SUB_CAP log) each) and a merge join of at most SUB_CAP x
`scan_limit` candidates, so O(microbatches x rounds x passes) with a constant of SUB_CAP x `scan_limit`
candidate checks, in parallel over windows.

The kernel's data is three structures: `State` (the plan's arrays the trades read and change), `Rules` (the scalars
that bound a trade and a window) and `Tables` (one window's subset tables, built and refilled in `_subset_tables`).
numba reference-counts an array each time a variable takes it, and a helper's parameters are such variables, inlined
or not: a call that takes `State` or `Tables` costs two atomic operations per array of them (12 and 8: `Tables`
keeps its columns in a few shared arrays for this reason), which made the trades a third slower when paid per pair,
and still cost much when paid per round or per table rebuild. So only scalar helpers are inlined and a window's
rounds and searches run in one call (`_trade_rounds`); the search indexes the structures in place, and what takes
them whole runs once a round (`rebuild_stale`, the round's table builds) or where a trade is made (`_apply_trade`);
padded costs come from per-subset columns of the tables, not from a call.

Modes (`cost_mode`): PACKED (rows of items, capacity per row, microbatch cost = rows x padded longest row),
FLATTENED (one row, exact item counts, cost = tokens), PADDED (one group of items per microbatch, exact counts,
cost = items x padded longest item). Under `--shift row` the first sample of every row stays put (`pinned`), so each
row's "first label is not a target" correction never changes.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from plancc.core.jit import numba
from plancc.planner.balance._rounds import IDLE, MIN_GAIN, by_labels, pair_up, remember, window_spread
from plancc.planner.balance._subset_tables import (
    LEN,
    MASK,
    REST,
    TOP,
    VAL,
    has_length,
    popcount,
    rebuild_stale,
    refill,
    window_tables,
)

# the kernel's cost modes (a layout's mode as a number numba compiles in as a constant)
PACKED, FLATTENED, PADDED = 0, 1, 2


class State(NamedTuple):
    """The plan as the trades see it, over kernel rows (packed/flattened: plan rows; padded: one a microbatch).
    Trades change `row_of` and the four totals in place; the rest is read only but the table orders' cache. Every
    array is int64 but `pinned` and the cache's."""

    row_items_bounds: np.ndarray  # (kernel rows + 1,) CSR over kernel rows of the items each holds at the start
    row_items: np.ndarray  # (items,) the items of each kernel row, by that CSR
    row_of: np.ndarray  # (items,) kernel row of each item
    pinned: np.ndarray  # bool (items,) items that never move (row shift: a row's first sample)
    item_len: np.ndarray  # (items,) tokens of each item
    item_val: np.ndarray  # (items,) labels an item brings (see `_common.item_values`)
    row_tok: np.ndarray  # (kernel rows,) tokens per kernel row
    row_val: np.ndarray  # (kernel rows,) labels per kernel row
    mb_val: np.ndarray  # (microbatches,) labels per microbatch
    mb_tok: np.ndarray  # (microbatches,) the secondary value (tokens, or attention with `Rules.square`)
    row_cap: np.ndarray  # (kernel rows,) tokens a kernel row may hold
    batch_bounds: np.ndarray  # (microbatches + 1,) CSR of kernel rows per microbatch
    # uint8 (kernel rows or none, SUB_CAP) a row's table order from an earlier pass (`_subset_tables.rebuild_stale`),
    # valid where `ordered`: bool (kernel rows or none,) cleared when the row trades
    orders: np.ndarray
    ordered: np.ndarray


class Rules(NamedTuple):
    """What a trade may do and when a window stops (scalars)."""

    pad_multiple: int  # costs round lengths up to this
    peak: int  # no microbatch's padded cost above this
    cost_mode: int  # PACKED, FLATTENED or PADDED (module docstring)
    max_sub: int  # items a side of a trade
    tok_weight: float  # weight of the squared secondary gap (`mb_tok`: flattened tokens, or attention), else 0
    square: bool  # the secondary value of an item is its squared length (attention work), not its length
    rounds: int  # pairing rounds per window
    scan_limit: int  # partner subsets examined per subset
    tol: int  # label gaps this small are left alone


@numba.njit(cache=True, inline="always")
def _padded(tokens, pad_multiple):
    """`tokens` rounded up to a multiple of `pad_multiple` (ints)."""
    return -(-tokens // pad_multiple) * pad_multiple


@numba.njit(cache=True)
def _mb_cost(mb, row_a, new_a, row_b, new_b, batch_bounds, row_tok, pad_multiple, cost_mode):
    """Cost of microbatch `mb` if kernel rows `row_a`/`row_b` held `new_a`/`new_b` tokens (packed, flattened).

    Args:
        mb: int — the microbatch.
        row_a, row_b: int — kernel rows whose tokens change (-1: none).
        new_a, new_b: int — their token totals after the trade.
        batch_bounds, row_tok: `State` arrays.
        pad_multiple, cost_mode: `Rules` scalars.
    """
    longest = 0
    for row in range(batch_bounds[mb], batch_bounds[mb + 1]):
        tokens = row_tok[row]
        if row == row_a:
            tokens = new_a
        elif row == row_b:
            tokens = new_b
        if tokens > longest:
            longest = tokens
    if cost_mode == FLATTENED:
        return _padded(longest, pad_multiple)
    return (batch_bounds[mb + 1] - batch_bounds[mb]) * _padded(longest, pad_multiple)


@numba.njit(cache=True, inline="always")
def _secondary(items, slot, mask, item_len, length, square):
    """A subset's secondary value: its `length`, or with `square` the sum of its items' squared lengths.

    Args:
        items: int64 (slots, LOCAL) — `Tables.items`.
        slot: int — the subset's slot.
        mask: int64 — the subset's items, a bit per position in `items[slot]`.
        item_len: `State.item_len`.
        length: int — the subset's tokens.
        square: bool — `Rules.square`.
    """
    if not square:
        return length
    out = 0
    x = 0
    while mask >> x:  # up to the highest item of the subset
        if (mask >> x) & 1:
            out += item_len[items[slot, x]] * item_len[items[slot, x]]
        x += 1
    return out


@numba.njit(cache=True)
def _cost_before(mb_a, mb_b, batch_bounds, row_tok, rules):
    """The pair's cost total before a trade between microbatches `mb_a` and `mb_b` (packed, flattened).
    Args as `_cost_allowed`."""
    return (_mb_cost(mb_a, -1, 0, -1, 0, batch_bounds, row_tok, rules.pad_multiple, rules.cost_mode)
            + _mb_cost(mb_b, -1, 0, -1, 0, batch_bounds, row_tok, rules.pad_multiple, rules.cost_mode))


@numba.njit(cache=True)
def _cost_allowed(mb_a, mb_b, row_a, row_b, len_a, len_b, before, row_tok, batch_bounds, rules):
    """Whether a trade keeps both microbatches' costs within the peak and the pair's total within `before` (packed,
    flattened; padded tests its costs in `_trade_rounds`, from the subset tables).

    Args:
        mb_a, mb_b, row_a, row_b: int — the microbatches and their kernel rows that trade.
        len_a, len_b: int — row_a gives `len_a` tokens to row_b for `len_b`.
        before: int — the pair's cost total before (`_cost_before`).
        row_tok, batch_bounds: `State` arrays (only these: every array passed stays live through the caller's hot
            loop).
        rules: `Rules`.
    """
    new_a = row_tok[row_a] - len_a + len_b
    new_b = row_tok[row_b] - len_b + len_a
    cost_a = _mb_cost(mb_a, row_a, new_a, row_b, new_b, batch_bounds, row_tok, rules.pad_multiple, rules.cost_mode)
    cost_b = _mb_cost(mb_b, row_a, new_a, row_b, new_b, batch_bounds, row_tok, rules.pad_multiple, rules.cost_mode)
    return cost_a <= rules.peak and cost_b <= rules.peak and cost_a + cost_b <= before


NO_TRADE = (-1, -1, 0, 0, 0, 0, 0, 0, 0, 0)  # a pair's best trade before its search finds one


@numba.njit(cache=True)
def _trade_rounds(window_mbs, state, rules, tables):
    """The pairing rounds of one window (see `exchange_windows`); returns the number of trades made.

    Each round sorts the window by labels, pairs it up (`_rounds.pair_up`), and each pair (mb_a with more labels, mb_b)
    makes its best trade, if any, in place. A pair's best trade leaves the smallest label gap (plus weighted
    secondary gap) within the rules; the first one leaving a gap within `tol` is good enough. For each subset of
    an A row, by length, B's subsets that keep both rows within their capacity form a window of lengths that only
    moves up: a merge join of the two length-sorted tables, `scan_limit` candidates each. The rounds and the
    pairs' searches are written out in one call: a call per round or per pair (even inlined) reference-counts
    every array of `state` and `tables` (module docstring), which cost a third of the trades' time.

    Args:
        window_mbs: int64 (window,) — the window's microbatches.
        state, rules, tables: `State` (changed in place), `Rules`, the window's `Tables` (rebuilt where stale).
    """
    bounds = state.batch_bounds
    exact = rules.cost_mode != PACKED
    padded = rules.cost_mode == PADDED
    packed = rules.cost_mode == PACKED
    trades = 0
    size = window_mbs.shape[0]
    order = np.arange(size)
    pairs = np.empty((size // 2, 5), dtype=np.int64)
    memo = np.full((size + 1, size), -1, dtype=np.int64)
    idle = 0
    spread = window_spread(window_mbs, state.mb_val, state.mb_tok, rules.tok_weight)
    for round_index in range(rules.rounds):
        traded_before = trades
        by_labels(order, window_mbs, state.mb_val)
        n_pairs = pair_up(window_mbs, order, round_index, pairs, memo, state.mb_val, rules)
        rebuild_stale(pairs, n_pairs, bounds, tables, state.item_len, state.item_val, rules.max_sub, exact, padded,
                      packed, state.orders, state.ordered)
        for pair in range(n_pairs):
            mb_a, mb_b = pairs[pair, 0], pairs[pair, 1]
            gap0 = state.mb_val[mb_a] - state.mb_val[mb_b]
            tgap0 = abs(state.mb_tok[mb_a] - state.mb_tok[mb_b])
            best_score = float(gap0) * gap0 + rules.tok_weight * float(tgap0) * tgap0
            best, done = NO_TRADE, False
            rows_a, rows_b = bounds[mb_a + 1] - bounds[mb_a], bounds[mb_b + 1] - bounds[mb_b]
            simple_cost = rules.cost_mode == PACKED and rules.pad_multiple == 1 and rows_a == 1 and rows_b == 1
            for row_pair in range(rows_a * rows_b):  # a row each, unpadded (simple_cost): capacity bounds the cost
                row_a, row_b = bounds[mb_a] + row_pair // rows_b, bounds[mb_b] + row_pair % rows_b
                slot_a, slot_b = tables.slot_of[row_a], tables.slot_of[row_b]
                n_sub_a, n_sub_b = tables.n_subsets[slot_a], tables.n_subsets[slot_b]
                if n_sub_a == 0 or n_sub_b == 0:
                    continue
                free_a = state.row_cap[row_a] - state.row_tok[row_a]
                free_b = state.row_cap[row_b] - state.row_tok[row_b]
                # padded: a microbatch costs its items x its longest item, which the tables hold per subset
                n_a, n_b = tables.n_items[slot_a], tables.n_items[slot_b]
                if padded:  # any subset's longest item inside or outside it is the slot's longest
                    top_a = max(tables.subsets[slot_a, TOP, 0], tables.subsets[slot_a, REST, 0])
                    top_b = max(tables.subsets[slot_b, TOP, 0], tables.subsets[slot_b, REST, 0])
                    before = n_a * _padded(top_a, rules.pad_multiple) + n_b * _padded(top_b, rules.pad_multiple)
                else:
                    before = 0 if simple_cost else _cost_before(mb_a, mb_b, bounds, state.row_tok, rules)
                start = 0
                narrow = packed and free_a + free_b < 32  # B's lengths a subset of A may meet fit `has_length`
                last_b = tables.subsets[slot_b, LEN, n_sub_b - 1]
                for i in range(n_sub_a):
                    len_a = tables.subsets[slot_a, LEN, i]
                    # B's subset length len_b: row_a ends at tok_a - len_a + len_b <= cap_a,
                    # row_b at tok_b + len_a - len_b <= cap_b
                    low, high = len_a - free_b, len_a + free_a
                    if narrow:  # most subsets meet no partner: skipped before the merge join's steps
                        if low > last_b:
                            break
                        if not has_length(tables.subsets, slot_b, max(low, 0), high):
                            continue
                    while start < n_sub_b and tables.subsets[slot_b, LEN, start] < low:
                        start += 1
                    if start == n_sub_b:
                        break
                    if tables.subsets[slot_b, LEN, start] > high:  # most subsets meet no partner (rows nearly full)
                        continue
                    val_a, mask_a = tables.subsets[slot_a, VAL, i], tables.subsets[slot_a, MASK, i]
                    size_a = popcount(mask_a)
                    stop = min(start + rules.scan_limit, n_sub_b)
                    # exact counts: most of B's table is in reach, and 99% of its candidates fail the first test below;
                    # a loop without a branch that counts those passing it (vectorized: its index unsigned, so numba
                    # adds no negative-index wrap and the loads stay contiguous, not gathers) skips most subsets
                    if exact:
                        hits = 0
                        for j in range(np.uint64(start), np.uint64(stop)):
                            gap = gap0 - 2 * (val_a - tables.subsets[slot_b, VAL, j])
                            hits += (abs(gap) < abs(gap0)) & (popcount(tables.subsets[slot_b, MASK, j]) == size_a)
                        if hits == 0:
                            continue
                    for j in range(start, stop):
                        len_b = tables.subsets[slot_b, LEN, j]
                        if len_b > high:
                            break
                        val_b, mask_b = tables.subsets[slot_b, VAL, j], tables.subsets[slot_b, MASK, j]
                        gap = gap0 - 2 * (val_a - val_b)  # val_a - val_b labels move from A to B
                        # one test, no branch per condition (`|`): most candidates fail it, in no predictable pattern
                        if ((abs(gap) >= abs(gap0)) | ((size_a == 0) & (mask_b == 0))
                                | (exact & (popcount(mask_b) != size_a))):
                            continue
                        tgap, sec_a, sec_b = 0, len_a, len_b
                        if rules.cost_mode == FLATTENED or rules.tok_weight > 0.0:  # the secondary gap may not widen
                            sec_a = _secondary(tables.items, slot_a, mask_a, state.item_len, len_a, rules.square)
                            sec_b = _secondary(tables.items, slot_b, mask_b, state.item_len, len_b, rules.square)
                            tgap = abs((state.mb_tok[mb_a] - sec_a + sec_b) - (state.mb_tok[mb_b] - sec_b + sec_a))
                            if tgap > tgap0:
                                continue
                        score = float(gap) * gap + rules.tok_weight * float(tgap) * tgap
                        if score >= best_score:
                            continue
                        if padded:
                            cost_a = n_a * _padded(max(tables.subsets[slot_a, REST, i], tables.subsets[slot_b, TOP, j]),
                                                   rules.pad_multiple)
                            cost_b = n_b * _padded(max(tables.subsets[slot_b, REST, j], tables.subsets[slot_a, TOP, i]),
                                                   rules.pad_multiple)
                            if cost_a > rules.peak or cost_b > rules.peak or cost_a + cost_b > before:
                                continue
                        elif not (simple_cost or _cost_allowed(mb_a, mb_b, row_a, row_b, len_a, len_b, before,
                                                               state.row_tok, bounds, rules)):
                            continue
                        best_score = score
                        best = (row_a, row_b, mask_a, mask_b, len_a, len_b, val_a, val_b, sec_a, sec_b)
                        done = abs(gap) <= rules.tol and rules.tok_weight == 0.0
                        if done:
                            break
                    if done:
                        break
                if done:
                    break
            pairs[pair, 2] = best[0] >= 0
            if best[0] >= 0:
                _apply_trade(mb_a, mb_b, best, state, tables)
                trades += 1
        remember(pairs, n_pairs, memo, round_index)
        last = spread
        if trades > traded_before:  # else the window is as it was
            spread = window_spread(window_mbs, state.mb_val, state.mb_tok, rules.tok_weight)
        idle = 0 if last - spread > MIN_GAIN * last else idle + 1
        if idle >= IDLE:
            break
    return trades


@numba.njit(cache=True)
def _apply_trade(mb_a, mb_b, trade, state, tables):
    """Make `trade`: row_a gives its `mask_a` items (len_a tokens, val_a labels, sec_a secondary) to row_b for row_b's
    `mask_b` items. Changes the items' rows, both slots' item lists (marked for rebuilding) and the row and
    microbatch totals.

    Args:
        mb_a, mb_b: int — the microbatches of row_a and row_b.
        trade: 10 int64 — (row_a, row_b, mask_a, mask_b, len_a, len_b, val_a, val_b, sec_a, sec_b), as
            `_trade_rounds` finds it.
        state, tables: `State` and the window's `Tables`, changed in place.
    """
    row_a, row_b, mask_a, mask_b, len_a, len_b, val_a, val_b, sec_a, sec_b = trade
    slot_a = tables.slot_of[row_a]
    slot_b = tables.slot_of[row_b]
    n_a = tables.n_items[slot_a]
    n_b = tables.n_items[slot_b]
    for x in range(n_a):  # (loops, not slice copies: see `_subset_tables.radix_order`)
        tables.keep[0, x] = tables.items[slot_a, x]
    for x in range(n_b):
        tables.keep[1, x] = tables.items[slot_b, x]
    for x in range(n_a):
        if (mask_a >> x) & 1:
            state.row_of[tables.keep[0, x]] = row_b
    for x in range(n_b):
        if (mask_b >> x) & 1:
            state.row_of[tables.keep[1, x]] = row_a
    tables.n_items[slot_a] = refill(tables.items, slot_a, tables.keep[1], n_b, mask_b, tables.keep[0], n_a, mask_a)
    tables.n_items[slot_b] = refill(tables.items, slot_b, tables.keep[0], n_a, mask_a, tables.keep[1], n_b, mask_b)
    tables.valid[slot_a] = False
    tables.valid[slot_b] = False
    if row_a < state.ordered.shape[0]:  # their items change: an earlier pass's table orders no longer hold
        state.ordered[row_a] = state.ordered[row_b] = False
    state.row_tok[row_a] += len_b - len_a
    state.row_tok[row_b] += len_a - len_b
    state.row_val[row_a] += val_b - val_a
    state.row_val[row_b] += val_a - val_b
    state.mb_val[mb_a] += val_b - val_a
    state.mb_val[mb_b] += val_a - val_b
    state.mb_tok[mb_a] += sec_b - sec_a
    state.mb_tok[mb_b] += sec_a - sec_b


@numba.njit(cache=True)
def _window(window_mbs, state, rules, slot_of):
    """Pairing rounds of one window (`_trade_rounds`); touches only the window's rows and samples.

    Args:
        window_mbs: int64 (window,) — the window's microbatches.
        state, rules: `State` (changed in place), `Rules`.
        slot_of: int64 (kernel rows,) — `Tables.slot_of`.
    Returns: int, the trades made.
    """
    columns = 5 if rules.cost_mode == PADDED else 4 if rules.cost_mode == PACKED else 3
    return _trade_rounds(window_mbs, state, rules, window_tables(window_mbs, state, slot_of, columns))


@numba.njit(cache=True, parallel=True)
def exchange_windows(win_bounds, win_mbs, state, rules):
    """Pairing rounds inside every window of the plan `state` (changed in place) under `rules`; returns the
    number of trades made.

    Round 0 pairs the heaviest microbatch with the lightest, the second with the second lightest, ...; round r
    rotates the light partners by r, so a heavy microbatch meets a new partner (and new exact-length subsets) each
    round. Pairs whose label gap is at most `tol`, or one label (no trade narrows it), are left alone. A window
    stops after IDLE idle rounds in a row (rounds that lower its spread by under MIN_GAIN: at small capacities trades
    go on finding crumbs for long).
    Windows share no microbatch, row or sample, so they run in parallel with the same result on any thread count.

    Args:
        win_bounds: int64 (windows + 1,) — CSR bounds of the windows over `win_mbs`.
        win_mbs: int64 (microbatches in windows,) — each window's microbatches.
        state: `State`.
        rules: `Rules`.
    """
    n_windows = win_bounds.shape[0] - 1
    slot_of = np.zeros(state.row_tok.shape[0], dtype=np.int64)
    made = np.zeros(n_windows, dtype=np.int64)
    for w in numba.prange(n_windows):
        window_mbs = win_mbs[win_bounds[w]:win_bounds[w + 1]]
        if window_mbs.shape[0] >= 2:
            made[w] = _window(window_mbs, state, rules, slot_of)
    return made.sum()

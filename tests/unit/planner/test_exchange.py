"""The trade search (`plancc.planner.balance._exchange`): what a pair of microbatches can and cannot gain."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from plancc.planner.balance._common import SCAN
from plancc.planner.balance._exchange import FLATTENED, PACKED, PADDED, Rules, State, _trade_rounds
from plancc.planner.balance._subset_tables import (
    BITS,
    LEN,
    SPAN,
    SUB_CAP,
    has_length,
    radix_order,
    window_tables,
)

ROW = st.lists(st.tuples(st.integers(1, 40), st.integers(0, 30)), min_size=1, max_size=12)  # (tokens, labels)


def _two_microbatches(a: list[tuple[int, int]], b: list[tuple[int, int]], gap: int, slack: int, stretch: int = 1):
    """State and tables of two one-row microbatches holding `a` and `b` (tokens times `stretch`), the first `gap`
    labels heavier (the lighter row's first sample takes what it lacks), each row `slack` tokens short of its
    capacity."""
    length = np.array([x * stretch for x, _ in a + b], dtype=np.int64)
    value = np.array([y for _, y in a + b], dtype=np.int64)
    missing = gap - (value[: len(a)].sum() - value[len(a):].sum())
    value[0 if missing > 0 else len(a)] += abs(missing)
    bounds = np.array([0, len(a), len(a) + len(b)], dtype=np.int64)
    row_tok = np.add.reduceat(length, bounds[:-1])
    row_val = np.add.reduceat(value, bounds[:-1])
    state = State(bounds, np.arange(len(length), dtype=np.int64), np.repeat(np.arange(2), [len(a), len(b)]),
                  np.zeros(len(length), dtype=np.bool_), length, value, row_tok, row_val.copy(), row_val.copy(),
                  row_tok.copy(), row_tok + slack, np.arange(3, dtype=np.int64), np.empty((0, SUB_CAP), np.uint8),
                  np.zeros(0, dtype=np.bool_))
    window = np.arange(2, dtype=np.int64)
    return state, window_tables(window, state, np.zeros(2, dtype=np.int64), 5)  # room for every mode's columns


@given(a=ROW, b=ROW, gap=st.integers(0, 1), slack=st.integers(0, 60), mode=st.sampled_from([PACKED, FLATTENED, PADDED]))
def test_microbatches_one_label_apart_never_trade(a, b, gap, slack, mode):
    """Labels move in whole samples, so no trade narrows a gap of one (or none): the rounds skip such pairs
    instead of searching them (`_rounds.pair_up`), which is exact only while this holds. A secondary weight, however
    small, makes the rounds search every pair: the search itself finds nothing here."""
    state, tables = _two_microbatches(a, b, gap, slack)
    before = [x.copy() for x in (state.row_of, state.mb_val, state.row_tok)]
    rules = Rules(pad_multiple=1, peak=1 << 40, cost_mode=mode, max_sub=3 if mode == PACKED else 2, tok_weight=1e-12,
                  square=False, rounds=1, scan_limit=SCAN, tol=0)
    assert _trade_rounds(np.arange(2, dtype=np.int64), state, rules, tables) == 0
    assert all((x == y).all() for x, y in zip(before, (state.row_of, state.mb_val, state.row_tok), strict=True))


def test_microbatches_two_labels_apart_trade():
    """The same search does narrow a gap of two: the skip above is the only pairs it leaves out."""
    state, tables = _two_microbatches([(5, 1), (5, 1)], [(5, 0), (5, 0)], 2, 0)
    rules = Rules(pad_multiple=1, peak=1 << 40, cost_mode=PACKED, max_sub=3, tok_weight=0.0, square=False, rounds=1,
                  scan_limit=SCAN, tol=0)
    assert _trade_rounds(np.arange(2, dtype=np.int64), state, rules, tables) == 1
    assert state.mb_val.tolist() == [1, 1]


def _kept_subsets(lengths: list[int], values: list[int]) -> np.ndarray:
    """(tokens, labels) of the subsets a table keeps, in its enumeration order: none, singles, pairs, triples (rows
    of at most 16 samples), the first SUB_CAP of them (`_subset_tables.fill_subsets`)."""
    items = range(len(lengths))
    sizes = range(4 if len(lengths) <= 16 else 3)
    subsets = [c for k in sizes for c in itertools.combinations(items, k)][:SUB_CAP]
    return np.array([(sum(lengths[i] for i in c), sum(values[i] for i in c)) for c in subsets], dtype=np.int64)


@given(a=ROW, b=ROW, gap=st.integers(2, 60), slack=st.integers(0, 40), stretch=st.sampled_from([1, 997]))
@example(a=[(4, 5), (6, 0), (2, 5)], b=[(10, 0)], gap=10, slack=0, stretch=1)  # the best partner is B's longest
def test_a_pair_reaches_the_best_trade_of_its_tables(a, b, gap, slack, stretch):
    """One round (packed, no scan limit, no tolerance) leaves the pair at the narrowest label gap that any trade of
    two kept subsets reaches within both rows' capacities, checked against every pair of them: the merge join's
    shortcuts (a subset whose length window holds no partner is passed over before its labels are read, by the
    lengths' bitmap where the window is narrow; the search ends where B's table does) drop no candidate, whether
    the rows' free space makes the window narrow or wide, and with lengths past the bitmap's SPAN (`stretch`)."""
    state, tables = _two_microbatches(a, b, gap, slack, stretch)
    n_a = len(a)
    sub_a = _kept_subsets(state.item_len[:n_a].tolist(), state.item_val[:n_a].tolist())
    sub_b = _kept_subsets(state.item_len[n_a:].tolist(), state.item_val[n_a:].tolist())
    len_a, len_b = sub_a[:, :1], sub_b[:, 0]
    fits = ((state.row_tok[0] - len_a + len_b <= state.row_cap[0])
            & (state.row_tok[1] - len_b + len_a <= state.row_cap[1]))
    fits[0, 0] = False  # nothing for nothing
    gaps = np.abs(gap - 2 * (sub_a[:, 1:] - sub_b[:, 1]))
    best = min(gap, int(gaps[fits].min(initial=gap)))
    rules = Rules(pad_multiple=1, peak=1 << 40, cost_mode=PACKED, max_sub=3, tok_weight=0.0, square=False, rounds=1,
                  scan_limit=1 << 20, tol=0)
    assert _trade_rounds(np.arange(2, dtype=np.int64), state, rules, tables) == (best < gap)
    assert abs(int(state.mb_val[0] - state.mb_val[1])) == best



@given(a=ROW, b=ROW, gap=st.integers(2, 60), slack=st.integers(0, 40), mode=st.sampled_from([FLATTENED, PADDED]))
def test_an_exact_count_pair_reaches_the_best_trade_of_its_tables(a, b, gap, slack, mode):
    """The same in the fixed-count layouts (subsets of one or two samples, equal sizes a side): the count of each
    subset's passing candidates that skips most subsets before the search drops none. Flattened: within both rows'
    capacities and the token gap not widened; padded: no capacity, the pair's padded cost (items x longest item)
    not raised."""
    state, tables = _two_microbatches(a, b, gap, slack)
    n_a, n_b = len(a), len(b)
    lengths, values = state.item_len.tolist(), state.item_val.tolist()
    subs = [[c for k in (1, 2) for c in itertools.combinations(range(lo, lo + n), k)] for lo, n in ((0, n_a), (n_a, n_b))]
    tok_a, tok_b = (int(x) for x in state.row_tok)
    before = n_a * max(lengths[:n_a]) + n_b * max(lengths[n_a:])
    best = gap
    for sa, sb in itertools.product(*subs):
        if len(sa) != len(sb):
            continue
        len_a, len_b = sum(lengths[i] for i in sa), sum(lengths[i] for i in sb)
        if mode == FLATTENED:
            new_a, new_b = tok_a - len_a + len_b, tok_b - len_b + len_a
            if new_a > state.row_cap[0] or new_b > state.row_cap[1] or abs(new_a - new_b) > abs(tok_a - tok_b):
                continue
        else:
            top_a = max([lengths[i] for i in range(n_a) if i not in sa] + [lengths[i] for i in sb])
            top_b = max([lengths[i] for i in range(n_a, n_a + n_b) if i not in sb] + [lengths[i] for i in sa])
            if n_a * top_a + n_b * top_b > before:
                continue
        best = min(best, abs(gap - 2 * (sum(values[i] for i in sa) - sum(values[i] for i in sb))))
    if mode == PADDED:  # padded kernel rows have no capacity
        state.row_cap[:] = 1 << 40
    rules = Rules(pad_multiple=1, peak=1 << 40, cost_mode=mode, max_sub=2, tok_weight=0.0, square=False, rounds=1,
                  scan_limit=1 << 20, tol=0)
    assert _trade_rounds(np.arange(2, dtype=np.int64), state, rules, tables) == (best < gap)
    assert abs(int(state.mb_val[0] - state.mb_val[1])) == best


@given(near=st.lists(st.tuples(st.integers(-40, 40), st.integers(0, 2)), min_size=1, max_size=SUB_CAP),
       low=st.integers(0, 3 * SPAN), width=st.integers(0, 32))
def test_the_lengths_bitmap_misses_no_length(near, low, width):
    """`has_length` of `low` to `low + width - 1` tokens is false exactly where no length of the table falls in that
    range modulo SPAN: never false where a length is in it, and true past SPAN only by such a coincidence. The
    lengths lie near `low` or near it plus a multiple of SPAN, so the range straddles their bits' words."""
    from plancc.planner.balance._subset_tables import _bits

    lengths = [max(low + offset + k * SPAN, 0) for offset, k in near]
    subsets = np.zeros((1, BITS + 1, SUB_CAP), dtype=np.int64)
    subsets[0, LEN, : len(lengths)] = sorted(lengths)
    _bits(subsets, 0, len(lengths))
    high = low + width - 1
    assert has_length(subsets, 0, low, high) == any((x - low) % SPAN < width for x in lengths)
    assert has_length(subsets, 0, low, high) or not any(low <= x <= high for x in lengths)


@given(count=st.integers(0, 300), bits=st.integers(0, 40), distinct=st.integers(1, 400), seed=st.integers(0, 2**32 - 1))
def test_radix_order_is_a_stable_argsort(count, bits, distinct, seed):
    """The subset tables' (and the accumulation stage's) sort: the stable ascending order of the first `count` keys,
    whatever their count (insertion up to SHORT) and size (digit width chosen from the largest key); keys drawn
    from `distinct` values make ties."""
    rng = np.random.default_rng(seed)
    pool = rng.integers(0, 1 << bits, distinct)
    keys = np.append(rng.choice(pool, count), rng.integers(0, 1 << 41, 3))  # keys past `count` are not sorted
    order, scratch, digits = np.empty(count, np.int64), np.empty(count, np.int64), np.empty(257, np.int64)
    radix_order(keys, count, order, scratch, digits)
    assert order.tolist() == np.argsort(keys[:count], kind="stable").tolist()


@pytest.mark.parametrize("seed", [0, 1])
def test_table_orders_kept_across_passes_change_no_plan(monkeypatch, seed):
    """Rows that did not trade keep their tables' sort orders from pass to pass (`State.orders`); with none kept
    (`ORDERS_BYTES` 0) every table is sorted afresh, and the plans are the same. Rows of ~7 samples (capacity
    4096, mbs 1) have 64-subset tables, sorted by radix, over twelve passes with trades in each."""
    from benchmarks.synthetic import sft_mix
    from plancc.config.settings import PlanSettings
    from plancc.planner import pipeline
    from plancc.planner.balance import _common

    samples = sft_mix(12_000, seed=seed)
    settings = PlanSettings(mode="packed", micro_batch_size=1, sequence_len=4096, world_size=8, grad_accum=4, seed=seed)
    kept = pipeline.plan_epoch(samples, settings, 0).batches
    monkeypatch.setattr(_common, "ORDERS_BYTES", 0)
    fresh = pipeline.plan_epoch(samples, settings, 0).batches
    for a, b in ((kept.samples, fresh.samples), (kept.row_bounds, fresh.row_bounds)):
        assert np.array_equal(a, b)

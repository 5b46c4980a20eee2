"""The trade search (`plancc.planner.balance._exchange`): what a pair of microbatches can and cannot gain."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from plancc.planner.balance._common import SCAN
from plancc.planner.balance._exchange import FLATTENED, PACKED, PADDED, Rules, State, _trade_rounds
from plancc.planner.balance._subset_tables import SUB_CAP, radix_order, window_tables

ROW = st.lists(st.tuples(st.integers(1, 40), st.integers(0, 30)), min_size=1, max_size=12)  # (tokens, labels)


def _two_microbatches(a: list[tuple[int, int]], b: list[tuple[int, int]], gap: int, slack: int):
    """State and tables of two one-row microbatches holding `a` and `b`, the first `gap` labels heavier (the
    lighter row's first sample takes what it lacks), each row `slack` tokens short of its capacity."""
    length = np.array([x for x, _ in a + b], dtype=np.int64)
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
    return state, window_tables(window, state, np.zeros(2, dtype=np.int64), True)


@given(a=ROW, b=ROW, gap=st.integers(0, 1), slack=st.integers(0, 60), mode=st.sampled_from([PACKED, FLATTENED, PADDED]))
def test_microbatches_one_label_apart_never_trade(a, b, gap, slack, mode):
    """Labels move in whole samples, so no trade narrows a gap of one (or none): the rounds skip such pairs
    instead of searching them (`_pair_up`), which is exact only while this holds. A secondary weight, however
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


@given(a=ROW, b=ROW, gap=st.integers(2, 60), slack=st.integers(0, 8))
def test_a_pair_reaches_the_best_trade_of_its_tables(a, b, gap, slack):
    """One round (packed, no scan limit, no tolerance) leaves the pair at the narrowest label gap that any trade of
    two kept subsets reaches within both rows' capacities, checked against every pair of them: the merge join's
    shortcuts (a subset whose length window holds no partner is passed over before its labels are read; the
    search ends where B's table does) drop no candidate."""
    state, tables = _two_microbatches(a, b, gap, slack)
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

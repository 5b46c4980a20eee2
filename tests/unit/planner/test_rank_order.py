"""Rank ordering's step 3 (`balance/rank_order.py`): label swaps between ranks and the per-update choice."""

from __future__ import annotations

import itertools
from unittest import mock

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from plancc.planner.balance import rank_order
from plancc.planner.balance.rank_order import SCHEDULE, choose, even_rank_labels, pair_rounds, rank_cv

SHAPES = [(2, 1), (2, 4), (3, 2), (4, 3), (5, 2), (8, 4)]  # (W, G)


def draw(seed: int, W: int, G: int, n_upd: int = 6, spread: int = 50):
    rng = np.random.default_rng(seed)
    work, labels = rng.integers(0, spread, (2, n_upd, W * G))
    order = np.array([rng.permutation(W * G) for _ in range(n_upd)])
    return order, work, labels


def totals(x: np.ndarray, order: np.ndarray, W: int) -> np.ndarray:
    return x[np.arange(order.shape[0])[:, None], order].reshape(order.shape[0], -1, W).sum(axis=1)


@given(st.integers(0, 2**32 - 1), st.sampled_from(SHAPES), st.sampled_from([3, 50, 1000]))
def test_label_swaps_keep_steps_bounds_and_mean_work_cv(seed, shape, spread):
    W, G = shape
    order, work, labels = draw(seed, W, G, spread=spread)
    new = even_rank_labels(order, work, labels, W)
    n = order.shape[0]
    # the same microbatches in every micro-step
    assert (np.sort(new.reshape(n, G, W), axis=2) == np.sort(order.reshape(n, G, W), axis=2)).all()
    # no update's slowest rank gets slower, nor its fastest faster
    w0, w1 = totals(work, order, W), totals(work, new, W)
    assert (w1.max(axis=1) <= w0.max(axis=1)).all() and (w1.min(axis=1) >= w0.min(axis=1)).all()
    # the mean rank work and label CVs end at most where the free swaps alone leave them
    free = even_rank_labels(order, work, labels, W, schedule=SCHEDULE[:1])
    for x in (work, labels):
        assert rank_cv(x, new, W).sum() <= rank_cv(x, free, W).sum() <= rank_cv(x, order, W).sum() * (1 + 1e-12)


@given(st.integers(0, 2**32 - 1), st.sampled_from(SHAPES))
def test_strict_sweeps_never_raise_an_updates_work_squares(seed, shape):
    W, G = shape
    order, work, labels = draw(seed, W, G)
    new = even_rank_labels(order, work, labels, W, schedule=SCHEDULE[:1])
    w0, w1 = totals(work, order, W), totals(work, new, W)
    assert ((w1 ** 2).sum(axis=1) <= (w0 ** 2).sum(axis=1)).all()
    assert ((totals(labels, new, W) ** 2).sum(axis=1) <= (totals(labels, order, W) ** 2).sum(axis=1)).all()


def test_priced_sweeps_even_labels_further_at_the_same_mean_work_cv():
    W, G = 8, 4
    order, work, labels = draw(0, W, G, n_upd=200, spread=1000)
    work = work + 2000  # microbatches of similar work, as the fixed-count layouts make them
    strict = even_rank_labels(order, work, labels, W, schedule=SCHEDULE[:1])
    new = even_rank_labels(order, work, labels, W)
    assert rank_cv(labels, new, W).mean() < rank_cv(labels, strict, W).mean() < rank_cv(labels, order, W).mean()
    assert rank_cv(work, new, W).sum() <= rank_cv(work, strict, W).sum()


def test_choose_spends_one_updates_work_saving_on_anothers_labels():
    # update 0: candidate 1 saves work CV and costs labels; update 1: candidate 1 gains labels for more work CV
    w_cv = np.array([[0.10, 0.10], [0.05, 0.15]])
    l_cv = np.array([[0.50, 0.50], [0.55, 0.20]])
    assert choose(w_cv, l_cv).tolist() == [1, 1]  # work 0.20 as candidate 0's, labels 0.75 (candidate 0: 1.00)
    w_cv[1, 0] = 0.06  # update 0 saves too little for update 1's gain
    assert choose(w_cv, l_cv).tolist() == [0, 0]
    # one update: every multiplier within candidate 0's work picks candidate 1 (less work than candidate 0, but
    # more label CV), as candidate 0 is off the hull; candidate 0 stays
    assert choose(np.array([[0.10], [0.05], [0.20]]), np.array([[0.50], [0.52], [0.30]])).tolist() == [0]


@given(st.integers(0, 2**32 - 1), st.integers(1, 4), st.integers(1, 30))
def test_choose_never_loses_to_candidate_zero(seed, k, n):
    rng = np.random.default_rng(seed)
    w_cv, l_cv = rng.random((2, k, n))
    pick = choose(w_cv, l_cv)
    cols = np.arange(n)
    assert w_cv[pick, cols].sum() <= w_cv[0].sum() and l_cv[pick, cols].sum() <= l_cv[0].sum()


@given(st.integers(2, 12))
def test_pair_rounds_meet_every_pair_once_in_disjoint_rounds(W):
    rounds = pair_rounds(W)
    pairs = [tuple(sorted(p)) for r1, r2 in rounds for p in zip(r1.tolist(), r2.tolist(), strict=True)]
    assert sorted(pairs) == list(itertools.combinations(range(W), 2))
    for r1, r2 in rounds:
        ranks = np.concatenate([r1, r2])
        assert len(set(ranks.tolist())) == len(ranks) and ranks.max() < W


def test_blocks_of_updates_change_nothing():
    order, work, labels = draw(1, 4, 3, n_upd=11, spread=1000)
    whole = even_rank_labels(order, work, labels, 4)
    with mock.patch.object(rank_order, "BLOCK", 3):  # blocks of 3, 3, 3 and 2 updates
        assert np.array_equal(even_rank_labels(order, work, labels, 4), whole)

"""docs/spec.md §5's hard rules for every balancing stage, as properties over random plans, plus known-solvable cases."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from plancc.config.settings import PlanSettings
from plancc.core.plan_arrays import (
    Batches,
    SampleArrays,
    batch_attention,
    batch_cost,
    batch_targets,
    batch_tokens,
    row_tokens,
)
from plancc.errors import SettingsError
from plancc.planner import balance, pack
from plancc.planner.balance import _common as c
from plancc.planner.balance.accumulation import order_for_accumulation
from plancc.planner.balance.microbatch import balance_microbatches
from plancc.planner.balance.rank_order import deal_to_ranks, order_ranks
from plancc.planner.balance.within_update import update_windows
from plancc.planner.metrics import summarize
from plancc.planner.pipeline import drop_tail, epoch_rng, plan_epoch
from tests.support.plans import direct_targets, random_dataset

LAYOUTS = [("packed", False), ("packed", True), ("padded", False), ("flattened", False)]


@st.composite
def cases(draw):
    mode, real = draw(st.sampled_from(LAYOUTS))
    seq = draw(st.sampled_from([32, 64, 128]))
    n = draw(st.integers(1, 400))
    seed = draw(st.integers(0, 2**32 - 1))
    settings = PlanSettings(
        mode=mode,
        real_batches=real,
        micro_batch_size=draw(st.integers(1, 4)),
        sequence_len=seq,
        pad_multiple=draw(st.sampled_from([1, 1, 8])),
        world_size=draw(st.sampled_from([1, 2, 8])),
        grad_accum=draw(st.sampled_from([1, 4])),
        drop_last=draw(st.booleans()),
        shift=draw(st.sampled_from(["sample", "row", "none"])),
        seed=draw(st.integers(0, 1000)),
        balance_window=draw(st.sampled_from([2, 7, 64])),
        balance_passes=draw(st.integers(1, 4)),
        cost=draw(st.sampled_from(["tokens", "attention"])),
    )
    rng = np.random.default_rng(seed)
    skew = draw(st.sampled_from(["uniform", "sft"]))
    if skew == "uniform":
        length = rng.integers(1, seq + 1, n)
    else:
        length = np.clip(np.rint(rng.lognormal(np.log(seq / 6), 0.9, n)), 1, seq).astype(np.int64)
    labels = np.minimum(length, rng.integers(0, seq + 1, n) * (rng.random(n) < 0.8))
    first = (rng.random(n) < 0.3) & (labels > 0)
    s = SampleArrays(np.arange(n, dtype=np.int64) * 3 + 1, length.astype(np.int64), labels.astype(np.int64), first)
    return s, settings


def _sse(x: np.ndarray) -> float:
    return c.label_sse(x)


def _batch_sets(b: Batches) -> list[tuple[int, ...]]:
    rows = [tuple(sorted(b.samples[b.row_bounds[r]:b.row_bounds[r + 1]].tolist())) for r in range(b.num_rows)]
    return [tuple(sorted(rows[b.batch_bounds[i]:b.batch_bounds[i + 1]])) for i in range(b.num_batches)]


def _update_sets(b: Batches, settings: PlanSettings, n_span: int) -> list[list[int]]:
    P = settings.batches_per_update
    out = []
    for u in range(0, n_span, P):
        lo, hi = b.row_bounds[b.batch_bounds[u]], b.row_bounds[b.batch_bounds[u + P]]
        out.append(sorted(b.samples[lo:hi].tolist()))
    return out


def _within_update_sse(labels: np.ndarray, P: int, n_span: int) -> float:
    x = labels[:n_span].reshape(-1, P).astype(np.float64)
    return float(((x - x.mean(axis=1, keepdims=True)) ** 2).sum())


def _spreads(x: np.ndarray, W: int, n_span: int) -> tuple[float, float]:
    if n_span == 0:
        return 0.0, 0.0
    steps = x[:n_span].reshape(-1, W)
    spread = steps.max(axis=1) - steps.min(axis=1)
    return float(spread.sum()), float(spread.max())


def check_stage(name: str, before: Batches, after: Batches, s: SampleArrays, settings: PlanSettings) -> None:
    """Every hard rule of docs/spec.md §5 for one stage, comparing its output with its input."""
    n_span = c.span(before, settings)
    if before.num_batches == 0:  # drop_last removed everything: nothing to balance
        assert after.num_batches == 0 and after.samples.size == 0
        return
    # coverage, no sample added or removed, no extra rows or microbatches, row count per microbatch unchanged
    assert np.array_equal(np.sort(after.samples), np.sort(before.samples))
    assert after.num_batches == before.num_batches and after.num_rows == before.num_rows
    if name in ("accumulation", "rank_order"):  # whole microbatches move, each with its rows
        assert sorted(after.rows_per_batch().tolist()) == sorted(before.rows_per_batch().tolist())
    else:
        assert np.array_equal(after.rows_per_batch(), before.rows_per_batch())
    assert (after.samples_per_row() > 0).all()
    # fixed-count layouts: every microbatch keeps its sample count
    sizes0, sizes1 = np.diff(before.row_bounds[before.batch_bounds]), np.diff(after.row_bounds[after.batch_bounds])
    if settings.mode != "packed" and name in ("accumulation", "rank_order"):
        assert sorted(sizes1.tolist()) == sorted(sizes0.tolist()), name
    elif settings.mode != "packed":
        assert np.array_equal(sizes1, sizes0), name
    if settings.mode == "padded":
        assert (after.samples_per_row() == 1).all()
    # capacity, padded size and peak
    if settings.mode == "packed":
        assert row_tokens(after, s).max() <= settings.row_capacity
    cost0, cost1 = batch_cost(before, s, settings.pad_multiple), batch_cost(after, s, settings.pad_multiple)
    assert cost1.sum() <= cost0.sum() and cost1.max() <= cost0.max()
    # the tail: microbatches of the incomplete final update, untouched (contents and order)
    p0 = before.row_bounds[before.batch_bounds[n_span]]
    assert np.array_equal(after.samples[p0:], before.samples[p0:])
    assert np.array_equal(after.row_bounds[before.batch_bounds[n_span]:], before.row_bounds[before.batch_bounds[n_span]:])
    l0, l1 = batch_targets(before, s, settings.shift), batch_targets(after, s, settings.shift)
    assert l0.sum() == l1.sum()
    P = settings.batches_per_update
    # each stage keeps a change only if it improves its own objective
    if name in ("microbatch", "fixed_count"):
        assert _sse(l1) <= _sse(l0)
        if settings.mode == "flattened":
            assert _sse(batch_tokens(after, s)) <= _sse(batch_tokens(before, s))
        if _sse(l1) == _sse(l0) and settings.mode != "flattened":
            assert cost1.sum() <= cost0.sum()
    if name == "accumulation":
        assert sorted(_batch_sets(after)) == sorted(_batch_sets(before))  # whole microbatches only
        t0 = l0[:n_span].reshape(-1, P).sum(axis=1) if n_span else l0[:0]
        t1 = l1[:n_span].reshape(-1, P).sum(axis=1) if n_span else l1[:0]
        assert _sse(t1) <= _sse(t0)
    if name in ("within_update", "rank_order"):
        assert _update_sets(after, settings, n_span) == _update_sets(before, settings, n_span)
    if name == "within_update":
        assert _within_update_sse(l1, P, n_span) <= _within_update_sse(l0, P, n_span)
        if settings.cost == "attention" and settings.mode != "padded":  # attention gaps never widen either
            a0, a1 = (batch_attention(x, s, settings.mode, 1) for x in (before, after))
            assert _sse(a1) <= _sse(a0) * (1 + 1e-12)
    if settings.mode == "padded" and name in ("fixed_count", "within_update"):  # the guard on the trades
        assert _cv(cost1) <= _cv(cost0) * (1 + 1e-12)
    if name == "rank_order":
        assert _batch_sets(after) == [_batch_sets(before)[i] for i in _order(before, after)]
        if settings.cost == "attention":
            cost0, cost1 = (batch_attention(x, s, settings.mode, settings.pad_multiple) for x in (before, after))
        s0, m0 = _spreads(cost0, settings.world_size, n_span)
        s1, m1 = _spreads(cost1, settings.world_size, n_span)
        assert s1 <= s0 and m1 <= m0
        # the ranks' totals over each update: no update's max - min grows
        assert (_rank_total_spread(cost1, settings, n_span) <= _rank_total_spread(cost0, settings, n_span)).all()


def _cv(x: np.ndarray) -> float:
    x = x.astype(np.float64)
    return float(x.std() / x.mean()) if x.size and x.mean() > 0 else 0.0


def _rank_total_spread(x: np.ndarray, settings: PlanSettings, n_span: int) -> np.ndarray:
    totals = x[:n_span].reshape(-1, settings.grad_accum, settings.world_size).sum(axis=1)
    return totals.max(axis=1) - totals.min(axis=1)


def _order(before: Batches, after: Batches) -> list[int]:
    """Index in `before` of each microbatch of `after` (microbatches matched by content)."""
    where: dict = {}
    for i, key in enumerate(_batch_sets(before)):
        where.setdefault(key, []).append(i)
    return [where[key].pop(0) for key in _batch_sets(after)]


@given(cases())
def test_every_stage_keeps_the_hard_rules(case):
    s, settings = case
    rng = epoch_rng(settings.seed, 0)
    b = pack.initial_batches(s, settings, rng)
    if settings.drop_last:
        b = drop_tail(b, settings)
    for name, stage in balance.stages(settings, rng):
        new = stage(b, s, settings)
        check_stage(name, b, new, s, settings)
        b = new


@given(cases())
def test_balanced_plans_are_deterministic_and_metrics_never_worsen(case):
    s, settings = case
    try:
        p1, p2 = plan_epoch(s, settings, 0), plan_epoch(s, settings, 0)
    except SettingsError:  # --drop-last left no complete update
        assert settings.drop_last
        return
    for x, y in zip((p1.batches.samples, p1.batches.row_bounds, p1.batches.batch_bounds),
                    (p2.batches.samples, p2.batches.row_bounds, p2.batches.batch_bounds), strict=True):
        assert np.array_equal(x, y)
    m = dict(p1.metrics)
    first = "microbatch" if settings.mode == "packed" else "fixed_count"
    if first in m:
        assert m[first]["std_label_count"] <= m["before"]["std_label_count"] + 1e-9
        assert m[first]["packed_rows"] == m["before"]["packed_rows"]
    if "accumulation" in m:
        assert m["accumulation"]["std_global_update_labels"] <= m[first]["std_global_update_labels"] + 1e-9
    if "rank_order" in m:
        work = "attention" if settings.cost == "attention" else "cost"
        assert m["rank_order"][f"max_rank_{work}_spread"] <= m["within_update"][f"max_rank_{work}_spread"]
        assert m["rank_order"][f"mean_rank_{work}_spread"] <= m["within_update"][f"mean_rank_{work}_spread"] + 1e-9
    assert m["after"]["total_label_count"] == m["before"]["total_label_count"]
    assert m["after"]["total_batch_cost"] <= m["before"]["total_batch_cost"]
    assert m["after"]["max_batch_cost"] <= m["before"]["max_batch_cost"]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("shift", ["sample", "row", "none"])
def test_label_counts_equal_the_direct_count_after_balancing(layout, shift):
    mode, real = layout
    rng = np.random.default_rng(7)
    ids, labels = random_dataset(rng, 300, 60)
    if shift == "none":  # pre-shifted labels: count them as they are
        labels = [np.append(x[1:], -100) for x in labels]
    s = SampleArrays(
        np.arange(300, dtype=np.int64),
        np.array([len(x) for x in ids], dtype=np.int64),
        np.array([int((x != -100).sum()) for x in labels], dtype=np.int64),
        np.array([bool(x[0] != -100) for x in labels]),
    )
    settings = PlanSettings(mode=mode, real_batches=real, micro_batch_size=3, sequence_len=64, world_size=2,
                            grad_accum=4, shift=shift)
    p = plan_epoch(s, settings, 0)
    b = p.batches
    assert dict(p.metrics)["after"]["label_cv"] < dict(p.metrics)["before"]["label_cv"]
    counts = batch_targets(b, s, shift)
    for i in range(b.num_batches):
        rows = [b.samples[b.row_bounds[r]:b.row_bounds[r + 1]].tolist() for r in range(b.batch_bounds[i], b.batch_bounds[i + 1])]
        assert counts[i] == direct_targets(rows, labels, shift)


def _single_sample_batches(labels: list[int]) -> tuple[Batches, SampleArrays]:
    n = len(labels)
    s = SampleArrays(np.arange(n, dtype=np.int64), np.full(n, 10, dtype=np.int64), np.array(labels, dtype=np.int64),
                     np.zeros(n, dtype=bool))
    b = Batches(np.arange(n, dtype=np.int64), np.arange(n + 1, dtype=np.int64), np.arange(n + 1, dtype=np.int64))
    return b, s


@pytest.mark.parametrize(("W", "G"), [(2, 1), (1, 2)])
def test_accumulation_reaches_zero_spread_on_a_solvable_case(W, G):
    b, s = _single_sample_batches([9] * 16 + [1] * 16)  # worst start: the 9s together
    settings = PlanSettings(world_size=W, grad_accum=G, shift="none", sequence_len=16)
    new = order_for_accumulation(b, s, settings)
    totals = batch_targets(new, s, "none").reshape(-1, 2).sum(axis=1)
    assert (totals == 10).all()


def test_accumulation_keeps_the_tail_in_place():
    b, s = _single_sample_batches([9] * 16 + [1] * 16 + [5, 7, 3])
    settings = PlanSettings(world_size=2, grad_accum=2, shift="none", sequence_len=16)
    new = order_for_accumulation(b, s, settings)
    assert new.samples[-3:].tolist() == [32, 33, 34]
    totals = batch_targets(new, s, "none")[:32].reshape(-1, 4).sum(axis=1)
    assert (totals == 20).all()


def test_microbatch_balance_finds_the_equal_length_trade():
    # two full rows: (10 tokens, 9 labels) x2 and (10 tokens, 1 label) x2 -> one of each per row
    s = SampleArrays(np.arange(4, dtype=np.int64), np.full(4, 10, dtype=np.int64), np.array([9, 9, 1, 1]),
                     np.zeros(4, dtype=bool))
    b = Batches(np.arange(4, dtype=np.int64), np.array([0, 2, 4]), np.array([0, 1, 2]))
    settings = PlanSettings(micro_batch_size=1, sequence_len=20, shift="none")
    new = balance_microbatches(b, s, settings, rng=np.random.default_rng(0))
    assert batch_targets(new, s, "none").tolist() == [10, 10]
    assert row_tokens(new, s).tolist() == [20, 20]


def test_rank_order_puts_similar_costs_on_the_same_micro_step():
    lengths = [100, 10, 90, 20]  # micro-steps (100, 10) and (90, 20): spreads 90 and 70
    s = SampleArrays(np.arange(4, dtype=np.int64), np.array(lengths, dtype=np.int64), np.ones(4, dtype=np.int64),
                     np.zeros(4, dtype=bool))
    b = Batches(np.arange(4, dtype=np.int64), np.arange(5), np.arange(5))
    settings = PlanSettings(world_size=2, grad_accum=2, sequence_len=128, shift="none")
    new = order_ranks(b, s, settings)
    # steps (100, 90) and (20, 10); the second step's heavier microbatch goes to the rank with less work so far
    assert batch_tokens(new, s).tolist() == [100, 90, 10, 20]


def test_rank_order_evens_rank_totals():
    # every micro-step holds a heavy and a light microbatch, the heavy one always on rank 0 (totals 400 and 40)
    lengths = [100, 10, 100, 10, 100, 10, 100, 10]
    s = SampleArrays(np.arange(8, dtype=np.int64), np.array(lengths, dtype=np.int64), np.ones(8, dtype=np.int64),
                     np.zeros(8, dtype=bool))
    b = Batches(np.arange(8, dtype=np.int64), np.arange(9), np.arange(9))
    settings = PlanSettings(world_size=2, grad_accum=4, sequence_len=128, shift="none")
    work = batch_tokens(order_ranks(b, s, settings), s).reshape(4, 2)
    assert work.sum(axis=0).tolist() == [220, 220] and (work.max(axis=1) == work.min(axis=1)).all()
    # the rank deal alone (steps kept): the heavy microbatch alternates between the ranks
    dealt = deal_to_ranks(np.arange(8)[None, :], np.array([lengths]), 2)
    assert np.array(lengths)[dealt].reshape(4, 2).sum(axis=0).tolist() == [220, 220]


def test_rank_order_evens_rank_label_totals_at_equal_work():
    # micro-steps of equal work (100, 100) and (50, 50); rank 0 holds the label-heavy microbatch of both (labels
    # 90 + 40 against 10 + 10): swapping one step's two microbatches evens the ranks' labels (50 and 100)
    s = SampleArrays(np.arange(4, dtype=np.int64), np.array([100, 100, 50, 50]), np.array([90, 10, 40, 10]),
                     np.zeros(4, dtype=bool))
    b = Batches(np.arange(4, dtype=np.int64), np.arange(5), np.arange(5))
    settings = PlanSettings(world_size=2, grad_accum=2, sequence_len=128, shift="none")
    new = order_ranks(b, s, settings)
    assert sorted(batch_targets(new, s, "none").reshape(2, 2).sum(axis=0).tolist()) == [50, 100]
    assert batch_tokens(new, s).reshape(2, 2).sum(axis=0).tolist() == [150, 150]
    assert sorted(new.samples[:2].tolist()) == [0, 1]  # each micro-step keeps its microbatches


def test_attention_cost_puts_similar_attention_on_the_same_micro_step():
    # microbatches of equal tokens: one sample of 100 (attention 10000) or ten of 10 (attention 1000)
    lengths = [100] + [10] * 10 + [100] + [10] * 10
    labels = np.where(np.array(lengths) == 100, 10, 1)  # 10 labels in every microbatch
    s = SampleArrays(np.arange(22, dtype=np.int64), np.array(lengths, dtype=np.int64), labels,
                     np.zeros(22, dtype=bool))
    bounds = np.array([0, 1, 11, 12, 22])
    b = Batches(np.arange(22, dtype=np.int64), bounds, np.arange(5))
    assert batch_attention(b, s, "packed", 1).tolist() == [10000, 1000, 10000, 1000]
    tokens = PlanSettings(world_size=2, grad_accum=2, sequence_len=128, shift="none")
    assert order_ranks(b, s, tokens) is b  # equal token costs: nothing to gain
    attention = PlanSettings(world_size=2, grad_accum=2, sequence_len=128, shift="none", cost="attention")
    new = order_ranks(b, s, attention)
    assert batch_attention(new, s, "packed", 1).tolist() == [10000, 10000, 1000, 1000]
    m = summarize(new, s, attention)
    assert m["max_rank_attention_spread"] == 0 and summarize(b, s, attention)["max_rank_attention_spread"] == 9000


def test_padded_attention_counts_the_padded_rows():
    s = SampleArrays(np.arange(3, dtype=np.int64), np.array([5, 9, 3]), np.ones(3, dtype=np.int64),
                     np.zeros(3, dtype=bool))
    b = Batches(np.arange(3, dtype=np.int64), np.arange(4), np.array([0, 2, 3]))  # rows (5, 9) and (3)
    assert batch_attention(b, s, "padded", 4).tolist() == [2 * 12 * 12, 4 * 4]
    assert batch_attention(b, s, "flattened", 4).tolist() == [25 + 81, 9]


def test_no_balance_keeps_the_plain_plan():
    settings = PlanSettings(balance=False, world_size=2, grad_accum=4)
    assert balance.stages(settings, np.random.default_rng(0)) == []


def test_balanced_plan_is_identical_on_any_thread_count():
    import numba

    rng = np.random.default_rng(3)
    n = 3000
    length = np.clip(np.rint(rng.lognormal(4.5, 0.9, n)), 2, 512).astype(np.int64)
    labels = np.minimum(length - 1, np.rint(rng.lognormal(3.5, 1.2, n)).astype(np.int64))
    s = SampleArrays(np.arange(n, dtype=np.int64), length, labels, np.zeros(n, dtype=bool))
    settings = PlanSettings(micro_batch_size=2, sequence_len=512, world_size=2, grad_accum=2)
    plans = []
    for threads in sorted({1, numba.config.NUMBA_NUM_THREADS}):
        numba.set_num_threads(threads)
        try:
            plans.append(plan_epoch(s, settings, 0).batches)
        finally:
            numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)
    for other in plans[1:]:
        assert np.array_equal(other.samples, plans[0].samples)
        assert np.array_equal(other.row_bounds, plans[0].row_bounds)
    m = dict(plan_epoch(s, settings, 0).metrics)
    assert m["after"]["label_cv"] < 0.5 * m["before"]["label_cv"]
    assert m["after"]["update_label_cv"] < 0.5 * m["before"]["update_label_cv"]


@pytest.mark.parametrize("mode", ["flattened", "padded"])
def test_fixed_count_layouts_beat_the_reference_figures_on_the_sft_mix(mode):
    # the reference sampler's figures on this draw (benchmarks/bench_balance.py --fixed --reference, 20k, seed 0,
    # mbs 4, W=8, G=4), by plancc's metric definitions: label CV, cost CV, padding tokens, rank cost CV
    reference = {"flattened": (0.4645, 0.1560, 0, 0.0541), "padded": (0.6068, 0.5977, 10_740_226, 0.1912)}[mode]
    rng = np.random.default_rng(0)  # the mix of benchmarks/synthetic.py
    n = 20_000
    prompt = np.clip(np.rint(rng.lognormal(5.5, 0.9, n)), 8, 3000).astype(np.int64)
    completion = np.clip(np.rint(rng.lognormal(4.8, 1.2, n)), 1, 3000).astype(np.int64)
    length = np.minimum(prompt + completion, 4096)
    s = SampleArrays(np.arange(n, dtype=np.int64), length, np.minimum(completion, length - 1), np.zeros(n, dtype=bool))
    settings = PlanSettings(mode=mode, micro_batch_size=4, sequence_len=4096, world_size=8, grad_accum=4)
    m = summarize(plan_epoch(s, settings, 0).batches, s, settings)
    got = (m["label_cv"], m["std_batch_cost"] / m["mean_batch_cost"], m["padding_tokens"], m["rank_cost_cv"])
    assert all(a <= b for a, b in zip(got, reference, strict=True)), (got, reference)


@given(cases())
def test_attention_trades_never_widen_label_or_attention_spread(case):
    # the within-update pass of --cost attention: every trade narrows a label gap and keeps the pair's attention
    # total while not widening its attention gap, so neither variance can grow
    s, settings = case
    if settings.mode == "padded":
        settings = dataclasses.replace(settings, mode="packed")
    settings = dataclasses.replace(settings, cost="attention")
    b = pack.initial_batches(s, settings, epoch_rng(settings.seed, 0))
    P, window = settings.batches_per_update, settings.balance_window
    new = c.exchange(b, s, settings, windows=lambda p, v: update_windows(v.shape[0], P, window), passes=1,
                     rounds=4, square=True)
    check_stage("within_update", b, new, s, settings)
    for x0, x1 in ((batch_targets(b, s, settings.shift), batch_targets(new, s, settings.shift)),
                   (batch_attention(b, s, settings.mode, 1), batch_attention(new, s, settings.mode, 1))):
        assert _sse(x1) <= _sse(x0) * (1 + 1e-12)


@given(cases())
def test_evening_padded_costs_lowers_cost_cv_and_raises_neither_labels_attention_nor_padding_past_its_budget(case):
    from plancc.planner.balance._cost_spread import SPEND, even_padded_costs

    s, settings = case
    settings = dataclasses.replace(settings, mode="padded", real_batches=False)
    b = pack.initial_batches(s, settings, epoch_rng(settings.seed, 0))
    cost0 = batch_cost(b, s, settings.pad_multiple)
    total = int(cost0.sum()) + int(cost0.max())  # room to spend: the budget is SPEND of the difference
    new = even_padded_costs(b, s, settings, total)
    assert np.array_equal(np.sort(new.samples), np.sort(b.samples))
    assert np.array_equal(new.batch_bounds, b.batch_bounds) and np.array_equal(new.row_bounds, b.row_bounds)
    n_span = c.span(b, settings)
    assert np.array_equal(new.samples[new.row_bounds[new.batch_bounds[n_span]]:],
                          b.samples[b.row_bounds[b.batch_bounds[n_span]]:])  # the tail stays
    cost1 = batch_cost(new, s, settings.pad_multiple)
    assert cost1.max() <= cost0.max() and cost1.sum() <= cost0.sum() + SPEND * (total - cost0.sum())
    cv = [float(x.std() / x.mean()) for x in (cost0, cost1)]
    assert cv[1] <= cv[0] + 1e-12
    assert _sse(batch_targets(new, s, settings.shift)) <= _sse(batch_targets(b, s, settings.shift)) + 1e-9
    att = [batch_attention(x, s, "padded", settings.pad_multiple).astype(float) for x in (b, new)]
    assert att[1].std() / att[1].mean() <= att[0].std() / att[0].mean() + 1e-12

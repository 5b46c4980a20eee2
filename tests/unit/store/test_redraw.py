"""The read side's draws (`plancc.store.redraw`) are written again from the documented rules, not imported from
the planner: they must give the planner's held-out sets and mixture epochs exactly, and a plan whose eval set is
not the documented draw is a violation."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from plancc.build.run import write_plan_dir
from plancc.config.settings import PlanSettings
from plancc.planner import holdout, mixture
from plancc.planner.pipeline import compile_run
from plancc.review.validate import validate_plan
from plancc.store import redraw
from plancc.store.scan_record import ScanRecord
from tests.support.plans import random_dataset, samples_table

MIX = st.tuples(st.sampled_from(["train", "train", "eval"]), st.sampled_from(["repeat", "weight"]),
                st.sampled_from([0.25, 0.5, 1.0, 1.7, 2.0, 3.0]))


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.integers(1, 30), min_size=1, max_size=4), mix=st.lists(MIX, min_size=4, max_size=4),
       seed=st.integers(0, 2**31), val=st.sampled_from([0, 0.1, 0.3, 3]), per_epoch=st.none() | st.integers(1, 80),
       data=st.data())
def test_the_draws_are_the_planners(sizes, mix, seed, val, per_epoch, data):
    entries = tuple((f"d{d}", *mix[d]) for d in range(len(sizes)))
    if not any(role == "train" for _, role, _, _ in entries):
        return
    weighted = any(role == "train" and kind == "weight" for _, role, kind, _ in entries)
    s = PlanSettings(mixture=entries, seed=seed, val_set_size=val, epochs=4,
                     samples_per_epoch=per_epoch if weighted else None)
    index = np.asarray(data.draw(st.permutations(np.repeat(np.arange(len(sizes)), sizes).tolist())), dtype=np.int64)
    ids = np.arange(index.size, dtype=np.int64) * 7 + 3
    for epoch in range(4):
        np.testing.assert_array_equal(redraw.epoch_positions(index, s, epoch), mixture.plan_positions(index, s, epoch))
    try:
        want = holdout.eval_ids(ids, s, index)
    except Exception:  # a draw the compiler refuses (nothing left to train on): no plan to check
        return
    np.testing.assert_array_equal(redraw.eval_ids(ids, s, index), ids[:0] if want is None else want)
    if val:
        np.testing.assert_array_equal(redraw.eval_ids(ids, s), holdout.eval_ids(ids, s))


def test_an_eval_set_that_is_not_the_documented_draw_is_a_violation(tmp_path):
    """A compile that held out other samples (here: drawn under another seed) writes a plan whose every file agrees
    with itself; validate draws the set again and names the difference."""
    ids, labels = random_dataset(np.random.default_rng(3), 120, 64)
    table = samples_table(ids, labels)
    from plancc.store.parquet import sample_arrays

    s = sample_arrays(table)
    ps = PlanSettings(sequence_len=64, world_size=2, epochs=1, val_set_size=0.25, seed=1)
    other = compile_run(s, PlanSettings(sequence_len=64, world_size=2, epochs=1, val_set_size=0.25, seed=2))
    write_plan_dir(tmp_path / "p", table, other.train, ps, compile_run(s, ps).epochs, ScanRecord(), None,
                   evaluation=other.evaluation)
    problems = validate_plan(str(tmp_path / "p"))[0]
    assert any("the held-out draw of val_set_size 0.25, seed 1" in p for p in problems), problems


@pytest.mark.parametrize("val", [0.999, 120, 0.0001])
def test_a_draw_that_leaves_nothing_is_refused(val):
    with pytest.raises(Exception, match="val_set_size"):
        redraw.held_out(np.arange(120), val, 0)

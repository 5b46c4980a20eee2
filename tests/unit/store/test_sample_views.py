"""The planner reads a samples table's columns as views of its buffers, lengths and label counts int32 as stored
(what keeps a 100M-sample compile lean), and nothing computed from them may wrap: every derived count is exact at
int32's largest values. Integers narrowed on the way into Parquet (the plan's int32 list offsets) are checked."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from plancc.config.settings import PlanSettings
from plancc.core.plan_arrays import Batches
from plancc.core.row_sums import pack_facts
from plancc.planner.metrics import entry_targets
from plancc.planner.units import planning_units
from plancc.store import parquet, schemas
from plancc.store.parquet import arrow_array, sample_arrays

TOP = 2**31 - 1  # the largest length or label count a samples table's int32 columns hold


def _table(length: list[int], label_count: list[int], first: list[bool], **extra: pa.Array) -> pa.Table:
    n = len(length)
    return pa.table({"sample_id": pa.array(np.arange(n, dtype=np.int64)),
                     "length": pa.array(length, pa.int32()), "label_count": pa.array(label_count, pa.int32()),
                     "first_label_supervised": pa.array(first), "token_hash": pa.array(np.arange(n, dtype=np.uint64)),
                     **extra})


def test_columns_are_views_of_the_table():
    table = _table([5, 7, 9], [1, 2, 3], [True, False, True])
    s = sample_arrays(table)
    assert s.length.dtype == np.int32 and s.label_count.dtype == np.int32
    for name, values in (("sample_id", s.sample_id), ("length", s.length), ("label_count", s.label_count)):
        buffer = table.column(name).chunk(0).buffers()[1]
        assert np.shares_memory(values, np.frombuffer(buffer, dtype=values.dtype)), name
    assert s.length.tolist() == [5, 7, 9] and s.label_count.tolist() == [1, 2, 3]


def test_column_reads_a_many_chunk_column_whole():
    chunked = pa.table({"x": pa.chunked_array([pa.array([1, 2], pa.int32()), pa.array([3], pa.int32())])})
    assert parquet.column(chunked, "x").tolist() == [1, 2, 3]


lengths = st.integers(1, TOP)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(lengths, st.floats(0, 1), st.booleans()), min_size=2, max_size=8))
def test_derived_counts_never_wrap(rows):
    length = [n for n, _, _ in rows]
    label_count = [int(n * share) for n, share, _ in rows]
    first = [f and c > 0 for (_, _, f), c in zip(rows, label_count, strict=True)]
    s = sample_arrays(_table(length, label_count, first))
    want_sample = [c - f for c, f in zip(label_count, first, strict=True)]
    assert s.targets("sample").tolist() == want_sample
    assert s.targets("none").tolist() == label_count and s.targets("none").dtype == np.int64
    facts = pack_facts(s.length, s.label_count, s.first_label_supervised)
    assert (facts >> 32).tolist() == length and ((facts >> 1) & TOP).tolist() == label_count
    b = Batches(np.arange(len(rows), dtype=np.int64), np.array([0, len(rows)]), np.array([0, 1]))
    assert entry_targets(b, s, "row").tolist() == [label_count[0] - first[0], *label_count[1:]]


@pytest.mark.parametrize("mode", ["packed", "padded"])
def test_a_pair_of_the_longest_completions_sums_exactly(mode):
    table = _table([TOP, TOP - 1], [TOP - 1, TOP - 2], [True, True],
                   **{schemas.PAIR_ID_COLUMN: pa.array([0, 0], pa.int64()),
                      schemas.PAIR_ROLE_COLUMN: pa.array(["chosen", "rejected"])})
    s = sample_arrays(table)
    unit = planning_units(s, PlanSettings(mode=mode, shift="sample")).facts
    want_length = 2 * TOP if mode == "padded" else 2 * TOP - 1
    assert unit.length.tolist() == [want_length] and unit.label_count.tolist() == [2 * TOP - 4]


def test_narrowing_into_parquet_refuses_what_does_not_fit():
    assert arrow_array(np.array([0, TOP], dtype=np.int64), pa.int32()).to_pylist() == [0, TOP]
    with pytest.raises(schemas.StoreError, match=r"2,147,483,648 does not fit a int32 column"):
        arrow_array(np.array([0, TOP + 1], dtype=np.int64), pa.int32())
    with pytest.raises(schemas.StoreError, match=r"-2,147,483,649 does not fit"):
        arrow_array(np.array([-TOP - 2], dtype=np.int64), pa.int32())

"""A samples table read a row group at a time (`parquet.read_samples`) is the table Arrow reads whole, one chunk a
column, and a null anywhere is refused naming its first row and the column's count of nulls."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from plancc.store.parquet import read_samples
from plancc.store.schemas import StoreError


def _table(n: int, seed: int, null_rows: list[int] = ()) -> pa.Table:
    rng = np.random.default_rng(seed)
    length = rng.integers(1, 5000, n)
    valid = np.ones(n, dtype=bool)
    valid[list(null_rows)] = False
    return pa.table({"sample_id": pa.array(np.arange(n, dtype=np.int64) * 2),
                     "length": pa.array(length.astype(np.int32), mask=~valid),
                     "label_count": pa.array((length // 2).astype(np.int32)),
                     "first_label_supervised": pa.array(rng.random(n) < 0.5),
                     "token_hash": pa.array(rng.integers(0, 2**63, n).astype(np.uint64))})


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 3000), st.integers(1, 700), st.integers(0, 2**16))
def test_read_by_row_group_is_the_whole_read(tmp_path_factory, n, group, seed):
    path = tmp_path_factory.mktemp("samples") / "s.parquet"
    pq.write_table(_table(n, seed), path, row_group_size=group)
    got, whole = read_samples(path), pq.read_table(path)
    assert got.equals(whole) and got.schema.equals(whole.schema, check_metadata=True)
    assert all(c.num_chunks == 1 for c in got.columns)


def test_nulls_are_refused_with_their_first_row_and_count(tmp_path):
    path = tmp_path / "s.parquet"
    pq.write_table(_table(1000, 0, [730, 260, 990]), path, row_group_size=100)
    with pytest.raises(StoreError, match=r"row 260: column 'length' is null \(3 nulls\)"):
        read_samples(path)

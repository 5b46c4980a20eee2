"""Columns spilled for the planning (`plancc.store.spill`) read the same values, take no memory of Arrow's pool,
and a directory that cannot take them leaves the table as it was."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from plancc.store import parquet
from plancc.store.spill import WRITER_COLUMNS, spill_columns, spill_directory


def _samples(ids: list[int], hashes: list[int]) -> pa.Table:
    n = len(ids)
    return pa.table({"sample_id": pa.array(ids, pa.int64()), "length": pa.array(np.full(n, 7), pa.int32()),
                     "label_count": pa.array(np.full(n, 3), pa.int32()),
                     "first_label_supervised": pa.array(np.zeros(n, dtype=bool)),
                     "token_hash": pa.array(hashes, pa.uint64())}).combine_chunks()


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2**63 - 1), st.integers(0, 2**64 - 1)), max_size=300))
def test_spilled_table_reads_the_same(tmp_path_factory, rows):
    table = _samples([r[0] for r in rows], [r[1] for r in rows])
    spilled = spill_columns(table, WRITER_COLUMNS, tmp_path_factory.mktemp("spill"))
    assert spilled.schema.equals(table.schema) and spilled.equals(table)
    assert parquet.sample_arrays(spilled).sample_id.tolist() == [r[0] for r in rows]


def test_spilled_columns_leave_the_pool(tmp_path):
    table = _samples(list(range(200_000)), list(range(200_000)))
    spilled = spill_columns(table, WRITER_COLUMNS, tmp_path)
    kept = table.select(["length", "label_count", "first_label_supervised"]).nbytes
    assert sum(spilled.column(n).nbytes for n in WRITER_COLUMNS) == 2 * 8 * 200_000
    del table
    assert pa.total_allocated_bytes() < kept + 8 * 200_000  # the two 1.6 MB columns are not Arrow's any more
    assert parquet.column(spilled, "token_hash")[-1] == 199_999
    assert list(tmp_path.iterdir()) == []  # unlinked: nothing left behind, whatever happens to the compile


def test_an_unwritable_directory_keeps_the_table(tmp_path):
    table = _samples([1, 2, 3], [4, 5, 6])
    assert spill_columns(table, WRITER_COLUMNS, tmp_path / "absent") is table


def test_spill_directory_is_the_nearest_existing_ancestor(tmp_path):
    assert spill_directory(tmp_path / "plan") == tmp_path
    assert spill_directory(tmp_path / "a" / "b" / "plan") == tmp_path

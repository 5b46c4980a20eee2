"""The plan file's rows made a row group at a time (`plan_tables.PlanRows`) are exactly the whole plan table
sorted by (epoch, rank, index), and the file they make is byte for byte the one the sorted table makes."""

from __future__ import annotations

import itertools

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from hypothesis import given, settings
from hypothesis import strategies as st

from plancc.config.settings import PlanSettings
from plancc.core.plan_arrays import SampleArrays
from plancc.planner.pipeline import compile_plan, plan_columns
from plancc.store import plan_body, plan_tables
from tests.support.plans import write_plan_rows

META = {b"plancc": b"{}"}


def _epochs(n: int, seed: int, mode: str, world_size: int, grad_accum: int, epochs: int):
    rng = np.random.default_rng(seed)
    length = rng.integers(1, 40, n).astype(np.int32)
    s = SampleArrays(np.arange(n, dtype=np.int64) * 3, length, rng.integers(0, length + 1).astype(np.int32),
                     rng.random(n) < 0.5)
    ps = PlanSettings(mode=mode, micro_batch_size=2, sequence_len=48, world_size=world_size, grad_accum=grad_accum,
                      epochs=epochs, seed=seed, balance=False)  # the order of rows is the layout's, not balance's
    return [plan_columns(p, s, ps) for p in compile_plan(s, ps)]


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 400), st.integers(0, 2**16), st.sampled_from(["packed", "padded", "flattened"]),
       st.integers(1, 9), st.integers(1, 3), st.integers(1, 3), st.booleans())
def test_rows_are_the_sorted_table(tmp_path_factory, n, seed, mode, world_size, grad_accum, epochs, reverse):
    columns = _epochs(n, seed, mode, world_size, grad_accum, epochs)
    whole = pa.concat_tables([plan_tables.plan_table(cols) for cols in columns])
    whole = whole.take(pc.sort_indices(whole, [("epoch", "ascending"), ("rank", "ascending"),
                                               ("index", "ascending")]))
    rows = plan_tables.PlanRows(columns[::-1] if reverse else columns)  # epochs in any order
    assert rows.epoch.tolist() == whole.column("epoch").to_pylist()
    assert rows.rank.tolist() == whole.column("rank").to_pylist()
    cut = sorted({0, whole.num_rows, *np.random.default_rng(seed).integers(0, whole.num_rows + 1, 3).tolist()})
    for a, b in itertools.pairwise(cut):
        assert rows.rows(a, b).equals(whole.slice(a, b - a)), (a, b)
    out = tmp_path_factory.mktemp("rows")
    write_plan_rows(whole, out / "table.parquet", META)
    plan_body.write_row_groups(rows.schema, rows.epoch, rows.rank, rows.rows, out / "groups.parquet", META)
    assert (out / "table.parquet").read_bytes() == (out / "groups.parquet").read_bytes()

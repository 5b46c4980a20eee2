"""Columns of the samples table that only the plan writer reads, held on disk while the planner runs.

The samples' ids and token hashes (16 bytes a sample: 1.5 GiB at 100M samples) are read by the fingerprints and
the plan and samples files at the very end, never by packing or balancing. `spill_columns` writes each such column
to an unlinked temporary file and puts a memory map of it in the table in its place: the table reads the same
values, but they take no memory until the writer reads them (the page cache holds them meanwhile, which the
system can reclaim), so the planner's peak (the trades of microbatch balance) no longer carries them.
"""

from __future__ import annotations

import mmap
import tempfile
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pyarrow as pa

from plancc.store.parquet import arrow_array, column

WRITER_COLUMNS = ("sample_id", "token_hash")  # what a compile reads of the samples only once planning is done


def spill_columns(table: pa.Table, names: Iterable[str], directory: Path) -> pa.Table:
    """`table` with its null-free numeric columns `names` (those it has) memory-mapped from unlinked files in
    `directory` (the same values; module docstring). The table is returned as it is when nothing can be written
    there: spilling saves memory, it is never what makes a compile fail."""
    if table.num_rows == 0:
        return table
    for name in names:
        i = table.schema.get_field_index(name)
        if i < 0:
            continue
        try:
            values = _mapped(column(table, name), directory)
        except OSError:
            return table
        table = table.set_column(i, table.schema.field(i), arrow_array(values, table.schema.field(i).type))
    return table


def _mapped(values: np.ndarray, directory: Path) -> np.ndarray:
    """`values` written to an unlinked file in `directory`, read back as a read-only view of its memory map."""
    with tempfile.TemporaryFile(dir=directory, prefix=".plancc-spill-") as f:
        f.write(memoryview(np.ascontiguousarray(values)).cast("B"))
        f.flush()
        mapping = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)  # stays valid once the file is closed
    return np.frombuffer(mapping, dtype=values.dtype)


def spill_directory(out_dir: str | Path) -> Path:
    """Where to spill for a compile writing `out_dir`: its nearest existing ancestor (the plan's own filesystem;
    the output folder itself may not exist yet)."""
    parent = Path(out_dir).absolute().parent
    return next(p for p in (parent, *parent.parents) if p.is_dir())

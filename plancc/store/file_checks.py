"""Checks the plan reader and `validate` share: where two JSON values first differ, a Parquet file's schema and
row-group statistics against what plancc writes, and the first sample an epoch holds twice."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from plancc.store.parquet import Held, as_held, open_parquet
from plancc.store.schemas import StoreError


def first_difference(got: Any, want: Any, where: str = "") -> str | None:
    """Path of the first place two JSON values differ (`settings.grad_accum`, `epochs[0].batches`), else None."""
    if isinstance(got, dict) and isinstance(want, dict):
        for key in sorted(set(got) | set(want)):
            if key not in got or key not in want:
                return f"{where}{key} ({'missing' if key not in got else 'unexpected'})"
            found = first_difference(got[key], want[key], f"{where}{key}.")
            if found:
                return found
        return None
    if isinstance(got, list) and isinstance(want, list):
        for i, (a, b) in enumerate(zip(got, want, strict=False)):
            found = first_difference(a, b, f"{where.rstrip('.')}[{i}].")
            if found:
                return found
        return None if len(got) == len(want) else f"{where.rstrip('.')} (length {len(got)}, expected {len(want)})"
    if got == want and type(got) is type(want):
        return None
    return f"{where.rstrip('.')} ({got!r}, expected {want!r})"


def schema_problems(source: Path | Held, expected: pa.Schema) -> list[str]:
    """Columns, types and nullability of a Parquet file against its schema (stricter than `read_table`)."""
    try:
        held = as_held(source)
        path, got = held.path, held.parquet().schema_arrow
    except StoreError as exc:
        return [str(exc)]
    if got.names != expected.names:
        return [f"{path}: columns {got.names}, expected {expected.names}"]
    return [f"{path}: column '{f.name}' is {g.type} (nullable {g.nullable}), expected {f.type} (nullable {f.nullable})"
            for f, g in zip(expected, got, strict=True) if not (g.type.equals(f.type) and g.nullable == f.nullable)]


def statistics_problems(source: Path | Held) -> list[str]:
    """Row-group statistics of every column against the values they describe.

    Filtered reads (one epoch, one rank) skip row groups on their min/max, so a wrong statistic would hide rows
    from some reader while a full read looks sound. plancc writes statistics for every column; a column with
    values but without min/max was changed too.
    """
    path = source.path if isinstance(source, Held) else source
    try:
        pf = open_parquet(source)
        md = pf.metadata
        problems = []
        for i in range(md.num_row_groups):
            group = md.row_group(i)
            table = pf.read_row_group(i)
            for j in range(group.num_columns):
                meta = group.column(j)
                values = table.column(meta.path_in_schema.split(".")[0]).combine_chunks()
                nested = pa.types.is_list(values.type)
                while pa.types.is_list(values.type):
                    values = values.flatten()
                st = meta.statistics
                present = len(values) - values.null_count
                if st is None or (present and not st.has_min_max):
                    problems.append(f"{path} row group {i} column {meta.path_in_schema}: statistics are missing")
                    continue
                bounds = pc.min_max(values)
                checks = [("values", st.num_values, present)]
                if not nested:
                    checks.append(("nulls", st.null_count, values.null_count))
                if present:
                    checks += [("min", st.min, bounds["min"].as_py()), ("max", st.max, bounds["max"].as_py())]
                problems += [f"{path} row group {i} column {meta.path_in_schema}: statistics {what} is {got!r}, its "
                             f"values give {want!r}" for what, got, want in checks if got != want][:1]
        return problems
    except StoreError as exc:
        return [str(exc)]
    except (pa.ArrowException, OSError, ValueError, KeyError) as exc:  # a column name changed: Key/ValueError
        return [f"{path} is corrupt: {exc}"]


def first_row(bad: np.ndarray) -> int:
    """The first index where `bad` is true."""
    return int(np.flatnonzero(bad)[0])


def repeated_sample(ids: np.ndarray, batch_starts: np.ndarray) -> tuple[int, int, int] | None:
    """(row, sample id, earlier row) of the first sample an epoch holds twice, or None (a sound plan).

    `ids` are the epoch's sample ids in plan order, `batch_starts` the position of each row's first id.
    """
    again = np.ones(ids.shape[0], dtype=bool)
    again[np.unique(ids, return_index=True)[1]] = False
    if not again.any():
        return None
    at = first_row(again)
    first = int(np.flatnonzero(ids == ids[at])[0])
    row, earlier = np.searchsorted(batch_starts, [at, first], side="right") - 1
    return int(row), int(ids[at]), int(earlier)

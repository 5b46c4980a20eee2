"""Parquet schemas, atomic directory writes and fast filtered reads: the only module that knows file names.

A plan directory holds `plan.parquet`, `samples.parquet`, `metrics.parquet` and a `manifest.json` mirror. Every
Parquet file carries the plan's fingerprints and settings in its key-value metadata, so one file is
self-describing. The plan table is written sorted by (epoch, rank, index) in row groups, so that one rank's epoch
is read by skipping row groups on their statistics instead of decoding the whole file.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from plancc.errors import InputError, PlanccError

SCHEMA_VERSION = 1

PLAN_FILE = "plan.parquet"
SAMPLES_FILE = "samples.parquet"
METRICS_FILE = "metrics.parquet"
MANIFEST_FILE = "manifest.json"
TOKENIZED_FILE = "tokenized.parquet"
SCAN_MANIFEST_FILE = "scan.json"

META_KEY = b"plancc"  # JSON: {"schema": int, "fingerprints": {...}, "settings": {...}, "kind": str}

SAMPLES_SCHEMA = pa.schema(
    [
        pa.field("sample_id", pa.int64(), nullable=False),
        pa.field("length", pa.int32(), nullable=False),
        pa.field("label_count", pa.int32(), nullable=False),
        pa.field("first_label_supervised", pa.bool_(), nullable=False),
        pa.field("token_hash", pa.uint64(), nullable=False),
    ]
)

PLAN_SCHEMA = pa.schema(
    [
        pa.field("epoch", pa.int32(), nullable=False),
        pa.field("index", pa.int64(), nullable=False),
        pa.field("update", pa.int64(), nullable=False),
        pa.field("rank", pa.int32(), nullable=False),
        pa.field("micro_step", pa.int32(), nullable=False),
        pa.field("sample_ids", pa.list_(pa.list_(pa.int64())), nullable=False),
        pa.field("tokens", pa.int64(), nullable=False),
        pa.field("label_count", pa.int64(), nullable=False),
        pa.field("cost", pa.int64(), nullable=False),
        pa.field("num_items", pa.int64(), nullable=False),
        pa.field("complete_update", pa.bool_(), nullable=False),
    ]
)

TOKENIZED_SCHEMA = pa.schema(
    [
        pa.field("input_ids", pa.list_(pa.int32()), nullable=False),
        pa.field("labels", pa.list_(pa.int32()), nullable=False),
    ]
)

PLAN_ROW_GROUP = 65_536


class StoreError(PlanccError):
    """A plan or scan file is missing, corrupt, foreign or of another schema version; the message names it."""


# ---------------------------------------------------------------- writing


def file_metadata(kind: str, fingerprints: dict[str, Any], settings: dict[str, Any]) -> dict[bytes, bytes]:
    return {
        META_KEY: orjson.dumps(
            {"schema": SCHEMA_VERSION, "kind": kind, "fingerprints": fingerprints, "settings": settings},
            option=orjson.OPT_SORT_KEYS,
        )
    }


def write_parquet(table: pa.Table, path: Path, metadata: dict[bytes, bytes], row_group_size: int | None = None) -> None:
    """Write one Parquet file with our key-value metadata; deterministic bytes for identical tables."""
    table = table.replace_schema_metadata(metadata)
    pq.write_table(
        table,
        path,
        compression="zstd",
        row_group_size=row_group_size,
        write_statistics=True,
        store_schema=True,
    )


def write_json(obj: Any, path: Path) -> None:
    path.write_bytes(orjson.dumps(obj, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS) + b"\n")


@contextlib.contextmanager
def atomic_directory(target: str | Path) -> Iterator[Path]:
    """Yield a fresh temporary sibling of `target`; on success it replaces `target` whole.

    A sibling lock file (kept: deleting it would let two writers hold different inodes) refuses a second writer
    of the same directory while the first runs. On any error the temporary directory is removed and the
    previous `target` (if any) is left untouched.
    """
    target = Path(target).absolute()
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.exists() and not target.is_dir():
        raise StoreError(f"output {target} exists and is not a directory")
    lock_path = target.parent / f".{target.name}.lock"
    with open(lock_path, "a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise StoreError(
                f"another plancc process is writing {target} (lock {lock_path}); wait for it or choose another -o"
            ) from None
        tmp = target.parent / f".{target.name}.tmp-{uuid.uuid4().hex[:12]}"
        tmp.mkdir()
        try:
            yield tmp
            old = None
            if target.exists():
                old = target.parent / f".{target.name}.old-{uuid.uuid4().hex[:12]}"
                os.rename(target, old)
            os.rename(tmp, target)
            if old is not None:
                shutil.rmtree(old, ignore_errors=True)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
            fcntl.flock(lock, fcntl.LOCK_UN)


# ---------------------------------------------------------------- reading


def _open(path: Path) -> pq.ParquetFile:
    if not path.exists():
        raise StoreError(f"{path} does not exist")
    try:
        return pq.ParquetFile(path)
    except (pa.ArrowInvalid, OSError) as exc:
        raise StoreError(f"{path} is not a readable Parquet file ({exc})") from None


def read_file_meta(path: str | Path) -> dict[str, Any]:
    """The plancc key-value metadata of one Parquet file; refuses foreign files and other schema versions."""
    path = Path(path)
    raw = (_open(path).schema_arrow.metadata or {}).get(META_KEY)
    if raw is None:
        raise StoreError(f"{path} was not written by plancc (no '{META_KEY.decode()}' metadata)")
    try:
        meta = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise StoreError(f"{path} has corrupt plancc metadata") from None
    if meta.get("schema") != SCHEMA_VERSION:
        raise StoreError(f"{path} has plan schema version {meta.get('schema')}, this plancc reads {SCHEMA_VERSION}")
    return meta


def _check_columns(table_schema: pa.Schema, expected: pa.Schema, path: Path) -> None:
    for field in expected:
        idx = table_schema.get_field_index(field.name)
        if idx < 0:
            raise StoreError(f"{path}: missing column '{field.name}' ({field.type})")
        got = table_schema.field(idx).type
        if not got.equals(field.type):
            raise StoreError(f"{path}: column '{field.name}' has type {got}, expected {field.type}")


def read_table(path: str | Path, expected: pa.Schema, *, columns: list[str] | None = None, filters=None) -> pa.Table:
    """Read a Parquet table after checking it has the expected columns and types."""
    path = Path(path)
    pf = _open(path)
    _check_columns(pf.schema_arrow, expected, path)
    try:
        if filters is None:  # the plain reader: skips importing pyarrow.dataset (half a second per process)
            return pf.read(columns=columns, use_threads=True)
        return pq.read_table(path, columns=columns, filters=filters, use_threads=True)
    except (pa.ArrowInvalid, OSError) as exc:
        raise StoreError(f"{path} is corrupt: {exc}") from None


def column(table: pa.Table, name: str) -> np.ndarray:
    """One column as numpy, read straight from its Arrow buffers when it is primitive and null-free.

    pyarrow's own converters (`to_numpy`, `pa.array`, `from_pylist`) import pandas on first use: a third of a
    second of every command. The buffers hold the same values (a view for numbers, unpacked bits for booleans).
    """
    arr = table.column(name).combine_chunks()
    t = arr.type
    if arr.null_count == 0 and (pa.types.is_integer(t) or pa.types.is_floating(t)):
        return np.frombuffer(arr.buffers()[1], dtype=np.dtype(str(t)))[arr.offset: arr.offset + len(arr)]
    if arr.null_count == 0 and pa.types.is_boolean(t):
        bits = np.unpackbits(np.frombuffer(arr.buffers()[1], dtype=np.uint8), bitorder="little")
        return bits[arr.offset: arr.offset + len(arr)].astype(bool)
    return arr.to_numpy(zero_copy_only=False)


def arrow_array(values: np.ndarray, type_: pa.DataType, valid: np.ndarray | None = None) -> pa.Array:
    """A numeric or boolean Arrow array over numpy's bytes (see `column` for why not `pa.array`); `valid` masks."""
    n = len(values)
    if pa.types.is_boolean(type_):
        data = np.packbits(np.asarray(values, dtype=bool), bitorder="little")
    else:
        data = np.ascontiguousarray(values, dtype=np.dtype(str(type_)))
    bitmap = None if valid is None else pa.py_buffer(np.packbits(valid, bitorder="little"))
    nulls = 0 if valid is None else int(n - np.count_nonzero(valid))
    return pa.Array.from_buffers(type_, n, [bitmap, pa.py_buffer(data)], null_count=nulls)


def _optional_array(values: list[Any], type_: pa.DataType) -> pa.Array:
    valid = np.array([v is not None for v in values], dtype=bool)
    filled = np.array([0 if v is None else v for v in values], dtype=np.dtype(str(type_)))
    return arrow_array(filled, type_, None if valid.all() else valid)


def _string_array(values: list[str]) -> pa.Array:
    encoded = [v.encode() for v in values]
    offsets = np.zeros(len(encoded) + 1, dtype=np.int32)
    np.cumsum([len(e) for e in encoded], out=offsets[1:])
    return pa.Array.from_buffers(pa.string(), len(encoded), [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(encoded))])


def read_samples(path: str | Path) -> pa.Table:
    """A samples table (from a scan or a plan); validated columns, casts to canonical types are refused."""
    return read_table(path, SAMPLES_SCHEMA, columns=SAMPLES_SCHEMA.names)


def read_plan(plan_dir: str | Path, *, epoch: int | None = None, rank: int | None = None,
              columns: list[str] | None = None) -> pa.Table:
    """Plan rows, optionally one epoch and/or one rank, in global (epoch, index) order."""
    filters = []
    if epoch is not None:
        filters.append(("epoch", "=", int(epoch)))
    if rank is not None:
        filters.append(("rank", "=", int(rank)))
    table = read_table(Path(plan_dir) / PLAN_FILE, PLAN_SCHEMA, columns=columns, filters=filters or None)
    if columns is None or ("epoch" in columns and "index" in columns):
        table = table.take(pc.sort_indices(table, [("epoch", "ascending"), ("index", "ascending")]))
    return table


def read_manifest(plan_dir: str | Path) -> dict[str, Any]:
    path = Path(plan_dir) / MANIFEST_FILE
    try:
        return orjson.loads(path.read_bytes())
    except FileNotFoundError:
        raise StoreError(f"{plan_dir} is not a plan directory (no {MANIFEST_FILE})") from None
    except orjson.JSONDecodeError as exc:
        raise StoreError(f"{path} is not valid JSON: {exc}") from None


# ---------------------------------------------------------------- plan directory


def metrics_schema() -> pa.Schema:
    from plancc.metrics import METRIC_COLUMNS

    types = {"int": pa.int64(), "float": pa.float64()}
    return pa.schema(
        [pa.field("epoch", pa.int32(), nullable=False), pa.field("stage", pa.string(), nullable=False)]
        + [pa.field(name, types[kind]) for name, kind in METRIC_COLUMNS]
    )


def metrics_table(rows: list[dict[str, Any]]) -> pa.Table:
    """Rows of {epoch, stage, metric...} as the metrics table."""
    schema = metrics_schema()
    arrays = [_string_array([row[f.name] for row in rows]) if pa.types.is_string(f.type)
              else _optional_array([row.get(f.name) for row in rows], f.type) for f in schema]
    return pa.Table.from_arrays(arrays, schema=schema)


def plan_table(cols: dict[str, Any]) -> pa.Table:
    """Arrow plan table from `compile.plan_columns` arrays: the CSR bounds become the nested `sample_ids` lists."""
    rows = pa.ListArray.from_arrays(arrow_array(cols["row_bounds"], pa.int32()), arrow_array(cols["sample_ids"], pa.int64()))
    nested = pa.ListArray.from_arrays(arrow_array(cols["batch_bounds"], pa.int32()), rows)
    arrays = [nested if f.name == "sample_ids" else arrow_array(cols[f.name], f.type) for f in PLAN_SCHEMA]
    return pa.Table.from_arrays(arrays, schema=PLAN_SCHEMA)


def write_plan_files(directory: Path, plan: pa.Table, samples: pa.Table, metrics: pa.Table,
                     fingerprints: dict[str, Any], settings: dict[str, Any], manifest: dict[str, Any]) -> None:
    """Write the plan directory's files into `directory` (a temporary one from `atomic_directory`)."""
    write_parquet(plan, directory / PLAN_FILE, file_metadata("plan", fingerprints, settings), PLAN_ROW_GROUP)
    write_parquet(samples.select(SAMPLES_SCHEMA.names).cast(SAMPLES_SCHEMA), directory / SAMPLES_FILE,
                  file_metadata("samples", fingerprints, settings))
    write_parquet(metrics, directory / METRICS_FILE, file_metadata("metrics", fingerprints, settings))
    write_json(manifest, directory / MANIFEST_FILE)


def _check_samples(table: pa.Table, path: Path) -> None:
    sid = column(table, "sample_id")
    length = column(table, "length")
    count = column(table, "label_count")
    problems = [
        (np.flatnonzero(sid < 0), "sample_id is negative"),
        (np.flatnonzero(np.diff(sid) <= 0) + 1, "sample_id is not strictly increasing (unsorted or duplicate)"),
        (np.flatnonzero(length <= 0), "length must be positive"),
        (np.flatnonzero((count < 0) | (count > length)), "label_count must be in [0, length]"),
    ]
    for rows, what in problems:
        if rows.size:
            raise InputError(f"{path} row {int(rows[0])}: {what}")
    if table.num_rows == 0:
        raise InputError(f"{path}: the samples table is empty")


def read_samples_source(path: str | Path) -> tuple[pa.Table, dict] | None:
    """A samples table given as SOURCE (Parquet with the samples schema, or a SCAN_DIR/PLAN_DIR); else None."""
    p = Path(path).expanduser()
    if p.is_dir():
        f = p / SAMPLES_FILE
        if not f.is_file():
            return None
    elif p.is_file() and p.suffix.lower() == ".parquet":
        f = p
        try:
            names = set(pq.read_schema(f).names)
        except (pa.ArrowException, OSError) as exc:
            raise InputError(f"{f}: not a readable Parquet file ({exc})") from None
        if names != set(SAMPLES_SCHEMA.names):
            return None
    else:
        return None
    table = read_samples(f)
    _check_samples(table, f)
    try:
        meta = read_file_meta(f)
    except StoreError:
        meta = None  # written by another engine: fine, the plan recomputes its fingerprints
    info: dict[str, Any] = {"path": str(f), "meta": meta}
    tokenized = f.parent / TOKENIZED_FILE
    info["tokenized_path"] = str(tokenized) if tokenized.is_file() else None
    manifest = f.parent / SCAN_MANIFEST_FILE
    if manifest.is_file():
        try:
            info["report"] = orjson.loads(manifest.read_bytes())
        except orjson.JSONDecodeError:
            info["report"] = None
    return table, info

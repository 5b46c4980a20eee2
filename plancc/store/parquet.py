"""Parquet and JSON in and out: file metadata, writes, held (opened-once) files, checked and filtered reads.

The plan table is written sorted by (epoch, rank, index) in row groups, so that one epoch (or one rank's) is read
by skipping row groups on their statistics instead of decoding the whole file."""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from plancc.core.plan_arrays import SampleArrays
from plancc.store import token_store
from plancc.store.schemas import (
    ARROW_SCHEMA_KEY,
    DATASET_COLUMN,
    DESIRABLE_COLUMN,
    META_KEY,
    PAIR_ID_COLUMN,
    PAIR_ROLE_COLUMN,
    PAIR_ROLES,
    ROWS_KEY,
    SCHEMA_VERSION,
    StoreError,
    data_kind_of,
    samples_schema,
)


def file_metadata(kind: str, fingerprints: dict[str, Any], settings: dict[str, Any]) -> dict[bytes, bytes]:
    """The key-value metadata every sibling Parquet file of a plan carries: kind, schema version,
    fingerprints, settings."""
    return {
        META_KEY: orjson.dumps(
            {"schema": SCHEMA_VERSION, "kind": kind, "fingerprints": fingerprints, "settings": settings},
            option=orjson.OPT_SORT_KEYS,
        )
    }


def write_parquet(table: pa.Table, path: Path, metadata: dict[bytes, bytes], row_group_size: int | None = None) -> None:
    """Write one Parquet file with our key-value metadata; deterministic bytes for identical tables.

    No dictionary encoding: plancc's big columns (ids, hashes, per-microbatch counts) are near-unique, so the
    writer's dictionary attempt is wasted work for files of about the same size (docs/benchmarks.md)."""
    table = table.replace_schema_metadata(metadata)
    pq.write_table(
        table,
        path,
        compression="zstd",
        use_dictionary=False,
        row_group_size=row_group_size,
        write_statistics=True,
        store_schema=True,
    )


def write_json(obj: Any, path: Path) -> None:
    """`obj` as indented JSON with sorted keys (manifest.json, scan.json)."""
    path.write_bytes(orjson.dumps(obj, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS) + b"\n")






@dataclass(frozen=True)
class Held:
    """A file opened once and memory-mapped: every later read of it sees these bytes, even after its path is
    replaced (a plan recompiled with --overwrite under a running job keeps serving the job the plan it opened)."""

    path: Path  # for messages
    buffer: pa.Buffer
    mapping: mmap.mmap | None = None  # the map under `buffer` (None for an empty file): `scan` reads through it

    def scan(self, end: int, block: int = 1 << 24) -> Iterator[memoryview]:
        """Bytes [0, end) a block at a time, each block's pages dropped from this process's resident set once read
        (they stay in the shared page cache): hashing a large file costs no memory."""
        view = memoryview(self.mapping) if self.mapping is not None else memoryview(b"")
        for a in range(0, end, block):
            yield view[a:min(a + block, end)]
            if self.mapping is not None and hasattr(mmap, "MADV_DONTNEED"):
                self.mapping.madvise(mmap.MADV_DONTNEED, a, min(block, end - a))

    def drop_pages(self, start: int, end: int) -> None:
        """Drop the file's pages of bytes [start, end) from this process's resident set (they stay in the shared
        page cache; a later read maps them again)."""
        if self.mapping is not None and hasattr(mmap, "MADV_DONTNEED"):
            start -= start % mmap.PAGESIZE
            end = min(end, len(self.mapping))
            if end > start:
                self.mapping.madvise(mmap.MADV_DONTNEED, start, end - start)

    def parquet(self) -> pq.ParquetFile:
        """The file as Parquet, its footer parsed once (refused naming the file when it is not Parquet)."""
        found = self.__dict__.get("_parquet")
        if found is None:
            try:
                found = pq.ParquetFile(pa.BufferReader(self.buffer))
            except (pa.ArrowException, OSError, ValueError) as exc:  # ValueError: a column name that is not UTF-8
                raise StoreError(f"{self.path} is not a readable Parquet file ({exc})") from None
            self.__dict__["_parquet"] = found
        return found


def hold(path: str | Path, *, dir_fd: int | None = None, name: str | None = None) -> Held:
    """Open `path` (or `name` inside the directory `dir_fd`) once, refusing anything but a regular file by its type
    before reading (`token_store.open_file`), and map it."""
    path = Path(path)
    try:
        f = token_store.open_file(path if name is None else name, dir_fd=dir_fd, shown=path)
    except FileNotFoundError:
        raise StoreError(f"{path} does not exist") from None
    except OSError as exc:
        raise StoreError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    with f:
        if os.fstat(f.fileno()).st_size == 0:
            return Held(path, pa.py_buffer(b""))
        mapping = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        return Held(path, pa.py_buffer(mapping), mapping)


def as_held(source: str | Path | Held) -> Held:
    """`source` itself if held already, else the file held now (opened once, mapped)."""
    return source if isinstance(source, Held) else hold(source)


def open_parquet(source: str | Path | Held) -> pq.ParquetFile:
    """The Parquet reader over `source`'s held bytes."""
    return as_held(source).parquet()


def read_file_meta(source: str | Path | Held) -> dict[str, Any]:
    """The plancc key-value metadata of one Parquet file; refuses foreign files and other schema versions.

    A file written with its Arrow schema holds the metadata twice (the footer's key-value pairs, which a table read
    returns, and inside the serialized Arrow schema); they must agree, or one of them was edited.
    """
    held = as_held(source)
    path, pf = held.path, held.parquet()
    pairs = pf.metadata.metadata or {}
    raw = pairs.get(META_KEY)
    if raw is None:
        raise StoreError(f"{path} was not written by plancc (no '{META_KEY.decode()}' metadata)")
    extra = sorted(set(pairs) - {META_KEY, ARROW_SCHEMA_KEY, ROWS_KEY})
    if extra:
        raise StoreError(f"{path} has metadata keys plancc does not write ({extra[0]!r}): the file was edited")
    if (pf.schema_arrow.metadata or {}).get(META_KEY) != raw:
        raise StoreError(f"{path} has corrupt plancc metadata (its two copies differ)")
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


def read_table(source: str | Path | Held, expected: pa.Schema, *, columns: list[str] | None = None,
               filters=None, threads: bool = True) -> pa.Table:
    """Read a Parquet table after checking it has the expected columns and types.

    `threads=False` decodes on the calling thread, for a process that reads a plan for training (`PlanFiles` of the
    runtime): an Arrow worker thread alive when the interpreter exits can abort the process (SIGABRT, "terminate
    called without an active exception", apache/arrow#34314), and a training script or torchrun worker exits as
    Python does. Compiling and scanning keep Arrow's threads."""
    held = as_held(source)
    path, pf = held.path, held.parquet()
    _check_columns(pf.schema_arrow, expected, path)
    try:
        if filters is None:  # the plain reader: skips importing pyarrow.dataset (half a second per process)
            return pf.read(columns=columns, use_threads=threads)
        return pq.read_table(pa.BufferReader(held.buffer), columns=columns, filters=filters, use_threads=threads,
                             pre_buffer=threads)
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise StoreError(f"{path} is corrupt: {exc}") from None


def column(table: pa.Table, name: str) -> np.ndarray:
    """One column as numpy, read straight from its Arrow buffers when it is primitive and null-free.

    pyarrow's own converters (`to_numpy`, `np.asarray`, `pa.array`, `from_pylist`) import pandas on first use: a
    third of a second of every command. The buffers hold the same values (a view for numbers, unpacked bits for
    booleans).
    """
    arr = whole(table.column(name))
    t = arr.type
    if arr.null_count == 0 and (pa.types.is_integer(t) or pa.types.is_floating(t)):
        return numbers(arr)
    if arr.null_count == 0 and pa.types.is_boolean(t):
        bits = np.unpackbits(np.frombuffer(arr.buffers()[1], dtype=np.uint8), bitorder="little")
        return bits[arr.offset: arr.offset + len(arr)].astype(bool)
    return arr.to_numpy(zero_copy_only=False)


def whole(values: pa.ChunkedArray) -> pa.Array:
    """A column as one Arrow array: its only chunk as it is (`combine_chunks` copies even one chunk, so every read
    of a samples column made a copy, and the planner kept one), else its chunks joined."""
    return values.chunk(0) if values.num_chunks == 1 else values.combine_chunks()


def numbers(arr: pa.Array) -> np.ndarray:
    """A null-free integer or float Arrow array's values: a read-only view of its buffer (see `column`)."""
    return np.frombuffer(arr.buffers()[1], dtype=np.dtype(str(arr.type)))[arr.offset: arr.offset + len(arr)]


def arrow_array(values: np.ndarray, type_: pa.DataType, valid: np.ndarray | None = None) -> pa.Array:
    """A numeric or boolean Arrow array over numpy's bytes (see `column` for why not `pa.array`); `valid` masks.
    Integers narrowed to a smaller type (the plan's int32 list offsets) are checked to fit: a cast would wrap."""
    n = len(values)
    if pa.types.is_boolean(type_):
        data = np.packbits(np.asarray(values, dtype=bool), bitorder="little")
    else:
        data = np.ascontiguousarray(values, dtype=_fitting(np.asarray(values), np.dtype(str(type_))))
    bitmap = None if valid is None else pa.py_buffer(np.packbits(valid, bitorder="little"))
    nulls = 0 if valid is None else int(n - np.count_nonzero(valid))
    return pa.Array.from_buffers(type_, n, [bitmap, pa.py_buffer(data)], null_count=nulls)


def _fitting(values: np.ndarray, dtype: np.dtype) -> np.dtype:
    """`dtype`, once integer `values` are known to fit it (refused with the first value that does not)."""
    if values.size and values.dtype.kind in "iu" and dtype.kind in "iu" and dtype.itemsize < values.dtype.itemsize:
        info = np.iinfo(dtype)
        lo, hi = int(values.min()), int(values.max())
        if lo < info.min or hi > info.max:
            raise StoreError(f"{hi if hi > info.max else lo:,} does not fit a {dtype} column (at most {info.max:,}): "
                             "a plan's epoch holds fewer samples and rows than that; plan fewer samples an epoch")
    return dtype


def optional_array(values: list[Any], type_: pa.DataType) -> pa.Array:
    """`values` with None as null, built from numpy (a list of Python ints through pyarrow is slow)."""
    valid = np.array([v is not None for v in values], dtype=bool)
    filled = np.array([0 if v is None else v for v in values], dtype=np.dtype(str(type_)))
    return arrow_array(filled, type_, None if valid.all() else valid)


def string_array(values: list[str]) -> pa.Array:
    """`values` as an Arrow string array built from one byte buffer and offsets."""
    encoded = [v.encode() for v in values]
    offsets = np.zeros(len(encoded) + 1, dtype=np.int32)
    np.cumsum([len(e) for e in encoded], out=offsets[1:])
    return pa.Array.from_buffers(pa.string(), len(encoded), [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(encoded))])


def read_arrow(path: str | Path) -> pa.Table:
    """A memory-mapped `.arrow` file: the Arrow IPC file format, or the stream format `datasets` writes."""
    with pa.memory_map(str(path)) as source:
        try:
            return pa.ipc.open_file(source).read_all()
        except pa.ArrowInvalid:
            source.seek(0)
            return pa.ipc.open_stream(source).read_all()


def read_samples(source: str | Path | Held, *, threads: bool = False) -> pa.Table:
    """A samples table (from a scan or a plan); validated columns, casts to canonical types and nulls are refused
    (the planner's kernels read the raw buffers: a null would be whatever bytes lie under it). `threads`: as for
    `read_table`; off by default: a few flat columns decode as fast on the calling thread, and only then does
    releasing the decoding's buffers below reach them (Arrow's allocator keeps what a worker thread freed, and
    a compile would hold it to the end)."""
    held = as_held(source)
    path = held.path
    present = held.parquet().schema_arrow.names
    table = _read_by_group(held, samples_schema(DATASET_COLUMN in present, data_kind_of(present)), threads)
    if PAIR_ROLE_COLUMN in table.column_names:
        bad = pc.invert(pc.is_in(table.column(PAIR_ROLE_COLUMN), pa.array(PAIR_ROLES)))
        if pc.any(bad).as_py():
            row = pc.index(bad, True).as_py()
            raise StoreError(f"{path} row {row}: column '{PAIR_ROLE_COLUMN}' is "
                             f"{table.column(PAIR_ROLE_COLUMN)[row].as_py()!r}, expected one of {', '.join(PAIR_ROLES)}")
    pa.default_memory_pool().release_unused()
    return table


def _read_by_group(held: Held, expected: pa.Schema, threads: bool) -> pa.Table:
    """The columns of `expected` (checked: present, of these types, without nulls), read a row group at a time.

    Reading the whole file at once held the file's pages, each column grown by reallocation, and the table: 5.8
    GiB at its peak for a 2.3 GiB table of 100M samples. Here numeric columns are copied into arrays of their
    final size as each row group is decoded, and the file's pages are dropped from the resident set after it (the
    page cache keeps them), so the read holds the table and one row group (docs/benchmarks.md, Scale)."""
    path, pf = held.path, held.parquet()
    _check_columns(pf.schema_arrow, expected, path)
    schema = pa.schema([pf.schema_arrow.field(name) for name in expected.names], metadata=pf.schema_arrow.metadata)
    n = pf.metadata.num_rows
    fixed = {f.name: np.empty(n, dtype=f.type.to_pandas_dtype()) for f in schema
             if pa.types.is_integer(f.type) or pa.types.is_floating(f.type)}
    chunks: dict[str, list[pa.Array]] = {f.name: [] for f in schema if f.name not in fixed}
    nulls: dict[str, list[int]] = {}  # column -> [nulls, first null's row]
    at = 0
    for g in range(pf.num_row_groups):
        try:
            part = pf.read_row_group(g, columns=schema.names, use_threads=threads)
        except (pa.ArrowException, OSError, ValueError) as exc:
            raise StoreError(f"{path} is corrupt: {exc}") from None
        for name in schema.names:
            values = part.column(name)
            if values.null_count:
                nulls.setdefault(name, [0, at + pc.index(pc.is_null(values), True).as_py()])[0] += values.null_count
            elif name in fixed:
                fixed[name][at:at + part.num_rows] = column(part, name)
            else:
                chunks[name] += values.chunks
        at += part.num_rows
        del part
        held.drop_pages(*_byte_span(pf.metadata.row_group(g)))
    for name in schema.names:
        if name in nulls:
            count, row = nulls[name]
            raise StoreError(f"{path} row {row}: column '{name}' is null ({count} nulls); a samples table has a "
                             "value in every row")
    if at != n:
        raise StoreError(f"{path} is corrupt: its row groups hold {at} rows, its footer says {n}")
    return pa.Table.from_arrays(
        [arrow_array(fixed[f.name], f.type) if f.name in fixed
         else pa.concat_arrays(chunks[f.name]) if chunks[f.name] else pa.nulls(0, f.type) for f in schema],
        schema=schema)


def _byte_span(group: pq.RowGroupMetaData) -> tuple[int, int]:
    """The bytes of the file a row group's column chunks take, [first, end)."""
    chunks = [group.column(j) for j in range(group.num_columns)]
    starts = [c.dictionary_page_offset if c.has_dictionary_page else c.data_page_offset for c in chunks]
    return min(starts), max(a + c.total_compressed_size for a, c in zip(starts, chunks, strict=True))


def sample_arrays(table: pa.Table) -> SampleArrays:
    """The planner's view of a samples table (sorted by sample_id): its columns as numpy arrays, and the pair or
    label columns of preference data. Numbers are read-only views of the table's buffers (lengths and label counts
    int32 as the schema stores them): an int64 copy of each would be held all compile (docs/benchmarks.md, Scale)."""
    names = table.column_names
    return SampleArrays(
        sample_id=column(table, "sample_id").astype(np.int64, copy=False),
        length=column(table, "length"),
        label_count=column(table, "label_count"),
        first_label_supervised=column(table, "first_label_supervised"),
        pair_id=column(table, PAIR_ID_COLUMN).astype(np.int64, copy=False) if PAIR_ID_COLUMN in names else None,
        chosen=(column(pa.table({"chosen": pc.equal(table.column(PAIR_ROLE_COLUMN), PAIR_ROLES[0])}), "chosen")
                if PAIR_ROLE_COLUMN in names else None),
        desirable=column(table, DESIRABLE_COLUMN) if DESIRABLE_COLUMN in names else None,
    )


def nested_arrays(sample_ids: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(flat sample ids, row bounds, batch bounds) of a `list<list<int64>>` column, without a Python loop (or
    pandas: the buffers are read as `column` reads them)."""
    batches = whole(sample_ids) if isinstance(sample_ids, pa.ChunkedArray) else sample_ids
    rows = batches.flatten()
    batch_bounds = numbers(batches.offsets).astype(np.int64)
    row_bounds = numbers(rows.offsets).astype(np.int64)
    return numbers(rows.flatten()).astype(np.int64), row_bounds - row_bounds[0], batch_bounds - batch_bounds[0]

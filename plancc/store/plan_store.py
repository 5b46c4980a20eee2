"""Parquet schemas, atomic directory writes and fast filtered reads: the only module that knows file names.

A plan directory holds `plan.parquet`, `samples.parquet`, `metrics.parquet` and a `manifest.json` mirror. Every
Parquet file carries the plan's fingerprints and settings in its key-value metadata, so one file is
self-describing; `plan.parquet` carries the whole manifest. The plan table is written sorted by (epoch, rank, index)
in row groups, so that one epoch (or one rank's) is read by skipping row groups on their statistics instead of
decoding the whole file. `PlanDir` (end of this module) is the verified reader: every file is checked against what
the plan file's fingerprints and checksums bind.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import mmap
import os
import re
import stat
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from plancc.config import ROLES, PlanSettings, SettingsError, canonical_hash
from plancc.errors import InputError, PlanccError
from plancc.layout import complete_updates, update_mapping
from plancc.metric_columns import METRIC_COLUMNS
from plancc.plan import SampleArrays
from plancc.store import atomic, token_store
from plancc.store.fingerprint import (
    array_digest,
    before_checksum,
    config_fingerprint,
    dataset_fingerprint,
    eval_fingerprint,
    metadata_fingerprint,
    metrics_checksum,
    plan_fingerprint,
    scan_identity,
)

SCHEMA_VERSION = 1

PLAN_FILE = "plan.parquet"
SAMPLES_FILE = "samples.parquet"
METRICS_FILE = "metrics.parquet"
BEFORE_FILE = "before.parquet"  # the `before` stage's label count per microbatch: what inspect plots against `after`
EVAL_FILE = "eval.parquet"  # the eval plan (`plancc.planner.evaluation`), in plans compiled with held-out samples
MANIFEST_FILE = "manifest.json"
TOKENS_DIR = "tokens"  # the token store (plancc.store.token_store), in scan and plan directories
TOKENIZED_FILE = "tokenized.parquet"  # what older plans shipped instead; read only when given as data=
SCAN_MANIFEST_FILE = "scan.json"

ARROW_SCHEMA_KEY = b"ARROW:schema"  # pyarrow's serialized Arrow schema (store_schema=True)
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

DATASET_COLUMN = "dataset"  # a recipe's samples table: the name of each sample's dataset (`plancc.recipe`)
RECIPE_SAMPLES_SCHEMA = SAMPLES_SCHEMA.append(pa.field(DATASET_COLUMN, pa.string(), nullable=False))


def samples_schema(recipe: bool) -> pa.Schema:
    """The samples table's schema: a recipe's has the `dataset` column."""
    return RECIPE_SAMPLES_SCHEMA if recipe else SAMPLES_SCHEMA


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

BEFORE_SCHEMA = pa.schema(
    [
        pa.field("epoch", pa.int32(), nullable=False),
        pa.field("index", pa.int64(), nullable=False),
        pa.field("label_count", pa.int64(), nullable=False),
    ]
)

EVAL_SCHEMA = pa.schema(
    [
        pa.field("index", pa.int64(), nullable=False),
        pa.field("rank", pa.int32(), nullable=False),
        pa.field("sample_ids", pa.list_(pa.list_(pa.int64())), nullable=False),
        pa.field("tokens", pa.int64(), nullable=False),
        pa.field("label_count", pa.int64(), nullable=False),
        pa.field("cost", pa.int64(), nullable=False),
    ]
)

PLAN_ROW_GROUP = 65_536


class StoreError(PlanccError):
    """A plan or scan file is missing, corrupt, foreign or of another schema version; the message names it."""


# ---------------------------------------------------------------- writing


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
    writer's dictionary attempt is wasted work (10M samples: a fifth of the write time) for files 1% smaller or
    3% larger."""
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


class OutputError(PlanccError):
    """An `-o` directory plancc must not write into (foreign content, or a plan/scan without `--overwrite`)."""


# what plancc writes at the top of a plan or scan directory (besides TOKENS_DIR); TOKENIZED_FILE: older plans
OWN_FILES = {"plan": {PLAN_FILE, SAMPLES_FILE, METRICS_FILE, BEFORE_FILE, MANIFEST_FILE, EVAL_FILE, TOKENIZED_FILE},
             "scan": {SAMPLES_FILE, SCAN_MANIFEST_FILE}}
SHOWN_FOREIGN = 10  # an `-o` refusal names this many of the paths plancc did not write
_PART_DIR = re.compile(r"part-\d+")  # a multi-part token store's part folders (`token_store.write_parts`)


def output_kind(path: Path) -> str | None:
    """'plan' or 'scan' when `path` is a plancc plan or scan directory (recognised by its manifest), else None."""
    for name, kind, marker in ((MANIFEST_FILE, "plan", "fingerprints"), (SCAN_MANIFEST_FILE, "scan",
                                                                         "plancc_scan_version")):
        raw = atomic.read_regular(path / name)  # a FIFO named like a manifest is not read (it would block)
        try:
            manifest = orjson.loads(raw) if raw is not None else None
        except orjson.JSONDecodeError:
            continue
        if isinstance(manifest, dict) and marker in manifest and ("plancc" in manifest or kind == "scan"):
            return kind
    return None


def _entry_kind(entry: os.DirEntry) -> str:
    """'file', 'dir' or what else `entry` is (not followed through a link), for naming a foreign entry."""
    if entry.is_symlink():
        return "symlink"
    if entry.is_dir(follow_symlinks=False):
        return "dir"
    if entry.is_file(follow_symlinks=False):
        return "file"
    mode = entry.stat(follow_symlinks=False).st_mode
    return "FIFO" if stat.S_ISFIFO(mode) else "socket" if stat.S_ISSOCK(mode) else "device file"


def _shown(name: str, kind: str) -> str:
    return name + {"file": "", "dir": "/"}.get(kind, f" ({kind})")


def _foreign_in_tokens(folder: Path, shown: str, *, parts: bool = True) -> Iterator[str]:
    """Paths under a token store folder that plancc did not write: it writes the arrays and the header as regular
    files, and a multi-part store's parts (`token_store.write_parts`) as folders of the same."""
    own = {token_store.HEADER_FILE, *(f"{n}.npy" for n in token_store.ARRAYS)}
    for entry in sorted(os.scandir(folder), key=lambda e: e.name):
        kind = _entry_kind(entry)
        if kind == "file" and entry.name in own:
            continue
        if kind == "dir" and parts and _PART_DIR.fullmatch(entry.name):
            yield from _foreign_in_tokens(Path(entry.path), f"{shown}/{entry.name}", parts=False)
            continue
        yield _shown(f"{shown}/{entry.name}", kind)


def foreign_entries(path: Path, kind: str) -> Iterator[str]:
    """Paths (relative to `path`) in the plancc `kind` directory `path` that plancc did not write there: a user's
    files, a source, checkpoints, or a FIFO or link where plancc writes a regular file. `--overwrite` replaces the
    whole directory, so any of them refuses it."""
    for entry in sorted(os.scandir(path), key=lambda e: e.name):
        what = _entry_kind(entry)
        if what == "file" and entry.name in OWN_FILES[kind]:
            continue
        if what == "dir" and entry.name == TOKENS_DIR:
            yield from _foreign_in_tokens(Path(entry.path), entry.name)
            continue
        yield _shown(entry.name, what)


def check_output(target: str | Path, *, overwrite: bool) -> None:
    """Refuse an output path that is not absent, an empty directory, or (with `overwrite`) a plancc plan/scan
    holding only what plancc wrote (docs/spec.md §1: a folder holding anything else is never touched).

    Runs before any work (so a refused command costs nothing) and again under the writer's lock, before and after
    the new directory is written.
    """
    target = Path(target)
    if not os.path.lexists(target):
        return
    if not target.is_dir():
        raise OutputError(f"output {target} exists and is not a directory; choose another -o")
    entries = sorted(os.listdir(target))
    if not entries:
        return
    kind = output_kind(target)
    if kind is None:
        shown = ", ".join(entries[:3]) + (", ..." if len(entries) > 3 else "")
        raise OutputError(f"output {target} is not empty and is not a plancc plan or scan directory (it holds "
                          f"{shown}); plancc never writes into such a folder: choose a new or empty -o")
    foreign = list(itertools.islice(foreign_entries(target, kind), SHOWN_FOREIGN + 1))
    if foreign:
        raise OutputError(f"output {target} is a plancc {kind} but also holds what plancc did not write: "
                          f"{_listed(target, kind, foreign)}; a {kind} is replaced whole, so plancc leaves this "
                          "folder untouched: move them out, or choose another -o")
    if not overwrite:
        raise OutputError(f"output {target} already holds a plancc {kind}; pass --overwrite to replace it")


def _listed(target: Path, kind: str, shown: list[str]) -> str:
    """The first SHOWN_FOREIGN foreign paths, and how many more there are (counted only when there are more)."""
    if len(shown) <= SHOWN_FOREIGN:
        return ", ".join(shown)
    more = sum(1 for _ in foreign_entries(target, kind)) - SHOWN_FOREIGN
    return ", ".join(shown[:SHOWN_FOREIGN]) + f" and {more} more"


@contextlib.contextmanager
def atomic_directory(target: str | Path, *, overwrite: bool = False, owned: bool = False,
                     what: str = "plan") -> Iterator[Path]:
    """A temporary directory whose content replaces `target` whole when the block ends (see `plancc.store.atomic`).

    `owned`: `target` lives in a directory plancc owns (the scan cache), so whatever is there is replaced.
    """
    check = None if owned else functools.partial(check_output, overwrite=overwrite)
    with atomic.replace_directory(target, check, what=what) as tmp:
        yield tmp


# ---------------------------------------------------------------- reading


@dataclass(frozen=True)
class Held:
    """A file opened once and memory-mapped: every later read of it sees these bytes, even after its path is
    replaced (a plan recompiled with --overwrite under a running job keeps serving the job the plan it opened)."""

    path: Path  # for messages
    buffer: pa.Buffer

    def parquet(self) -> pq.ParquetFile:
        """The file as Parquet (refused naming the file when it is not)."""
        try:
            return pq.ParquetFile(pa.BufferReader(self.buffer))
        except (pa.ArrowException, OSError, ValueError) as exc:  # ValueError: e.g. a column name that is not UTF-8
            raise StoreError(f"{self.path} is not a readable Parquet file ({exc})") from None


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
        return Held(path, pa.py_buffer(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)))


def _held(source: str | Path | Held) -> Held:
    return source if isinstance(source, Held) else hold(source)


def _open(source: str | Path | Held) -> pq.ParquetFile:
    return _held(source).parquet()


def read_file_meta(source: str | Path | Held) -> dict[str, Any]:
    """The plancc key-value metadata of one Parquet file; refuses foreign files and other schema versions.

    A file written with its Arrow schema holds the metadata twice (the footer's key-value pairs, which a table read
    returns, and inside the serialized Arrow schema); they must agree, or one of them was edited.
    """
    held = _held(source)
    path, pf = held.path, held.parquet()
    pairs = pf.metadata.metadata or {}
    raw = pairs.get(META_KEY)
    if raw is None:
        raise StoreError(f"{path} was not written by plancc (no '{META_KEY.decode()}' metadata)")
    extra = sorted(set(pairs) - {META_KEY, ARROW_SCHEMA_KEY})
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
               filters=None) -> pa.Table:
    """Read a Parquet table after checking it has the expected columns and types."""
    held = _held(source)
    path, pf = held.path, held.parquet()
    _check_columns(pf.schema_arrow, expected, path)
    try:
        if filters is None:  # the plain reader: skips importing pyarrow.dataset (half a second per process)
            return pf.read(columns=columns, use_threads=True)
        return pq.read_table(pa.BufferReader(held.buffer), columns=columns, filters=filters, use_threads=True)
    except (pa.ArrowException, OSError, ValueError) as exc:
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


def read_arrow(path: str | Path) -> pa.Table:
    """A memory-mapped `.arrow` file: the Arrow IPC file format, or the stream format `datasets` writes."""
    with pa.memory_map(str(path)) as source:
        try:
            return pa.ipc.open_file(source).read_all()
        except pa.ArrowInvalid:
            source.seek(0)
            return pa.ipc.open_stream(source).read_all()


def read_samples(source: str | Path | Held) -> pa.Table:
    """A samples table (from a scan or a plan); validated columns, casts to canonical types and nulls are refused
    (the planner's kernels read the raw buffers: a null would be whatever bytes lie under it)."""
    held = _held(source)
    path = held.path
    names = SAMPLES_SCHEMA.names + ([DATASET_COLUMN] if DATASET_COLUMN in held.parquet().schema_arrow.names else [])
    table = read_table(held, SAMPLES_SCHEMA, columns=names)
    for name in table.column_names:
        values = table.column(name)
        if values.null_count:
            row = pc.index(pc.is_null(values), True).as_py()
            raise StoreError(f"{path} row {row}: column '{name}' is null ({values.null_count} nulls); a samples table "
                             "has a value in every row")
    return table


def sample_arrays(table: pa.Table) -> SampleArrays:
    """The planner's view of a samples table (sorted by sample_id): its columns as int64/bool arrays."""
    return SampleArrays(
        sample_id=column(table, "sample_id").astype(np.int64, copy=False),
        length=column(table, "length").astype(np.int64),
        label_count=column(table, "label_count").astype(np.int64),
        first_label_supervised=column(table, "first_label_supervised"),
    )


def read_manifest(plan_dir: str | Path) -> dict[str, Any]:
    """A plan or scan directory's manifest.json (after recovering an interrupted replace)."""
    atomic.recover(plan_dir)  # as in `PlanDir`
    path = Path(plan_dir) / MANIFEST_FILE
    try:
        return orjson.loads(path.read_bytes())
    except FileNotFoundError:
        raise StoreError(f"{plan_dir} is not a plan directory (no {MANIFEST_FILE})") from None
    except orjson.JSONDecodeError as exc:
        raise StoreError(f"{path} is not valid JSON: {exc}") from None


# ---------------------------------------------------------------- plan directory


def metrics_schema() -> pa.Schema:
    """The metrics table's Arrow schema: epoch, stage, then every metric column (int64 or float64, nullable)."""
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


def plan_table(cols: dict[str, Any], schema: pa.Schema = PLAN_SCHEMA) -> pa.Table:
    """Arrow plan table from `pipeline.plan_columns` arrays: the CSR bounds become the nested `sample_ids` lists."""
    rows = pa.ListArray.from_arrays(arrow_array(cols["row_bounds"], pa.int32()), arrow_array(cols["sample_ids"], pa.int64()))
    nested = pa.ListArray.from_arrays(arrow_array(cols["batch_bounds"], pa.int32()), rows)
    arrays = [nested if f.name == "sample_ids" else arrow_array(cols[f.name], f.type) for f in schema]
    return pa.Table.from_arrays(arrays, schema=schema)


def eval_table(cols: dict[str, Any]) -> pa.Table:
    """Arrow eval plan table from `evaluation.eval_columns` arrays."""
    return plan_table(cols, EVAL_SCHEMA)


def eval_summary(cols: dict[str, np.ndarray], world_size: int) -> dict[str, int]:
    """What the manifest records of the eval plan: its sizes and the global target count the loss divides by."""
    n = int(cols["index"].shape[0])
    return {
        "samples": int(cols["sample_ids"].shape[0]),
        "batches": n,
        "batches_per_rank": -(-n // world_size),
        "tokens": int(cols["tokens"].sum()),
        "label_count": int(cols["label_count"].sum()),
        "cost": int(cols["cost"].sum()),
    }


def before_table(epochs: list[int], label_counts: list[np.ndarray]) -> pa.Table:
    """The before stage's label count per microbatch of each epoch, in (epoch, index) order."""
    epoch = np.concatenate([np.full(len(c), e, dtype=np.int32) for e, c in zip(epochs, label_counts, strict=True)])
    index = np.concatenate([np.arange(len(c), dtype=np.int64) for c in label_counts])
    counts = np.concatenate(label_counts).astype(np.int64)
    return pa.Table.from_arrays([arrow_array(epoch, pa.int32()), arrow_array(index, pa.int64()),
                                 arrow_array(counts, pa.int64())], schema=BEFORE_SCHEMA)


def write_plan_files(directory: Path, plan: pa.Table, samples: pa.Table, metrics: pa.Table, before: pa.Table,
                     fingerprints: dict[str, Any], settings: dict[str, Any], manifest: dict[str, Any],
                     evaluation: pa.Table | None = None) -> None:
    """Write the plan directory's files into `directory` (a temporary one from `atomic_directory`).

    The plan file's metadata is the whole manifest (plus its kind): `manifest.json` is its human-readable mirror,
    so that nothing a reader relies on lives only in an unchecked JSON file.
    """
    plan_meta = {META_KEY: orjson.dumps({**manifest, "kind": "plan"}, option=orjson.OPT_SORT_KEYS)}
    write_parquet(plan, directory / PLAN_FILE, plan_meta, PLAN_ROW_GROUP)
    schema = samples_schema(DATASET_COLUMN in samples.column_names)
    write_parquet(samples.select(schema.names).cast(schema), directory / SAMPLES_FILE,
                  file_metadata("samples", fingerprints, settings))
    write_parquet(metrics, directory / METRICS_FILE, file_metadata("metrics", fingerprints, settings))
    write_parquet(before, directory / BEFORE_FILE, file_metadata("before", fingerprints, settings))
    if evaluation is not None:
        write_parquet(evaluation, directory / EVAL_FILE, file_metadata("eval", fingerprints, settings))
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


def _near_samples_table(path: Path, names: set[str]) -> None:
    """Refuse a Parquet file that is a samples table but for some columns (it has sample_id, length and label_count
    and no column any source format reads): telling its format would fail with a message about formats."""
    if {"sample_id", "length", "label_count"} <= names and not names & set(ROLES):
        want = set(SAMPLES_SCHEMA.names)
        wrong = [f"lacks {sorted(want - names)}"] if want - names else []
        wrong += [f"has {sorted(names - want)} besides"] if names - want else []
        raise InputError(f"{path} looks like a samples table but {' and '.join(wrong)}: a samples table has exactly "
                         f"the columns {SAMPLES_SCHEMA.names} (schemas/samples.arrow.json)")


def read_samples_source(path: str | Path) -> tuple[pa.Table, dict] | None:
    """A samples table given as SOURCE (Parquet with the samples schema, or a SCAN_DIR/PLAN_DIR); else None."""
    p = Path(path).expanduser()
    if p.is_dir() or not p.exists():
        atomic.recover(p)
    if p.is_dir():
        f = p / SAMPLES_FILE
        if not f.is_file():
            kind = output_kind(p)
            if kind is not None:
                raise InputError(f"{p} is a plancc {kind} directory without its {SAMPLES_FILE}: it was deleted or "
                                 "moved; compile or scan the source again")
            return None
    elif p.is_file() and p.suffix.lower() == ".parquet":
        f = p
        try:
            names = set(pq.read_schema(f).names)
        except (pa.ArrowException, OSError) as exc:
            raise InputError(f"{f}: not a readable Parquet file ({exc})") from None
        if names != set(SAMPLES_SCHEMA.names):
            _near_samples_table(f, names)
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
    settings = meta.get("settings") if meta and meta.get("kind") == "samples" else None
    if isinstance(settings, dict) and {"format", "long", "sequence_len", "shift"} <= set(settings):
        info["scan_options"] = settings  # a plancc scan wrote it: the options its rows were made under
    tokens = f.parent / TOKENS_DIR
    info["tokenized_path"] = str(tokens) if token_store.is_store(tokens) else None
    manifest = f.parent / SCAN_MANIFEST_FILE
    if manifest.is_file():
        try:
            info["report"] = orjson.loads(manifest.read_bytes())
        except orjson.JSONDecodeError:
            info["report"] = None
    _check_recorded(f, table, info)
    return table, info


def _check_recorded(f: Path, table: pa.Table, info: dict[str, Any]) -> None:
    """A scan or plan directory given as SOURCE: its samples must still hash to the fingerprints its `scan.json`
    (or `manifest.json`) records, and its token store open (the constant-cost checks) holding the same; else the
    plan would be built on edited or swapped-in rows and only a later `validate` would tell."""
    record_file = f.parent / (SCAN_MANIFEST_FILE if info.get("report") else MANIFEST_FILE)
    if not record_file.is_file() or f.name != SAMPLES_FILE:
        return  # a bare samples table: nothing records what it held
    try:
        record = orjson.loads(record_file.read_bytes())
        identity = scan_identity(record if info.get("report") else record["scan"])
        recorded = {k: record["fingerprints"][k] for k in ("dataset", "metadata")}
    except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError):
        raise InputError(f"{record_file} is not a readable plancc record (edited?): rescan the source") from None
    found = samples_fingerprints(table, identity)
    for key in ("dataset", "metadata"):
        if found[key] != recorded[key]:
            raise InputError(f"{f}: its rows do not hash to the {key} fingerprint {record_file} records (the "
                             "samples table was edited or swapped in): rescan the source")
    if info["tokenized_path"]:
        header = token_store.open_store(info["tokenized_path"]).header
        if header["fingerprints"] != recorded:
            raise InputError(f"{info['tokenized_path']}: its fingerprints are not those {record_file} records (the "
                             "token store was swapped in from another scan): rescan the source")


# ---------------------------------------------------------------- verified reading (PlanDir)
#
# How the files of a plan vouch for each other: `plan.parquet`'s metadata is the root (the manifest, with the
# fingerprints and settings); its settings must hash to the config fingerprint, each epoch's rows to that epoch's
# plan fingerprint and the layout of docs/spec.md §4; `samples.parquet` must hash to the dataset and metadata fingerprints,
# `metrics.parquet` to the metrics checksum; every sibling file's metadata and `manifest.json` must equal the
# plan file's. Checks return lists of problems (validate reports them all; the runtime raises on the first).

PLAN_META_KEYS = ("checksums", "data", "epochs", "fingerprints", "kind", "plancc", "samples", "scan", "schema",
                  "settings")
EPOCH_COLUMNS = ["index", "update", "rank", "micro_step", "sample_ids", "tokens", "label_count", "cost", "num_items",
                 "complete_update"]


class PlanIntegrityError(StoreError):
    """A plan file's content or metadata does not match what the plan's fingerprints and checksums bind."""


_META_TYPES = {"checksums": dict, "data": dict, "epochs": list, "fingerprints": dict, "scan": dict, "settings": dict,
               "samples": int}


def meta_shape_problem(meta: dict[str, Any]) -> str | None:
    """What in a plan file's metadata has the wrong shape (`data = []`, `data.tokens = 5`, `fingerprints.plan =
    "x"`), else None: readers index into these values, so a wrong type would be a traceback, not a message."""
    for key, type_ in _META_TYPES.items():
        if not isinstance(meta[key], type_) or isinstance(meta[key], bool):
            return f"{key} is {meta[key]!r}, expected {'an object' if type_ is dict else 'a ' + type_.__name__}"
    data, fingerprints = meta["data"], meta["fingerprints"]
    if "tokens" in data and data["tokens"] != TOKENS_DIR:
        return (f"data.tokens is {data['tokens']!r}; a plan's token store is always its {TOKENS_DIR!r} folder (plancc "
                "reads no other path from a plan)")
    for key in ("source", "source_relative"):
        if key in data and not (isinstance(data[key], list) and all(isinstance(p, str) for p in data[key])):
            return f"data.{key} is {data[key]!r}, expected a list of paths"
    if not isinstance(fingerprints.get("plan"), dict):
        return f"fingerprints.plan is {fingerprints.get('plan')!r}, expected an object (epoch: fingerprint)"
    if "tokens" in fingerprints and not isinstance(fingerprints["tokens"], str):
        return f"fingerprints.tokens is {fingerprints['tokens']!r}, expected the token store's digest (a string)"
    return None


def samples_fingerprints(table: pa.Table, identity: dict[str, str | None] | None = None) -> dict[str, str]:
    """`dataset` and `metadata` fingerprints of a samples table made with `identity` (`fingerprint.scan_identity`)."""
    col = {name: column(table, name) for name in SAMPLES_SCHEMA.names}
    if DATASET_COLUMN in table.column_names:  # a recipe's: which dataset each sample is of is what the plan saw
        codes, names = dataset_codes(table)
        identity = {**(identity or {}), "datasets": canonical_hash({"names": names, "codes": array_digest(codes)})}
    return {
        "dataset": dataset_fingerprint(col["sample_id"], col["token_hash"]),
        "metadata": metadata_fingerprint(col["sample_id"], col["length"], col["label_count"],
                                         col["first_label_supervised"], identity),
    }


def dataset_codes(table: pa.Table) -> tuple[np.ndarray, list[str]]:
    """A recipe samples table's `dataset` column as (int32 code per sample, names in order of first appearance)."""
    encoded = table.column(DATASET_COLUMN).combine_chunks().dictionary_encode()
    return column(pa.table({"c": encoded.indices}), "c"), encoded.dictionary.to_pylist()


def nested_arrays(sample_ids: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(flat sample ids, row bounds, batch bounds) of a `list<list<int64>>` column, without a Python loop."""
    batches = sample_ids.combine_chunks() if isinstance(sample_ids, pa.ChunkedArray) else sample_ids
    rows = batches.flatten()
    batch_bounds = np.asarray(batches.offsets, dtype=np.int64) - batches.offsets[0].as_py()
    row_bounds = np.asarray(rows.offsets, dtype=np.int64) - rows.offsets[0].as_py()
    return rows.flatten().to_numpy().astype(np.int64), row_bounds, batch_bounds


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
        held = _held(source)
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
        pf = _open(source)
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


@dataclass(frozen=True)
class EpochMicrobatches:
    """One epoch's microbatches (optionally one rank's share) in global order, as flat CSR arrays.

    Microbatch `i` holds rows `row_bounds[batch_bounds[i]:batch_bounds[i+1]]`; row `r` holds the sample ids
    `sample_ids[row_bounds[r]:row_bounds[r+1]]`. `index` is its global position in the epoch; `update`, `rank`,
    `micro_step` say where it runs.
    """

    index: np.ndarray
    update: np.ndarray
    rank: np.ndarray
    micro_step: np.ndarray
    sample_ids: np.ndarray
    row_bounds: np.ndarray
    batch_bounds: np.ndarray

    def __len__(self) -> int:
        return len(self.update)

    def __getitem__(self, i: int) -> list[list[int]]:
        """Microbatch `i` of the share as its rows of sample ids."""
        if not -len(self) <= i < len(self):
            raise IndexError(f"microbatch {i} out of range (0..{len(self) - 1})")
        i %= len(self)
        r0, r1 = int(self.batch_bounds[i]), int(self.batch_bounds[i + 1])
        return [self.sample_ids[self.row_bounds[r]:self.row_bounds[r + 1]].tolist() for r in range(r0, r1)]


def _first_row(bad: np.ndarray) -> int:
    return int(np.flatnonzero(bad)[0])


class PlanDir:
    """A plan directory opened for reading, with the checks that bind its files together (see above).

    Opening opens the directory and each of its files once (`Held`: every later read comes from what was opened, so
    a plan replaced under a reader changes nothing for it) and reads only the plan file's footer: refuses a
    missing, foreign or other-schema plan file, a file that is not a regular file, metadata without the manifest's
    keys or of the wrong shape, and types the settings (`PlanSettings`). The `*_problems` methods check one file
    each; `read_epoch` + `epoch_problems` check one epoch's rows against the layout and the plan fingerprint.
    """

    def __init__(self, path: str | Path):
        p = Path(path)
        if p.is_file() and p.name == PLAN_FILE:
            p = p.parent
        atomic.recover(p)  # a plan an interrupted replace left behind is put back (or finished) before it is read
        if not p.is_dir():
            raise StoreError(f"{path} is not a plan directory" + ("" if p.exists() else " (it does not exist)"))
        if not (p / PLAN_FILE).exists():
            raise StoreError(f"{path} is not a plan directory (no {PLAN_FILE}); write one with "
                             "`plancc compile SOURCE -o PLAN_DIR`")
        self.path = p
        self.plan_file = p / PLAN_FILE
        self._dir_fd = token_store.open_dir(p, StoreError)
        weakref.finalize(self, os.close, self._dir_fd)
        self._files = {name: self._hold(name) for name in (PLAN_FILE, SAMPLES_FILE, METRICS_FILE, BEFORE_FILE,
                                                           MANIFEST_FILE, EVAL_FILE)}
        self.meta: dict[str, Any] = read_file_meta(self.held(PLAN_FILE))
        if self.meta.get("kind") != "plan":
            raise PlanIntegrityError(f"{self.plan_file} is a plancc '{self.meta.get('kind')}' file, not a plan")
        missing = sorted(set(PLAN_META_KEYS) - set(self.meta))
        if missing:
            raise PlanIntegrityError(f"{self.plan_file}: metadata lacks {missing} (written by an older plancc, or "
                                     "edited); recompile the plan")
        shape = meta_shape_problem(self.meta)
        if shape:
            raise PlanIntegrityError(f"{self.plan_file} metadata: {shape}; recompile the plan")
        self.fingerprints: dict[str, Any] = self.meta["fingerprints"]
        try:
            self.settings = PlanSettings(**self.meta["settings"])
        except (TypeError, SettingsError) as exc:
            raise PlanIntegrityError(f"{self.plan_file}: settings this plancc cannot use ({exc})") from None

    def _hold(self, name: str) -> Held | None:
        """`name` opened through the directory opened at init (None when it is absent)."""
        try:
            return hold(self.path / name, dir_fd=self._dir_fd, name=name)
        except StoreError:
            if os.path.lexists(self.path / name):
                raise
            return None

    def held(self, name: str) -> Held:
        """One of the plan's files as opened at init; refused when it was absent."""
        found = self._files.get(name)
        if found is None:
            raise StoreError(f"{self.path / name} does not exist")
        return found

    def source(self, name: str) -> Held | Path:
        """One of the plan's files as opened at init, or its path when it was absent (a reader then names it)."""
        return self._files.get(name) or self.path / name

    @property
    def data(self) -> dict[str, Any]:
        """What compile recorded of the trainer's data, for people: {"tokens": "tokens" (the token store folder in
        this directory), "source": [paths], "source_relative": [paths]}. Readers never follow these paths: the token
        store is `tokens/` (bound by `fingerprints.tokens`) or what the caller gives."""
        return self.meta["data"]

    @property
    def binds_tokens(self) -> bool:
        """Whether the plan ships a token store (its digest is `fingerprints.tokens`)."""
        return "tokens" in self.fingerprints

    def data_problems(self) -> list[str]:
        """`data.tokens` and `fingerprints.tokens` must agree: a plan either ships and binds `tokens/`, or neither."""
        if ("tokens" in self.data) == self.binds_tokens:
            return []
        if self.binds_tokens:
            return [f"{self.plan_file} metadata: fingerprints.tokens binds a token store but data.tokens is missing"]
        return [f"{self.plan_file} metadata: data.tokens names a token store that no fingerprints.tokens binds "
                "(written by an older plancc, or edited); recompile the plan"]

    def open_tokens(self) -> token_store.MappedTokens:
        """The plan's token store, `tokens/` in the directory opened at init, refused (`PlanIntegrityError`) unless
        it is the one the plan was compiled with: its digest (constant work: a header hash over its chunk hashes)
        must be `fingerprints.tokens`."""
        problems = self.data_problems()
        if problems or not self.binds_tokens:
            raise PlanIntegrityError(problems[0] if problems else f"{self.path} ships no token store")
        where = self.path / TOKENS_DIR
        try:
            fd = token_store.open_dir(TOKENS_DIR, token_store.TokenStoreError, dir_fd=self._dir_fd,
                                      shown=f"token store {where}")
        except FileNotFoundError:
            raise PlanIntegrityError(f"{where} does not exist: the plan's token store was deleted or moved") from None
        try:
            m = token_store.open_store(where, fd)
        except token_store.TokenStoreError as exc:
            raise PlanIntegrityError(str(exc)) from None
        finally:
            os.close(fd)
        if m.digest != self.fingerprints["tokens"]:
            raise PlanIntegrityError(f"{where} is not the token store this plan was compiled with (its digest "
                                     f"{m.digest}, the plan binds {self.fingerprints['tokens']}): its tokens were "
                                     "changed and rehashed, or another store was put in its place")
        return m

    def header_problems(self) -> list[str]:
        """The settings hash to the config fingerprint and the plan fingerprints name exactly the plan's epochs."""
        problems = []
        if config_fingerprint(self.meta["settings"]) != self.fingerprints.get("config"):
            problems.append(f"{self.plan_file}: its settings do not hash to its config fingerprint (a setting such as "
                            "grad_accum or world_size was edited); recompile the plan")
        epochs = sorted(self.fingerprints.get("plan", {}))
        if epochs != sorted(str(e) for e in range(self.settings.epochs)):
            problems.append(f"{self.plan_file}: plan fingerprints for epochs {epochs}, but settings say "
                            f"epochs={self.settings.epochs}")
        return problems

    def manifest_problems(self, *, required: bool = True) -> list[str]:
        """`manifest.json` must equal the plan file's metadata (it is its mirror, never read for settings)."""
        path = self.path / MANIFEST_FILE
        if self._files[MANIFEST_FILE] is None:
            return [f"{path} is missing (it mirrors {PLAN_FILE}'s metadata)"] if required else []
        try:
            manifest = orjson.loads(self.held(MANIFEST_FILE).buffer.to_pybytes())
        except orjson.JSONDecodeError as exc:
            return [f"{path} is not valid JSON: {exc}"]
        found = first_difference(manifest, {k: v for k, v in self.meta.items() if k != "kind"})
        return [f"{path}: {found} differs from {PLAN_FILE}'s metadata"] if found else []

    def companion_problems(self, name: str, kind: str) -> list[str]:
        """A sibling Parquet file's metadata: its kind, and the plan's schema version, fingerprints and settings."""
        path = self.path / name
        try:
            meta = read_file_meta(self.held(name))
        except StoreError as exc:
            return [str(exc)]
        want = {"fingerprints": self.fingerprints, "kind": kind, "schema": SCHEMA_VERSION,
                "settings": self.meta["settings"]}
        found = first_difference(meta, want)
        return [f"{path}: metadata {found} differs from {PLAN_FILE}'s"] if found else []

    # ------------------------------------------------------------ samples and metrics
    def read_samples(self) -> pa.Table:
        """The plan's samples table (check it with `samples_problems`)."""
        return read_samples(self.held(SAMPLES_FILE))

    def samples_problems(self, table: pa.Table) -> list[str]:
        """The samples' content against the dataset and metadata fingerprints."""
        return [f"{self.path / SAMPLES_FILE}: its rows do not hash to the plan's {key} fingerprint "
                f"({'token hashes' if key == 'dataset' else 'ids, lengths or label counts'} changed)"
                for key, value in samples_fingerprints(table, scan_identity(self.meta["scan"])).items()
                if value != self.fingerprints.get(key)]

    def read_metrics(self) -> pa.Table:
        """The plan's metrics table (check it with `metrics_problems`)."""
        return read_table(self.held(METRICS_FILE), metrics_schema())

    def metrics_problems(self, table: pa.Table) -> list[str]:
        """The metrics rows against the checksum the plan file records."""
        if metrics_checksum(table.to_pylist()) != self.meta["checksums"].get("metrics"):
            return [f"{self.path / METRICS_FILE}: its rows do not match the metrics checksum in {PLAN_FILE}"]
        return []

    @property
    def has_before(self) -> bool:
        """Whether compile stored the before stage (plans of older plancc versions did not)."""
        return "before" in self.meta["checksums"]

    def read_before(self) -> pa.Table:
        """The before stage's label count per microbatch of every epoch, as compile stored it."""
        return read_table(self.held(BEFORE_FILE), BEFORE_SCHEMA)

    def before_problems(self, table: pa.Table) -> list[str]:
        """The before rows against the checksum the plan file records, and their (epoch, index) order."""
        epoch, index = column(table, "epoch"), column(table, "index")
        if before_checksum(epoch, column(table, "label_count")) != self.meta["checksums"].get("before"):
            return [f"{self.path / BEFORE_FILE}: its rows do not match the before checksum in {PLAN_FILE}"]
        starts = np.r_[True, epoch[1:] != epoch[:-1]] if epoch.size else np.zeros(0, dtype=bool)
        expected = np.arange(epoch.size) - np.maximum.accumulate(np.where(starts, np.arange(epoch.size), 0))
        if not np.array_equal(index, expected):
            return [f"{self.path / BEFORE_FILE}: rows are not in (epoch, index) order"]
        return []

    def before_labels(self, epoch: int, table: pa.Table | None = None) -> np.ndarray | None:
        """The before stage's label count per microbatch of `epoch` (None for a plan that did not store it)."""
        if not self.has_before:
            return None
        table = self.read_before() if table is None else table
        epochs = column(table, "epoch")
        return column(table, "label_count")[epochs == epoch]

    # ------------------------------------------------------------ eval plan
    @property
    def has_eval(self) -> bool:
        """Whether the plan holds an eval plan (compiled with held-out samples)."""
        return "eval" in self.fingerprints

    def read_eval(self) -> pa.Table:
        """The eval plan's rows in file (= index) order (check them with `eval_problems`)."""
        return read_table(self.source(EVAL_FILE), EVAL_SCHEMA, columns=EVAL_SCHEMA.names)

    def eval_problems(self, table: pa.Table) -> list[str]:
        """The eval rows against their layout (index, rank = index % world_size), the eval fingerprint and the
        manifest's eval summary (its global target count is what the eval loss divides by)."""
        path, n, W = self.path / EVAL_FILE, table.num_rows, self.settings.world_size
        cols = {name: column(table, name) for name in EVAL_SCHEMA.names if name != "sample_ids"}
        ids, row_bounds, batch_bounds = nested_arrays(table.column("sample_ids"))
        cols.update(sample_ids=ids, row_bounds=row_bounds, batch_bounds=batch_bounds)
        problems = []
        for name, want, why in (("index", np.arange(n), "the row's position"),
                                ("rank", np.arange(n) % W, f"index % world_size = index % {W}")):
            bad = cols[name] != want
            if bad.any():
                i = _first_row(bad)
                problems.append(f"{path} row {i}: {name} is {cols[name][i]}, but {why} gives {want[i]}")
        if eval_fingerprint(cols) != self.fingerprints.get("eval"):
            problems.append(f"{path}: its {n} rows do not hash to the plan's eval fingerprint (rows edited, deleted, "
                            "reordered or samples exchanged)")
        found = first_difference(self.meta.get("eval"), eval_summary(cols, W))
        if found:
            problems.append(f"{self.plan_file} metadata: eval.{found} (recomputed from {EVAL_FILE})")
        return problems

    # ------------------------------------------------------------ plan rows
    def read_rows(self, columns: list[str] | None = None, filters: list[tuple] | None = None) -> pa.Table:
        """Plan rows matching Parquet `filters` on the plan columns (row groups skipped on their statistics), in
        file order: (epoch, rank, index)."""
        return read_table(self.held(PLAN_FILE), PLAN_SCHEMA, columns=columns, filters=filters)

    def read_share(self, epoch: int, rank: int | None = None) -> EpochMicrobatches:
        """The microbatches of `epoch` (only those of `rank` when given) in global order, as flat CSR arrays."""
        filters = [("epoch", "=", int(epoch))] + ([] if rank is None else [("rank", "=", int(rank))])
        table = self.read_rows(["index", "update", "rank", "micro_step", "sample_ids"], filters)
        table = table.take(pc.sort_indices(table, [("index", "ascending")]))
        flat, row_bounds, batch_bounds = nested_arrays(table.column("sample_ids"))
        return EpochMicrobatches(*(column(table, c) for c in ("index", "update", "rank", "micro_step")),
                                 flat, row_bounds, batch_bounds)

    def read_epoch(self, epoch: int, columns: list[str] | None = None) -> pa.Table:
        """One epoch's rows in global order (a filtered read: the same one the runtime verifies and replays)."""
        table = read_table(self.held(PLAN_FILE), PLAN_SCHEMA, columns=columns or EPOCH_COLUMNS,
                           filters=[("epoch", "=", int(epoch))])
        index = column(table, "index")
        if index.shape[0] > 1 and not bool(np.all(index[1:] > index[:-1])):
            table = table.take(pc.sort_indices(table, [("index", "ascending")]))
        return table

    def epoch_problems(self, epoch: int, table: pa.Table) -> list[str]:
        """One epoch's rows (`EPOCH_COLUMNS`, global order) against the layout of docs/spec.md §4 and the plan fingerprint.

        The layout names the first row that breaks it (index, update/rank/micro_step, the update's `num_items` as
        the sum of its label counts, `complete_update`); rows that keep it but differ from what was compiled
        (samples exchanged, ids or counts edited consistently) fail the fingerprint, which covers every column.
        """
        W, G = self.settings.world_size, self.settings.grad_accum
        n = table.num_rows
        cols = {name: column(table, name) for name in EPOCH_COLUMNS if name != "sample_ids"}
        update, rank, micro_step = update_mapping(n, W, G)
        starts = np.arange(0, n, W * G)
        totals = np.add.reduceat(cols["label_count"], starts) if n else np.zeros(0, dtype=np.int64)
        expect = {
            "index": (np.arange(n), "the row's position in the epoch"),
            "update": (update, f"index // (world_size*grad_accum) = index // {W * G}"),
            "rank": (rank, f"index % world_size = index % {W}"),
            "micro_step": (micro_step, f"(index % {W * G}) // {W}"),
            "num_items": (np.repeat(totals, np.diff(np.append(starts, n))), "the sum of its update's label_count"),
            "complete_update": (update < complete_updates(n, W, G), f"whether its update holds all {W * G} rows"),
        }
        problems = []
        for name, (want, why) in expect.items():
            bad = cols[name] != want
            if bad.any():
                i = _first_row(bad)
                problems.append(f"{self.plan_file} epoch {epoch} row {i}: {name} is {cols[name][i]}, but {why} "
                                f"gives {want[i]} ({int(bad.sum())} rows differ)")
        ids, row_bounds, batch_bounds = nested_arrays(table.column("sample_ids"))
        recorded = self.fingerprints.get("plan", {}).get(str(epoch))
        nested = {"sample_ids": ids, "row_bounds": row_bounds, "batch_bounds": batch_bounds}
        if plan_fingerprint({**cols, **nested}) != recorded:
            plain = not problems and not self.settings.mixture  # a recipe's epoch may hold a sample twice
            again = repeated_sample(ids, row_bounds[batch_bounds]) if plain else None  # names a row
            if again is not None:
                problems.append(f"{self.plan_file} epoch {epoch} row {again[0]}: sample_id {again[1]} again "
                                f"(already in row {again[2]})")
            problems.append(f"{self.plan_file} epoch {epoch}: its {n} rows do not hash to the epoch's plan "
                            "fingerprint (rows edited, deleted, reordered or samples exchanged)")
        return problems


def repeated_sample(ids: np.ndarray, batch_starts: np.ndarray) -> tuple[int, int, int] | None:
    """(row, sample id, earlier row) of the first sample an epoch holds twice, or None (a sound plan).

    `ids` are the epoch's sample ids in plan order, `batch_starts` the position of each row's first id.
    """
    again = np.ones(ids.shape[0], dtype=bool)
    again[np.unique(ids, return_index=True)[1]] = False
    if not again.any():
        return None
    at = _first_row(again)
    first = int(np.flatnonzero(ids == ids[at])[0])
    row, earlier = np.searchsorted(batch_starts, [at, first], side="right") - 1
    return int(row), int(ids[at]), int(earlier)

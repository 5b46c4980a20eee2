"""The plan file's body: its rows written in rank blocks, and the digest of its bytes that lets every rank trust
every row of every epoch without decoding them.

`plan.parquet` holds every epoch's rows sorted by (epoch, rank, index): one rank's rows of one epoch (a *block*)
are consecutive. A block starts a row group of its own once the open one holds `MIN_GROUP` rows (and a row group
never exceeds `PLAN_ROW_GROUP` rows), so a rank reads its rows by row group position, decoding little of any other
rank's. The footer's `plancc.rows` key is the xxh3-128 of every byte before the footer (the *body*: the magic and
every column chunk), computed from the bytes as the writer wrote them.

What a reader checks at open (`body_problems`), on every rank, without decoding a row:

- the body hashes to `plancc.rows` (one pass over the file at memory speed, its pages dropped from the reader's
  resident set as it goes): a byte of any row of any epoch changed is refused;
- the footer's column chunks tile the body in order (each starts where the one before ends, from byte 4 to the
  footer), without dictionary pages: the footer cannot point a column at other bytes of the body.

With the epoch column's count of each epoch (`PlanFiles.body_problems`: 4 bytes a row decoded, which also holds
every row group to the rows it says it has), that makes what any rank decodes later exactly what compile wrote; a
rank's rows are found by the layout (`core.layout.rank_order_positions`) and checked by their epoch, rank and
index when read. A plan written before the key existed has no digest: its readers verify each epoch's rows
against the epoch's plan fingerprint instead (decoding them all).
"""

from __future__ import annotations

import itertools
import struct
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import xxhash

from plancc.store import parquet_footer
from plancc.store.parquet import Held
from plancc.store.schemas import PLAN_ROW_GROUP, ROWS_KEY

MIN_GROUP = 4096  # rows a row group holds before a block may start a new one: tiny plans keep few row groups
_WRITE_OPTIONS = {"compression": "zstd", "use_dictionary": False, "write_statistics": True, "store_schema": True}


def group_bounds(epoch: np.ndarray, rank: np.ndarray, max_rows: int = PLAN_ROW_GROUP,
                 min_rows: int = MIN_GROUP) -> list[int]:
    """Row group bounds over rows sorted by (epoch, rank): a block (rows of one epoch and rank) starts a new group
    when the open one holds `min_rows` or more, and no group exceeds `max_rows`."""
    n = int(epoch.shape[0])
    if n == 0:
        return [0]
    starts = np.flatnonzero(np.r_[True, (epoch[1:] != epoch[:-1]) | (rank[1:] != rank[:-1])]).tolist()
    bounds = [0]
    for a, b in zip(starts, [*starts[1:], n], strict=True):
        if a - bounds[-1] >= min_rows:
            bounds.append(a)
        while b - bounds[-1] > max_rows:
            bounds.append(bounds[-1] + max_rows)
    return [*bounds, n]


class _Hashing:
    """A write-only file that hashes what passes through it: the Parquet writer's sink."""

    def __init__(self, path: Path):
        self.file, self.digest, self.size, self.closed = open(path, "wb"), xxhash.xxh3_128(), 0, False  # noqa: SIM115

    def write(self, data) -> int:
        self.digest.update(data)
        self.size += len(data)
        return self.file.write(data)

    def writable(self) -> bool:
        return True

    def flush(self) -> None:
        self.file.flush()

    def close(self) -> None:  # the writer's close; the file itself is closed by `write_row_groups`
        self.file.flush()


def write_row_groups(schema: pa.Schema, epoch: np.ndarray, rank: np.ndarray, rows_at: Callable[[int, int], pa.Table],
                     path: Path, metadata: dict[bytes, bytes]) -> None:
    """Write the plan table in rank blocks, with `metadata` and the body digest (module docstring): rows given by their
    sorted `epoch` and `rank` and, a row group at a time, by `rows_at(a, b)` (rows a..b-1, one contiguous table), so
    the writer never needs the whole sorted table at once. Deterministic bytes for identical rows and metadata."""
    sink = _Hashing(path)
    try:
        with pq.ParquetWriter(sink, schema.with_metadata(metadata), **_WRITE_OPTIONS) as writer:
            for a, b in itertools.pairwise(group_bounds(epoch, rank)):
                writer.write_table(rows_at(a, b), row_group_size=b - a)
            body = sink.size
            writer.add_key_value_metadata({ROWS_KEY: sink.digest.hexdigest().encode()})
    finally:
        sink.file.close()
    if footer_start(path.stat().st_size, _tail(path)) != body:  # the writer kept bytes of the body for its close
        raise RuntimeError(f"{path}: the Parquet writer wrote body bytes after the digest was taken")


def _tail(path: Path) -> bytes:
    with open(path, "rb") as f:
        f.seek(-8, 2)
        return f.read(8)


def footer_start(size: int, tail: bytes) -> int:
    """Where the footer of a Parquet file of `size` bytes ending in `tail` (its last 8 bytes) starts."""
    return size - 8 - struct.unpack("<I", tail[:4])[0]


def groups(held: Held) -> list[parquet_footer.Group]:
    """The plan file's row groups as its footer describes them (`FooterError` when it is malformed)."""
    size = held.buffer.size
    end = footer_start(size, held.buffer[size - 8:].to_pybytes())
    if not 4 <= end <= size - 8:
        raise parquet_footer.FooterError(f"a footer length that does not fit the file's {size} bytes")
    return parquet_footer.row_groups(held.buffer[end:size - 8].to_pybytes())


def body_problems(held: Held, leaf_columns: int) -> list[str]:
    """The plan file's body against its digest and its footer's layout (module docstring); [] when both hold."""
    path, size = held.path, held.buffer.size
    try:
        found = groups(held)
    except parquet_footer.FooterError as exc:
        return [f"{path}: its footer is damaged ({exc}); recompile the plan"]
    at = 4
    for g, group in enumerate(found):
        for chunk in group.chunks:
            if chunk.has_dictionary or chunk.codec != parquet_footer.ZSTD or chunk.start != at:
                return [f"{path}: row group {g}'s column chunks are not where or how compile wrote them (its footer "
                        "was edited); recompile the plan"]
            at += chunk.size
        if len(group.chunks) != leaf_columns:
            return [f"{path}: row group {g} has {len(group.chunks)} column chunks, a plan has {leaf_columns}"]
    end = footer_start(size, held.buffer[size - 8:].to_pybytes())
    if at != end:
        return [f"{path}: its column chunks end at byte {at}, its footer starts at {end} (the file was edited)"]
    digest = xxhash.xxh3_128()
    for block in held.scan(end):
        digest.update(block)
    recorded = (held.parquet().metadata.metadata or {}).get(ROWS_KEY, b"").decode("ascii", "replace")
    if digest.hexdigest() != recorded:
        return [f"{path}: its rows are not the bytes compile wrote (they do not hash to its {ROWS_KEY.decode()} "
                "digest): rows were edited, or the file was rewritten"]
    return []


def has_digest(held: Held) -> bool:
    """Whether the plan file carries a body digest (plans written before it existed do not)."""
    return ROWS_KEY in (held.parquet().metadata.metadata or {})


def group_starts(found: list[parquet_footer.Group]) -> np.ndarray:
    """The first row of each row group, and the row count at the end (int64 [groups + 1])."""
    return np.concatenate([[0], np.cumsum([g.num_rows for g in found], dtype=np.int64)])

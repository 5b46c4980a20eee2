"""Where a Parquet file's column chunks lie, read from its footer by a small Thrift compact-protocol decoder.

Why not pyarrow's `metadata.row_group(g).column(c)`: building those objects from a damaged footer can abort the
whole process (a C++ exception that never becomes a Python one, e.g. for an unknown codec value), and the plan
reader must refuse a damaged file with a message, whatever byte was changed. This decoder reads only what the
plan reader checks (`plancc.store.plan_body`), refuses anything malformed with `FooterError`, and is bounded in
depth and by the footer's length. The layout is Parquet's `FileMetaData` (parquet.thrift): row groups (field 4),
each with its columns (1) and row count (3); a column chunk's metadata (3) with its codec (4), compressed size
(7), data page offset (9) and dictionary page offset (11).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

ZSTD = 6  # parquet.thrift CompressionCodec
_MAX_DEPTH = 16


class FooterError(ValueError):
    """The footer is not a well-formed Parquet `FileMetaData`."""


@dataclass(frozen=True)
class Chunk:
    """One column chunk: its codec, and the bytes it occupies (`start`: its dictionary page when it has one)."""

    codec: int
    start: int
    size: int
    has_dictionary: bool


@dataclass(frozen=True)
class Group:
    """One row group: its row count and its column chunks in schema order."""

    num_rows: int
    chunks: tuple[Chunk, ...]


class _Decoder:
    def __init__(self, data: bytes):
        self.data, self.at = data, 0

    def byte(self) -> int:
        if self.at >= len(self.data):
            raise FooterError("truncated")
        self.at += 1
        return self.data[self.at - 1]

    def varint(self) -> int:
        out = shift = 0
        while True:
            b = self.byte()
            out |= (b & 0x7F) << shift
            if not b & 0x80:
                return out
            shift += 7
            if shift > 63:
                raise FooterError("varint too long")

    def zigzag(self) -> int:
        n = self.varint()
        return (n >> 1) ^ -(n & 1)

    def take(self, n: int) -> bytes:
        if n < 0 or self.at + n > len(self.data):
            raise FooterError("truncated")
        self.at += n
        return self.data[self.at - n:self.at]

    def value(self, kind: int, depth: int) -> Any:
        if depth > _MAX_DEPTH:
            raise FooterError("nested too deeply")
        if kind in (1, 2):  # a struct field's boolean is its type; a list element's, one byte
            return kind == 1
        if kind == 3:
            return self.byte()
        if kind in (4, 5, 6):
            return self.zigzag()
        if kind == 7:
            return struct.unpack("<d", self.take(8))[0]
        if kind == 8:
            return self.take(self.varint())
        if kind in (9, 10):
            head = self.byte()
            size, elem = head >> 4, head & 0x0F
            if size == 15:
                size = self.varint()
            if size > len(self.data) - self.at:
                raise FooterError("list longer than the footer")
            return [self.byte() == 1 if elem in (1, 2) else self.value(elem, depth + 1) for _ in range(size)]
        if kind == 11:
            size = self.varint()
            if size == 0:
                return {}
            types = self.byte()
            if size > len(self.data) - self.at:
                raise FooterError("map longer than the footer")
            return {self.value(types >> 4, depth + 1): self.value(types & 0x0F, depth + 1) for _ in range(size)}
        if kind == 12:
            return self.fields(depth + 1)
        raise FooterError(f"unknown Thrift type {kind}")

    def fields(self, depth: int) -> dict[int, Any]:
        out: dict[int, Any] = {}
        last = 0
        while True:
            head = self.byte()
            if head == 0:
                return out
            delta, kind = head >> 4, head & 0x0F
            last = last + delta if delta else self.zigzag()
            out[last] = self.value(kind, depth)


def _int(struct_: dict[int, Any], field: int, what: str) -> int:
    value = struct_.get(field)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise FooterError(f"{what} is {value!r}")
    return value


def row_groups(footer: bytes) -> list[Group]:
    """The row groups a Parquet footer (the bytes between the data and the length word) describes."""
    meta = _Decoder(footer).fields(0)
    groups = meta.get(4)
    if not isinstance(groups, list):
        raise FooterError("no row groups")
    out = []
    for g in groups:
        columns = g.get(1) if isinstance(g, dict) else None
        if not isinstance(columns, list):
            raise FooterError("a row group without columns")
        chunks = []
        for c in columns:
            md = c.get(3) if isinstance(c, dict) else None
            if not isinstance(md, dict):
                raise FooterError("a column chunk without its metadata")
            has_dictionary = 11 in md
            start = _int(md, 11 if has_dictionary else 9, "a page offset")
            chunks.append(Chunk(_int(md, 4, "a codec"), start, _int(md, 7, "a compressed size"), has_dictionary))
        out.append(Group(_int(g, 3, "a row count"), tuple(chunks)))
    return out

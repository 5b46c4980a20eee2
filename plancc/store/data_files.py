"""The file types a dataset is read from, one table by suffix: for the scan's sources (a row range at a time,
`open_rows`) and for the runtime's `data=` (a whole file, `read_file`).

    suffix     text (UTF-8 checked)   by row range
    .jsonl     yes                    line by line (`json_rows.JsonlRows`)
    .json      yes                    parsed whole (a list of objects, an object of columns, or JSON lines)
    .parquet   no                     by row group
    .arrow     no                     by record batch, memory-mapped (the stream format: read whole)
    .csv       yes                    parsed whole

A read gives a `Block`: typed Arrow columns, and JSON columns of mixed types kept as Python lists. Text files must
be UTF-8: the first bad byte is an error naming its line (Arrow's readers would otherwise keep the bytes and fail
far later, or turn a CSV column into binary).
"""

from __future__ import annotations

import codecs
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from plancc.errors import InputError
from plancc.store import parquet
from plancc.store.json_rows import Block, JsonlRows, read_json, read_jsonl


class Rows(Protocol):
    """A file open for reading by row range."""

    def read(self, a: int, b: int) -> Block:
        """Rows [a, b) of the file."""

    def count(self) -> int:
        """Rows in the file."""

    def close(self) -> None:
        """Release the file."""


class _Parquet:
    """A Parquet file by row group."""

    def __init__(self, path: str):
        self.path = path
        try:
            self.file = pq.ParquetFile(path)
        except (pa.ArrowException, OSError) as exc:
            raise InputError(f"{path}: cannot read parquet file ({exc})") from None
        sizes = [self.file.metadata.row_group(i).num_rows for i in range(self.file.num_row_groups)]
        self.starts = [sum(sizes[:i]) for i in range(len(sizes) + 1)]

    def read(self, a: int, b: int) -> Block:
        groups = [i for i in range(len(self.starts) - 1) if self.starts[i] < b and self.starts[i + 1] > a]
        if not groups:
            return self.file.schema_arrow.empty_table(), {}
        table = self.file.read_row_groups(groups)
        return table.slice(a - self.starts[groups[0]], b - a), {}

    def count(self) -> int:
        return self.starts[-1]

    def close(self) -> None:
        self.file.close()


class _Arrow:
    """An Arrow IPC file, memory-mapped, by record batch (the stream format has no index: read whole, mapped)."""

    def __init__(self, path: str):
        self.path = path
        try:
            self.reader = pa.ipc.open_file(pa.memory_map(path))
            sizes = [self.reader.get_batch(i).num_rows for i in range(self.reader.num_record_batches)]
            self.table = None
        except pa.ArrowInvalid:
            table, _ = read_file(path)
            self.reader, self.table, sizes = None, table, [table.num_rows]
        self.starts = [sum(sizes[:i]) for i in range(len(sizes) + 1)]

    def read(self, a: int, b: int) -> Block:
        if self.table is not None:
            return self.table.slice(a, b - a), {}
        ks = [k for k in range(len(self.starts) - 1) if self.starts[k] < b and self.starts[k + 1] > a]
        if not ks:
            return self.reader.schema.empty_table(), {}
        table = pa.Table.from_batches([self.reader.get_batch(k) for k in ks], self.reader.schema)
        return table.slice(a - self.starts[ks[0]], b - a), {}

    def count(self) -> int:
        return self.starts[-1]

    def close(self) -> None:
        pass


class _Whole:
    """A file parsed whole (`.json`, `.csv`), kept while ranges of it are read."""

    def __init__(self, path: str):
        self.path = path
        self.table, self.loose = read_file(path, checked=True)
        self.rows = self.table.num_rows if self.table.num_columns else (
            len(next(iter(self.loose.values()))) if self.loose else 0)

    def read(self, a: int, b: int) -> Block:
        return self.table.slice(a, b - a), {k: v[a:b] for k, v in self.loose.items()}

    def count(self) -> int:
        return self.rows

    def close(self) -> None:
        pass


def _csv(path: str, threads: bool) -> Block:
    return pacsv.read_csv(path, read_options=pacsv.ReadOptions(use_threads=threads),
                         parse_options=pacsv.ParseOptions(newlines_in_values=True)), {}


@dataclass(frozen=True)
class FileType:
    """How one suffix is read: whole (`whole`), by row range (`rows`), and whether it is UTF-8 text."""

    whole: Callable[[str, bool], Block]  # (path, whether Arrow may decode on its worker threads)
    rows: Callable[[str], Rows]
    text: bool = False


FILE_TYPES = {
    ".jsonl": FileType(lambda path, threads: read_jsonl(path), JsonlRows, text=True),
    ".json": FileType(lambda path, threads: read_json(path), _Whole, text=True),
    ".parquet": FileType(lambda path, threads: (pq.read_table(path, use_threads=threads, pre_buffer=threads), {}),
                         _Parquet),
    ".arrow": FileType(lambda path, threads: (parquet.read_arrow(path), {}), _Arrow),
    ".csv": FileType(_csv, _Whole, text=True),
}
SUFFIXES = tuple(FILE_TYPES)


def file_type(path: str) -> FileType:
    """The type of file `path` by its suffix; another suffix is an error naming the ones plancc reads."""
    suffix = Path(path).suffix.lower()
    if suffix not in FILE_TYPES:
        raise InputError(f"{path}: unsupported file type '{suffix}' (use one of {', '.join(SUFFIXES)})")
    return FILE_TYPES[suffix]


def check_utf8(path: str, chunk_size: int = 1 << 22) -> None:
    """A text file must be UTF-8: the first bad byte is an error naming its line and byte offset."""
    done, lines, rest = 0, 0, b""
    with open(path, "rb") as f:
        while True:
            chunk = f.read(chunk_size)
            block = rest + chunk
            cut = len(block) if not chunk else block.rfind(b"\n") + 1  # whole lines: never split a character
            try:
                codecs.decode(block[:cut], "utf-8")
            except UnicodeDecodeError as exc:
                line = lines + block.count(b"\n", 0, exc.start) + 1
                raise InputError(f"{path} line {line} (byte offset {done + exc.start}): not valid UTF-8 (byte "
                                 f"0x{block[exc.start]:02x}); save the file as UTF-8") from None
            if not chunk:
                return
            done, lines, rest = done + cut, lines + block.count(b"\n", 0, cut), block[cut:]


def read_file(path: str, *, checked: bool = False, threads: bool = True) -> Block:
    """The whole file (`checked`: its UTF-8 is checked already); an error names the file (and line). `threads`:
    whether Arrow may decode on its worker threads (not in a process that reads a plan: `parquet.read_table`)."""
    kind = file_type(path)
    try:
        if kind.text and not checked:
            check_utf8(path)
        return kind.whole(path, threads)
    except InputError:
        raise
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise InputError(f"{path}: cannot read {Path(path).suffix.lower()[1:]} file ({exc})") from None


def open_rows(path: str) -> Rows:
    """The file open for reading by row range (a text file's UTF-8 checked first)."""
    kind = file_type(path)
    if kind.text:
        check_utf8(path)
    return kind.rows(path)

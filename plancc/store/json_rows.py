"""JSON and JSON lines files read into Arrow, naming the exact file and line of what cannot be read.

Arrow's JSON reader is tried first because it is fast; where it refuses (malformed, or a column whose values have
mixed types), the text is re-read with orjson line by line, so the error names the line; a column of mixed types is
kept as a Python list (`loose`) instead of failing the read: it is only an error if the format that reads it needs
another type (then the format names its first bad row). `JsonlRows` reads a JSON lines file by row range.

Parsers recurse per level: Arrow's JSON reader segfaults on a line nested 100,000 deep, and values a few hundred
deep overflow Python's recursion limit wherever they are printed or converted. No dataset row needs more than a
few levels, so a text nesting deeper than `MAX_DEPTH` is refused, naming its line, by one byte scan that skips
string contents (a `[` inside a string is text, not nesting), before any parser sees it.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.json as pajson

from plancc.core.jit import numba
from plancc.errors import InputError

Block = tuple[pa.Table, dict[str, list[Any]]]  # typed columns, and the mixed-type ones as Python lists

MAX_DEPTH = 100


@numba.njit(cache=True, nogil=True)
def _too_deep(buf, limit, lines):  # pragma: no cover (compiled)
    """Offset in `buf` (the text's bytes, uint8) of the first bracket nesting deeper than `limit`, or -1;
    `lines`: each line is its own text (JSON lines), so a malformed line's unclosed string or bracket does not carry
    into the next."""
    depth = 0
    in_string = False
    escaped = False
    for i in range(buf.shape[0]):
        c = buf[i]
        if lines and c == 10:
            depth = 0
            in_string = False
            escaped = False
        elif in_string:
            if escaped:
                escaped = False
            elif c == 92:
                escaped = True
            elif c == 34:
                in_string = False
        elif c == 34:
            in_string = True
        elif c == 91 or c == 123:
            depth += 1
            if depth > limit:
                return i
        elif c == 93 or c == 125:
            depth -= 1
    return -1


def too_deep(data: bytes, lines: bool = False) -> int:
    """Offset in `data` (JSON text, or JSON lines: `lines`) of the first bracket nesting deeper than MAX_DEPTH, or
    -1: a string holding JSON (a tool call's) is bounded as a file is, before it is parsed."""
    return int(_too_deep(np.frombuffer(data, np.uint8), MAX_DEPTH, lines))


def check_depth(data: bytes, path: str, line_numbers: list[int] | None = None, first_row: int = 0) -> None:
    """Refuse `data` where it nests deeper than MAX_DEPTH, naming the file and line: a JSON document, or JSON
    lines (one row each, the first being row `first_row`) whose file line numbers are `line_numbers`."""
    at = too_deep(data, line_numbers is not None)
    if at < 0:
        return
    k = data.count(b"\n", 0, at)
    where = f"row {first_row + k} (line {line_numbers[k]})" if line_numbers is not None else f"line {k + 1}"
    column = at - data.rfind(b"\n", 0, at)
    raise InputError(f"{path} {where} column {column}: JSON nested deeper than {MAX_DEPTH} levels; plancc reads "
                     "values nested at most that deep")


def rows_to_columns(rows: list[Any], path: str, what) -> Block:
    """Parsed JSON rows as Arrow columns, a column Arrow cannot type kept loose; `what(i)` names row i in errors."""
    names: dict[str, None] = {}
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise InputError(f"{path} {what(i)}: expected a JSON object, got {type(row).__name__}")
        for k in row:
            names.setdefault(k, None)
    arrays, loose = {}, {}
    for name in names:
        values = [row.get(name) for row in rows]
        try:
            arrays[name] = pa.array(values)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
            loose[name] = values
    table = pa.table(arrays) if arrays else pa.table({"__row": pa.nulls(len(rows))}).drop(["__row"])
    return table, loose


class JsonlRows:
    """A JSON lines file read forward by row range (rows are its non-blank lines); a range behind the cursor
    reopens the file. Arrow parses a range; where it refuses (malformed or mixed-type values), orjson re-reads it
    line by line, naming the bad line and keeping mixed-type columns loose."""

    def __init__(self, path: str):
        self.path, self.f, self.row, self.lineno = path, None, 0, 0

    def _skip_to(self, a: int) -> None:
        if self.f is None or a < self.row:
            self.close()
            self.f, self.row, self.lineno = open(self.path, "rb"), 0, 0  # noqa: SIM115 (held across calls)
        while self.row < a and self._next_row() is not None:
            pass

    def _next_row(self) -> bytes | None:
        """The next non-blank line (one row), or None at the end of the file; counts lines and rows."""
        while line := self.f.readline():
            self.lineno += 1
            if line.strip():
                self.row += 1
                return line
        return None

    def read(self, a: int, b: int) -> Block:
        """Rows [a, b) of the file and their line numbers (a range behind the cursor reopens the file)."""
        self._skip_to(a)
        first, lines, numbers = self.row, [], []
        while self.row < b and (line := self._next_row()) is not None:
            lines.append(line if line.endswith(b"\n") else line + b"\n")
            numbers.append(self.lineno)
        data = b"".join(lines)
        check_depth(data, self.path, numbers, first)  # before Arrow, which crashes on deep nesting
        try:
            table = pajson.read_json(pa.BufferReader(data),
                                     read_options=pajson.ReadOptions(block_size=1 << 26))
            if table.num_rows == len(lines):
                return table, {}
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
            pass
        rows = []
        for line, lineno in zip(lines, numbers, strict=True):
            try:
                rows.append(orjson.loads(line))
            except orjson.JSONDecodeError as exc:
                raise InputError(f"{self.path} line {lineno}: malformed JSON ({exc.msg})") from None
        return rows_to_columns(rows, self.path, lambda i: f"line {numbers[i]}")

    def count(self) -> int:
        """Rows in the file: its non-blank lines (counted apart from the cursor)."""
        with open(self.path, "rb") as f:
            return sum(1 for ln in f if ln.strip())

    def close(self) -> None:
        """Close the file."""
        if self.f is not None:
            self.f.close()
            self.f = None


def read_jsonl(path: str) -> Block:
    """A whole JSON lines file."""
    rows = JsonlRows(path)
    try:
        return rows.read(0, sys.maxsize)
    finally:
        rows.close()


def _document_rows(path: str) -> list[Any] | None:
    """The rows of a whole `.json` file as orjson reads them: a list of objects, an object of equal-length columns,
    or one object; None when the file holds JSON lines."""
    data = Path(path).read_bytes()
    head = data.lstrip()[:1]
    check_depth(data, path)
    if head == b"[":
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            raise InputError(f"{path} line {exc.lineno} column {exc.colno}: malformed JSON ({exc.msg})") from None
    if head == b"{":
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError:
            return None  # JSON lines in a .json file
        if isinstance(obj, dict) and obj and all(isinstance(v, list) for v in obj.values()):
            if len({len(v) for v in obj.values()}) != 1:
                raise InputError(f"{path}: columns of the JSON object have different lengths")
            return [{k: v[i] for k, v in obj.items()} for i in range(len(next(iter(obj.values()))))]
        return [obj]
    if not head:
        return []
    raise InputError(f"{path} line 1: malformed JSON (expected a list of objects or JSON lines)")


def read_json(path: str) -> Block:
    """A whole `.json` file: a list of objects, an object of equal-length columns, one object, or JSON lines."""
    rows = _document_rows(path)
    if rows is None:
        return read_jsonl(path)
    return rows_to_columns(rows, path, lambda i: f"row {i}")


def parsed_rows(path: str, first: int, count: int) -> Iterator[Any]:
    """Rows [first, first + count) of a `.json` or `.jsonl` file parsed again, one by one, by orjson, which keeps
    an integer an integer where Arrow types a column of integers and one float as floats: what an error names the
    row by."""
    rows = None if Path(path).suffix.lower() == ".jsonl" else _document_rows(path)
    if rows is not None:
        yield from rows[first:first + count]
        return
    with open(path, "rb") as f:
        k = 0
        for line in f:
            if not line.strip():
                continue
            if k >= first + count:
                return
            if k >= first:
                yield orjson.loads(line)
            k += 1

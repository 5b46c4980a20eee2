"""A source's columns: renamed onto format roles (`--columns`), and checked as the type a format reads, naming
the first bad row (file, row, line), column and what was expected."""

from __future__ import annotations

import dataclasses
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from plancc.errors import InputError, clip
from plancc.scan.sources.read import Source


def map_columns(src: Source, columns: tuple[tuple[str, str], ...]) -> Source:
    """Rename source fields onto format roles (`--columns role=field`); a role's own column, if any, gives way."""
    if not columns:
        return src
    names = src.column_names
    for role, field in columns:
        if field not in names:
            raise InputError(f"{src.paths[0] if src.paths else 'source'}: --columns {role}={field}: no column "
                             f"{field!r} (columns: {clip(', '.join(names), 200)})")
    rename = {field: role for role, field in columns}
    roles = set(rename.values())
    table = src.table.drop([c for c in src.table.column_names if c in roles and c not in rename])
    table = table.rename_columns([rename.get(c, c) for c in table.column_names])
    loose = {rename.get(k, k): v for k, v in src.loose.items() if not (k in roles and k not in rename)}
    return dataclasses.replace(src, table=table, loose=loose, renamed={**src.renamed, **dict(columns)})


def column_values(src: Source, name: str) -> list[Any]:
    """A column's values as Python objects (a mixed-type one is kept so already)."""
    if name in src.loose:
        return src.loose[name]
    try:
        return src.table.column(name).to_pylist()
    except UnicodeDecodeError:
        valid_strings(src, name, src.table.column(name))
        raise


def missing(src: Source, fmt: str, name: str) -> InputError:
    """The error for column `name` that format `fmt` needs and `src` lacks."""
    return InputError(f"{src.paths[0] if src.paths else 'source'}: missing column '{name}' needed by format "
                      f"{fmt} (columns: {clip(', '.join(src.column_names), 200)}; map one with --columns "
                      f"{name}=FIELD)")


def first_null(src: Source, name: str, arr: pa.ChunkedArray, expected: str) -> None:
    """Refuse a null in column `name`, naming its first row."""
    if arr.null_count:
        i = pc.index(pc.is_null(arr), True).as_py()
        raise InputError(f"{src.where(i)}: column '{name}' is missing a value (null), expected {expected}")


def valid_strings(src: Source, name: str, arr: pa.ChunkedArray) -> None:
    """Strings must be UTF-8: Parquet and Arrow files may hold any bytes in a string column, which fail only when
    a row is turned into Python text, far from its file. Names the first bad row."""
    start = 0
    for chunk in arr.chunks:
        try:
            chunk.validate(full=True)
        except pa.ArrowInvalid:
            bad = next((i for i in range(len(chunk)) if not _decodes(chunk[i])), 0)
            raise InputError(f"{src.where(start + bad)}: column '{name}' holds text that is not valid UTF-8") from None
        start += len(chunk)


def _decodes(value: pa.Scalar) -> bool:
    try:
        value.as_py()
    except UnicodeDecodeError:
        return False
    return True


def _loose_check(src: Source, name: str, values: list[Any], ok, expected: str) -> None:
    for i, v in enumerate(values):
        if not ok(v):
            raise InputError(f"{src.where(i)}: column '{name}' has {_what(v)}, expected {expected}")
    raise InputError(f"{src.paths[0]}: column '{name}' has values of mixed types, expected {expected}")


def _what(v: Any) -> str:
    """A wrong value for a message: its type, and for a list its first element that is not an integer."""
    if isinstance(v, list):
        bad = next(((k, x) for k, x in enumerate(v) if not isinstance(x, int) or isinstance(x, bool)), None)
        if bad is not None:
            return f"a list holding {type(bad[1]).__name__} {clip(repr(bad[1]), 40)} at position {bad[0]}"
    return f"{type(v).__name__} value"


def _is_int_list(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in v)


def string_column(src: Source, name: str, *, allow_null: bool = False) -> pa.ChunkedArray:
    """Column `name` checked as UTF-8 strings without nulls (`allow_null`: a null, or a column of nulls, is "")."""
    if name in src.loose:
        values = src.loose[name]
        _loose_check(src, name, values, lambda v: isinstance(v, str) or (allow_null and v is None), "a string")
    arr = src.table.column(name)
    if pa.types.is_null(arr.type) and allow_null:
        return pa.chunked_array([pa.array([""] * len(arr), pa.large_string())])
    if not (pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type)):
        valid = pc.is_valid(arr)
        i = pc.index(valid, True).as_py() if arr.null_count < len(arr) else 0
        raise InputError(f"{src.where(max(i, 0))}: column '{name}' has type {clip(arr.type)}, expected string")
    valid_strings(src, name, arr)
    if allow_null:
        return pc.fill_null(arr, "")
    first_null(src, name, arr, "a string")
    return arr


def _first_float(src: Source, name: str, arr: pa.ChunkedArray) -> None:
    """Name the first row of a list column holding a float: Arrow reads a JSON column holding one `1.5`, `2.0` or
    `99999999999999999999` as floats in every row, so the column's first row is not the one to blame. A JSON
    file's text says which row wrote a float; another file's column says which value is not a whole number."""
    def bad(values: Any, whole: bool) -> int | None:
        return next((k for k, x in enumerate(values) if isinstance(x, float) and not (whole and x.is_integer())),
                    None) if isinstance(values, list) else None

    for rows, whole in ((src.json_values(name), False), (enumerate(arr.to_pylist()), True)):
        for i, values in rows:
            k = bad(values, whole)
            if k is not None:
                raise InputError(f"{src.where(i)}: column '{name}' has a list holding float "
                                 f"{clip(repr(values[k]), 40)} at position {k}, expected a list of integers")


def int_list_column(src: Source, name: str) -> pa.ChunkedArray:
    """Column `name` checked as lists of integers without nulls."""
    if name in src.loose:
        _loose_check(src, name, src.loose[name], _is_int_list, "a list of integers")
    arr = src.table.column(name)
    t = arr.type
    is_list = pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)
    if not (is_list and (pa.types.is_integer(t.value_type) or pa.types.is_null(t.value_type))):
        if is_list and pa.types.is_floating(t.value_type):
            _first_float(src, name, arr)
        valid = pc.is_valid(arr)
        i = pc.index(valid, True).as_py() if arr.null_count < len(arr) else 0
        raise InputError(f"{src.where(max(i, 0))}: column '{name}' has type {clip(t)}, expected a list of integers")
    first_null(src, name, arr, "a list of integers")
    return arr


def require(src: Source, fmt: str, names: tuple[str, ...]) -> None:
    """Every column of `names` is in `src`, else an error naming the first missing one."""
    for name in names:
        if name not in src.column_names:
            raise missing(src, fmt, name)

"""Pick the source format from its columns and check the columns that format needs, naming the first bad row.

Detection order (first match wins): `input_ids` → tokenized; `messages`/`conversations` → messages;
`instruction`+`output` → alpaca; `prompt`+`completion` → prompt_completion; `text` → text.
The result is a table with canonical column names and types, so encoders never see user spellings.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from plancc.errors import InputError, clip
from plancc.sources.read import Source

REQUIRED = {
    "tokenized": ("input_ids",),
    "prompt_completion": ("prompt", "completion"),
    "alpaca": ("instruction", "output"),
    "text": ("text",),
}


def detect_format(src: Source) -> str:
    """The format a source's columns imply (SPEC 2): tokenized, chat, alpaca, prompt_completion or text."""
    cols = set(src.column_names)
    if "input_ids" in cols:
        return "tokenized"
    if "messages" in cols or "conversations" in cols:
        return "messages"
    if {"instruction", "output"} <= cols:
        return "alpaca"
    if {"prompt", "completion"} <= cols:
        return "prompt_completion"
    if "text" in cols:
        return "text"
    raise InputError(
        f"{src.paths[0] if src.paths else 'source'}: cannot tell the format from columns "
        f"{clip(sorted(cols), 200)}; expected input_ids, messages/conversations, instruction+input+output, "
        "prompt+completion or text: map yours with --columns (e.g. --columns prompt=question,completion=answer) "
        "and/or pass --format"
    )


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
    return dataclasses.replace(src, table=table, loose=loose)


def _missing(src: Source, fmt: str, name: str) -> InputError:
    return InputError(f"{src.paths[0] if src.paths else 'source'}: missing column '{name}' needed by format "
                      f"{fmt} (columns: {clip(', '.join(src.column_names), 200)}; map one with --columns "
                      f"{name}=FIELD)")


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


def _first_null(src: Source, name: str, arr: pa.ChunkedArray, expected: str) -> None:
    if arr.null_count:
        i = pc.index(pc.is_null(arr), True).as_py()
        raise InputError(f"{src.where(i)}: column '{name}' is missing a value (null), expected {expected}")


def _valid_strings(src: Source, name: str, arr: pa.ChunkedArray) -> None:
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


def _string_column(src: Source, name: str, *, allow_null: bool = False) -> pa.ChunkedArray:
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
    _valid_strings(src, name, arr)
    if allow_null:
        return pc.fill_null(arr, "")
    _first_null(src, name, arr, "a string")
    return arr


def _first_fraction(src: Source, name: str, arr: pa.ChunkedArray) -> None:
    """Name the first value of a list column that is not a whole number: Arrow reads a JSON column holding one
    `1.5` as floats in every row, so the column's first row is not the one to blame."""
    for i, values in enumerate(arr.to_pylist()):
        k = next((k for k, x in enumerate(values or ()) if x is not None and not float(x).is_integer()), None)
        if k is not None:
            raise InputError(f"{src.where(i)}: column '{name}' has a list holding float {clip(repr(values[k]), 40)} "
                             f"at position {k}, expected a list of integers")


def _int_list_column(src: Source, name: str) -> pa.ChunkedArray:
    if name in src.loose:
        _loose_check(src, name, src.loose[name], _is_int_list, "a list of integers")
    arr = src.table.column(name)
    t = arr.type
    is_list = pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)
    if not (is_list and (pa.types.is_integer(t.value_type) or pa.types.is_null(t.value_type))):
        if is_list and pa.types.is_floating(t.value_type):
            _first_fraction(src, name, arr)
        valid = pc.is_valid(arr)
        i = pc.index(valid, True).as_py() if arr.null_count < len(arr) else 0
        raise InputError(f"{src.where(max(i, 0))}: column '{name}' has type {clip(t)}, expected a list of integers")
    _first_null(src, name, arr, "a list of integers")
    return arr


def canonical(src: Source, fmt: str) -> pa.Table:
    """Checked input columns under canonical names for `fmt` (raises InputError naming file/row/column)."""
    cols = set(src.column_names)
    if fmt == "messages":
        name = "messages" if "messages" in cols else "conversations" if "conversations" in cols else None
        if name is None:
            raise _missing(src, fmt, "messages")
        if name in src.loose:
            from plancc.sources.chat import TemplateProblem, normalize

            normalized = []
            for i, v in enumerate(src.loose[name]):
                try:
                    normalized.append(normalize(v))
                except TemplateProblem as exc:
                    raise InputError(f"{src.where(i)}: column '{name}', {exc}") from None
            return pa.table({"messages": pa.array(normalized)})
        arr = src.table.column(name)
        if not (pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type)) or not (
            pa.types.is_struct(arr.type.value_type)
        ):
            raise InputError(f"{src.where(0)}: column '{name}' has type {clip(arr.type)}, expected a list of "
                             "{role, content} (or {from, value}) objects")
        fields = {f.name for f in arr.type.value_type}
        if not ({"role", "content"} <= fields or {"from", "value"} <= fields):
            raise InputError(f"{src.where(0)}: column '{name}' messages have fields {clip(sorted(fields))}, expected "
                             "role+content or from+value")
        _first_null(src, name, arr, "a list of messages")
        _valid_strings(src, name, arr)
        return pa.table({"messages": arr})
    if fmt == "tokenized":
        for name in REQUIRED[fmt]:
            if name not in cols:
                raise _missing(src, fmt, name)
        out = {"input_ids": _int_list_column(src, "input_ids")}
        for name in ("labels", "shift_labels"):
            if name in cols:
                out[name] = _int_list_column(src, name)
        return pa.table(out)
    for name in REQUIRED[fmt]:
        if name not in cols:
            raise _missing(src, fmt, name)
    out = {name: _string_column(src, name) for name in REQUIRED[fmt]}
    if fmt == "alpaca":
        out["input"] = (_string_column(src, "input", allow_null=True) if "input" in cols
                        else pa.array([""] * src.num_rows, pa.string()))
    return pa.table(out)

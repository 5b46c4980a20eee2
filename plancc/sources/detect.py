"""Pick the source format from its columns and check the columns that format needs, naming the first bad row.

Detection order (first match wins): `input_ids` → tokenized; `messages`/`conversations` → messages;
`instruction`+`output` → alpaca; `prompt`+`completion` → prompt_completion; `text` → text.
The result is a table with canonical column names and types, so encoders never see user spellings.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from plancc.errors import InputError
from plancc.sources.read import Source

REQUIRED = {
    "tokenized": ("input_ids",),
    "prompt_completion": ("prompt", "completion"),
    "alpaca": ("instruction", "output"),
    "text": ("text",),
}


def detect_format(src: Source) -> str:
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
        f"{sorted(cols)}; expected input_ids, messages/conversations, instruction+input+output, "
        "prompt+completion or text (or pass --format)"
    )


def _missing(src: Source, fmt: str, name: str) -> InputError:
    return InputError(f"{src.paths[0] if src.paths else 'source'}: missing column '{name}' needed by format "
                      f"{fmt} (columns: {', '.join(src.column_names)})")


def _loose_check(src: Source, name: str, values: list[Any], ok, expected: str) -> None:
    for i, v in enumerate(values):
        if not ok(v):
            raise InputError(f"{src.where(i)}: column '{name}' has {type(v).__name__} value, expected {expected}")
    raise InputError(f"{src.paths[0]}: column '{name}' has values of mixed types, expected {expected}")


def _is_int_list(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in v)


def _first_null(src: Source, name: str, arr: pa.ChunkedArray, expected: str) -> None:
    if arr.null_count:
        i = pc.index(pc.is_null(arr), True).as_py()
        raise InputError(f"{src.where(i)}: column '{name}' is missing a value (null), expected {expected}")


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
        raise InputError(f"{src.where(max(i, 0))}: column '{name}' has type {arr.type}, expected string")
    if allow_null:
        return pc.fill_null(arr, "")
    _first_null(src, name, arr, "a string")
    return arr


def _int_list_column(src: Source, name: str) -> pa.ChunkedArray:
    if name in src.loose:
        _loose_check(src, name, src.loose[name], _is_int_list, "a list of integers")
    arr = src.table.column(name)
    t = arr.type
    if not ((pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t))
            and (pa.types.is_integer(t.value_type) or pa.types.is_null(t.value_type))):
        valid = pc.is_valid(arr)
        i = pc.index(valid, True).as_py() if arr.null_count < len(arr) else 0
        raise InputError(f"{src.where(max(i, 0))}: column '{name}' has type {t}, expected a list of integers")
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
                    raise InputError(f"{src.where(i)}: column '{name}': {exc}") from None
            return pa.table({"messages": pa.array(normalized)})
        arr = src.table.column(name)
        if not (pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type)) or not (
            pa.types.is_struct(arr.type.value_type)
        ):
            raise InputError(f"{src.where(0)}: column '{name}' has type {arr.type}, expected a list of "
                             "{role, content} (or {from, value}) objects")
        fields = {f.name for f in arr.type.value_type}
        if not ({"role", "content"} <= fields or {"from", "value"} <= fields):
            raise InputError(f"{src.where(0)}: column '{name}' messages have fields {sorted(fields)}, expected "
                             "role+content or from+value")
        _first_null(src, name, arr, "a list of messages")
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

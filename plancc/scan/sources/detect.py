"""Pick the source format from its columns and check the columns that format needs, naming the first bad row.

Detection order (first match wins): `input_ids` → tokenized; `messages`/`conversations` → messages;
`instruction`+`output` → alpaca; `prompt`+`completion` → prompt_completion (messages when both are lists of
messages: TRL's conversational prompt/completion); `text` → text.
The result is a table with canonical column names and types, so encoders never see user spellings.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from plancc.config.fields import flag
from plancc.config.settings import ScanOptions
from plancc.errors import InputError, SettingsError, clip
from plancc.scan.sources.read import Source

REQUIRED = {
    "tokenized": ("input_ids",),
    "prompt_completion": ("prompt", "completion"),
    "alpaca": ("instruction", "output"),
    "text": ("text",),
}


def detect_format(src: Source) -> str:
    """The format a source's columns imply (docs/spec.md §2): tokenized, chat, alpaca, prompt_completion or text."""
    cols = set(src.column_names)
    if "input_ids" in cols:
        return "tokenized"
    if "messages" in cols or "conversations" in cols or _conversational(src):
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


PLAIN_MESSAGE = {"role", "content", "from", "value"}


def _conversations(src: Source, message_fields: tuple[tuple[str, str], ...]) -> pa.Table:
    """The `messages` column: a list of {role, content} structs read as Arrow when it is one, else every row
    normalized (`chat.normalize`: other field names, content parts, tool calls, TRL's conversational
    prompt + completion, whose prompt's assistant turns get `training` false)."""
    cols = set(src.column_names)
    name = "messages" if "messages" in cols else "conversations" if "conversations" in cols else None
    if name is None and not _conversational(src):
        raise _missing(src, "messages", "messages")
    if name is not None and name not in src.loose and not message_fields:
        arr = src.table.column(name)
        if not (pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type)) or not (
            pa.types.is_struct(arr.type.value_type)
        ):
            raise InputError(f"{src.where(0)}: column '{name}' has type {clip(arr.type)}, expected a list of "
                             "{role, content} (or {from, value}) objects")
        fields = {f.name: f.type for f in arr.type.value_type}
        if not ({"role", "content"} <= set(fields) or {"from", "value"} <= set(fields)):
            raise InputError(f"{src.where(0)}: column '{name}' messages have fields {clip(sorted(fields))}, expected "
                             "role+content or from+value")
        _first_null(src, name, arr, "a list of messages")
        if set(fields) <= PLAIN_MESSAGE and all(pa.types.is_string(t) or pa.types.is_large_string(t)
                                                  for t in fields.values()):
            _valid_strings(src, name, arr)
            return pa.table({"messages": arr})
    from plancc.scan.sources.chat import TemplateProblem, normalize

    rows = _values(src, name) if name is not None else zip(_values(src, "prompt"), _values(src, "completion"),
                                                             strict=True)
    normalized = []
    for i, value in enumerate(rows):
        try:
            if name is None:
                prompt = [{**m, "training": False} for m in normalize(value[0], message_fields)]
                turns = prompt + normalize(value[1], message_fields)
            else:
                turns = normalize(value, message_fields)
        except TemplateProblem as exc:
            raise InputError(f"{src.where(i)}: column '{name or 'prompt/completion'}', {exc}") from None
        normalized.append([{**m, "tool_calls": _calls_json(m["tool_calls"])} if "tool_calls" in m else m
                           for m in turns])
    return pa.table({"messages": pa.array(normalized)})


def _calls_json(calls: Any) -> str:
    """A message's tool calls as JSON text, so that Arrow does not give each call every other call's argument
    names; a null argument is dropped, since reading JSON lines into Arrow already gave each call every argument
    name of its file, as null."""
    def clean(call: Any) -> Any:
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict) and isinstance(function.get("arguments"), dict):
            arguments = {k: v for k, v in function["arguments"].items() if v is not None}
            return {**call, "function": {**function, "arguments": arguments}}
        return call

    return json.dumps([clean(c) for c in calls] if isinstance(calls, list) else calls)


def _values(src: Source, name: str) -> list[Any]:
    """A column's values as Python objects (a mixed-type one is kept so already)."""
    if name in src.loose:
        return src.loose[name]
    try:
        return src.table.column(name).to_pylist()
    except UnicodeDecodeError:
        _valid_strings(src, name, src.table.column(name))
        raise


def _conversational(src: Source) -> bool:
    """TRL's conversational prompt/completion: `prompt` and `completion` both lists of messages."""
    def is_list(name: str) -> bool:
        if name in src.loose:
            return any(isinstance(v, list) for v in src.loose[name])
        if name not in src.table.column_names:
            return False
        t = src.table.column(name).type
        return pa.types.is_list(t) or pa.types.is_large_list(t)

    return is_list("prompt") and is_list("completion")


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


def canonical(src: Source, fmt: str, message_fields: tuple[tuple[str, str], ...] = ()) -> pa.Table:
    """Checked input columns under canonical names for `fmt` (raises InputError naming file/row/column);
    `message_fields`: see `chat.normalize`."""
    cols = set(src.column_names)
    if fmt == "messages":
        return _conversations(src, message_fields)
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


APPLIES = {"prompt_format": "alpaca", "no_input_format": "alpaca", "separator": "prompt_completion",
           "message_fields": "messages"}  # the format each text-shaping setting is for


def check_shaping(fmt: str, options: ScanOptions) -> None:
    """A shaping setting given for a source of another format is an error naming it (it would do nothing)."""
    for name in options.shaping():
        if APPLIES[name] != fmt:
            raise SettingsError(f"{flag(name)} applies to format {APPLIES[name]}; this source is {fmt}", name)


def text_format(fmt: str, options: ScanOptions) -> dict[str, Any] | None:
    """What the scan report says about how a row's fields became the text tokenized (None: nothing to say)."""
    if fmt == "prompt_completion":
        return {"separator": options.separator}  # prompt, then completion, tokenized apart: nothing else between
    if fmt == "alpaca":
        return {"prompt_format": options.prompt_format or "alpaca (built-in)",
                "no_input_format": options.no_input_format or options.prompt_format or "alpaca (built-in)"}
    return None


def shape(table: pa.Table, fmt: str, options: ScanOptions) -> tuple[pa.Table, str]:
    """Canonical rows with the text-shaping settings applied, and the format to encode them as: alpaca with its
    own prompt formats becomes prompt_completion; a separator ends each prompt."""
    from plancc.scan.sources.encode import ALPACA_NO_INPUT, ALPACA_WITH_INPUT, alpaca_prompts

    if fmt == "alpaca" and (options.prompt_format or options.no_input_format):
        with_input = options.prompt_format or ALPACA_WITH_INPUT
        no_input = options.no_input_format or options.prompt_format or ALPACA_NO_INPUT
        prompts = pa.array(alpaca_prompts(table, with_input, no_input), pa.large_string())
        table, fmt = pa.table({"prompt": prompts, "completion": table.column("output")}), "prompt_completion"
    if fmt == "prompt_completion" and options.separator:
        prompts = pc.binary_join_element_wise(table.column("prompt"), options.separator, "")
        table = table.set_column(table.column_names.index("prompt"), "prompt", prompts)
    return table, fmt

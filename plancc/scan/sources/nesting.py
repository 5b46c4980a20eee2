"""Bound how deeply a JSON text nests before any parser sees it.

Parsers recurse per level: Arrow's JSON reader segfaults on a line nested 100,000 deep, and values a few hundred
deep overflow Python's recursion limit wherever they are printed or converted. No dataset row needs more than a
few levels, so a text nesting deeper than `MAX_DEPTH` is refused, naming its line, by one byte scan that skips
string contents (a `[` inside a string is text, not nesting).
"""

from __future__ import annotations

import numpy as np

from plancc.core.jit import numba
from plancc.errors import InputError

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


def check_depth(data: bytes, path: str, line_numbers: list[int] | None = None, first_row: int = 0) -> None:
    """Refuse `data` where it nests deeper than MAX_DEPTH, naming the file and line: a JSON document, or JSON
    lines (one row each, the first being row `first_row`) whose file line numbers are `line_numbers`."""
    at = int(_too_deep(np.frombuffer(data, np.uint8), MAX_DEPTH, line_numbers is not None))
    if at < 0:
        return
    k = data.count(b"\n", 0, at)
    where = f"row {first_row + k} (line {line_numbers[k]})" if line_numbers is not None else f"line {k + 1}"
    column = at - data.rfind(b"\n", 0, at)
    raise InputError(f"{path} {where} column {column}: JSON nested deeper than {MAX_DEPTH} levels; plancc reads "
                     "values nested at most that deep")

"""How plancc shows a number to a person (inspect tables, diff reports) and the one derived ratio both show.

One formatter, so a value reads the same in `inspect metrics` and in a CI diff comment: integers with thousands
separators, floats to 4 significant digits (whole numbers from 100,000 up), booleans as JSON spells them, a
missing value as `-`; `signed` adds the sign a delta needs.
"""

from __future__ import annotations

from typing import Any


def format_number(v: Any, *, signed: bool = False) -> str:
    """`v` as the read side prints it (see module docstring); anything else as `str`."""
    if v is None:
        return "-"
    if isinstance(v, bool):
        return str(v).lower()
    sign = "+" if signed else ""
    if isinstance(v, int):
        return f"{v:{sign},}"
    if isinstance(v, float):
        return f"{v:{sign}.4g}" if abs(v) < 1e5 else f"{v:{sign},.0f}"
    return str(v)


def padding_ratio(row: dict[str, Any]) -> float | None:
    """padding_tokens / total_batch_cost of a metrics row (0 for an empty plan; None when it lacks either)."""
    cost, pad = row.get("total_batch_cost"), row.get("padding_tokens")
    if cost is None or pad is None:
        return None
    return pad / cost if cost else 0.0

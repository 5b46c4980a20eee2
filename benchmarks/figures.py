"""How the benchmarks print a figure measured several times: min / median / max, never one draw."""

from __future__ import annotations

import statistics


def spread(values: list[float], fmt: str) -> str:
    """`min / median / max` of `values`, each formatted by the format spec `fmt` (e.g. ".3f")."""
    return " / ".join(format(v, fmt) for v in (min(values), statistics.median(values), max(values)))

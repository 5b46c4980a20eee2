"""What the benchmarks share: a figure measured several times printed as min / median / max (never one draw), and
what one child process cost."""

from __future__ import annotations

import os
import statistics
import subprocess
import time


def spread(values: list[float], fmt: str) -> str:
    """`min / median / max` of `values`, each formatted by the format spec `fmt` (e.g. ".3f")."""
    return " / ".join(format(v, fmt) for v in (min(values), statistics.median(values), max(values)))


def child_usage(cmd: list[str]) -> dict[str, float]:
    """Wall and CPU seconds and peak RSS (GiB) of one child process running `cmd` (exits if it fails)."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"failed ({os.waitstatus_to_exitcode(status)}): {' '.join(cmd)}")
    return {"wall": wall, "cpu": usage.ru_utime + usage.ru_stime, "rss": usage.ru_maxrss / 2**20}

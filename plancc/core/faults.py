"""Crash injection for the tests: one environment variable, one syntax, one function every crash point calls.

    PLANCC_FAULT=POINT[:SIGNAL][@KEY=VALUE[,KEY=VALUE...]]

`fault(POINT, **where)` sends this process SIGNAL (`kill`, the default; `int`, `term` or `stop`) when the variable
names POINT and every KEY=VALUE it lists equals what the caller passes (compared as text). The crash points:

| point | where | keys |
|---|---|---|
| `startup` | `python -m plancc`, before the CLI is imported | |
| `prepared` | a compile or scan, its work done, nothing written yet | |
| `written`, `synced`, `moved_old`, `swapped`, `cleanup` | the atomic directory replace (`plancc.store.atomic`) | |
| `parts_written` | a scan, after writing a shard into the cache | `parts` (new parts so far) |
| `tensors_temp`, `tensors_written`, `rank_saved`, ... | a checkpoint save (`plancc.runtime.checkpoint`) | `step`, `rank` |

E.g. `PLANCC_FAULT=written:stop`, `PLANCC_FAULT=parts_written@parts=3`,
`PLANCC_FAULT=tensors_written@step=4,rank=1`. Unset (as always outside the tests), `fault` is one dictionary lookup.
"""

from __future__ import annotations

import os
import signal

FAULT_ENV = "PLANCC_FAULT"
SIGNALS = {"kill": signal.SIGKILL, "int": signal.SIGINT, "term": signal.SIGTERM, "stop": signal.SIGSTOP}


def parse(spec: str) -> tuple[str, str, dict[str, str]]:
    """(point, signal name, conditions) of a `PLANCC_FAULT` value."""
    head, _, conditions = spec.partition("@")
    point, _, how = head.partition(":")
    where = dict(c.split("=", 1) for c in conditions.split(",") if "=" in c)
    return point, how or "kill", where


def fault(point: str, **where: object) -> None:
    """Send this process the signal `PLANCC_FAULT` asks for when it names `point` and its conditions hold `where`;
    a no-op otherwise (see the module docstring)."""
    spec = os.environ.get(FAULT_ENV)
    if not spec:
        return
    name, how, conditions = parse(spec)
    if name == point and all(str(where.get(k)) == v for k, v in conditions.items()):
        os.kill(os.getpid(), SIGNALS[how])

"""The scan on Ray (`plancc scan --engine ray`): Ray Data runs the scan's units of work on a cluster's (or this
machine's) cores; plancc plans the units and joins their results, so the scan is the same as a local one.

Ray is imported here only, and only when this engine runs. What crosses Ray is small: each unit is a row of
strings and integers (an Arrow block), each result likewise; token data never travels through Ray, workers
write it to files (the cluster's nodes must share the filesystem of the source, the tokenizer and the cache).
The task function is shipped by reference to its module, so every node needs plancc installed.

`address=None` starts a local Ray for the run and stops it after: loopback only (no cluster networking), no
dashboard, no usage reporting. `address="auto"` (or `ray://...`, `HOST:PORT`) joins an existing cluster; a
Ray already initialized in this process (a `ray job submit` entry point that called `ray.init`) is used as is.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterator
from typing import Any

from plancc.errors import PlanccError

Progress = Callable[[str, int, int], None] | None

# a local Ray for one run: no usage reporting, every address on loopback (read when ray is first imported)
_LOCAL_ENV = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}


def _import_ray():
    try:
        import ray
        import ray.data
    except ImportError:
        raise PlanccError("--engine ray needs Ray: pip install 'plancc[ray]' (or use --engine local)") from None
    return ray


@contextlib.contextmanager
def _env(values: dict[str, str]) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update({k: v for k, v in values.items() if saved[k] is None})  # the user's own settings win
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)


@contextlib.contextmanager
def session(address: str | None, num_cpus: int | None) -> Iterator[Any]:
    """The `ray` module, connected: to a local Ray started here (`num_cpus`: its CPUs, None all) and shut down
    after, to the cluster at `address`, or to the Ray this process already joined."""
    with _env(_LOCAL_ENV if address is None else {}):
        ray = _import_ray()
        if ray.is_initialized():
            yield ray
            return
        if address is not None and num_cpus is not None:
            raise PlanccError("--num-proc sets the CPUs of the local Ray plancc starts; a cluster given with "
                              "--ray-address has its own: drop --num-proc")
        try:
            ray.init(address=address, num_cpus=num_cpus, include_dashboard=False, log_to_driver=False,
                     logging_level=logging.ERROR)
        except ConnectionError as exc:
            raise PlanccError(f"--ray-address {address}: cannot connect to a Ray cluster ({exc}); start one "
                              "(`ray start --head`) or leave --ray-address out for a local Ray") from None
        try:
            context = ray.data.DataContext.get_current()
            context.enable_progress_bars = False  # plancc reports progress itself
            context.print_on_execution_start = False
            logging.getLogger("ray.data").setLevel(logging.ERROR)
            yield ray
        finally:
            ray.shutdown()


def map_units(ray: Any, units: list[dict[str, Any]], fn: Callable[[dict[str, Any]], dict[str, Any]], *,
              progress: Progress = None, rows: Callable[[dict[str, Any]], int] = lambda r: 0,
              total: int = 0) -> list[dict[str, Any]]:
    """Run `fn` on every unit with Ray Data, one CPU each; results in unit order.

    `fn` returns a row with `error` set ("" when it worked): an expected failure (bad input) comes back as data
    and the first failed unit's message is raised here as a PlanccError, so a bad row reads like the local
    scan's message and the same unit fails first however Ray scheduled them. `rows(result)`: source rows a
    result covers, for progress out of `total`.
    """
    ds = ray.data.from_items(units, override_num_blocks=len(units)).map(fn, num_cpus=1)
    results: list[dict[str, Any]] = []
    done = 0
    for result in ds.iter_rows():
        results.append(result)
        done += rows(result)
        if progress:
            progress("tokenizing", done, total)
    results.sort(key=lambda r: r["unit"])
    failed = [r for r in results if r["error"]]
    if failed:
        raise PlanccError(failed[0]["error"])
    return results

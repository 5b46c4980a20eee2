"""The scan on Ray (`plancc scan --engine ray`): Ray Data runs the scan's units of work on a cluster's (or this
machine's) cores; plancc plans the units and joins their results, so the scan is the same as a local one.

Ray is imported here only, and only when this engine runs. What crosses Ray is small: each unit is a row of
strings and integers (an Arrow block), each result likewise; token data never travels through Ray, workers
write it to files (the cluster's nodes must share the filesystem of the source, the tokenizer and the cache).
The task function is shipped by reference to its module, so every node needs plancc installed.

`address=None` starts a local Ray for the run (even where RAY_ADDRESS names a cluster) and stops it after:
loopback only (no cluster networking), no dashboard, no usage reporting. `address="auto"` (or `HOST:PORT`,
`ray://...`) joins an existing cluster; a Ray this process already initialized (a caller's `ray.init`) is used
as is.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson

from plancc.errors import InputError, PlanccError
from plancc.store import parquet, schemas

Progress = Callable[[str, int, int], None] | None

SHARD_ROWS = 16_384  # default rows per unit: several units per CPU at 100k rows (the local scan's 65,536 would
# give two CPUs one and a half units), few enough parts (a multi-part token store) at 10M
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
            local = {} if address else {"_node_ip_address": "127.0.0.1"}  # a local Ray listens on loopback only
            ray.init(address=address or "local", num_cpus=num_cpus, include_dashboard=False, log_to_driver=False,
                     logging_level=logging.ERROR, **local)
        except ConnectionError as exc:
            raise PlanccError(f"--ray-address {address}: cannot connect to a Ray cluster ({exc}); start one "
                              "(`ray start --head`) or leave --ray-address out for a local Ray") from None
        try:
            context = ray.data.DataContext.get_current()
            context.enable_progress_bars = False  # plancc reports progress itself
            context.print_on_execution_start = False
            logging.getLogger("ray.data").setLevel(logging.CRITICAL)  # a failure is our one line, not its traceback
            yield ray
        finally:
            ray.shutdown()


def _run_unit(unit: dict[str, Any]) -> dict[str, Any]:
    """One unit, on a Ray worker: `shard.scan_part` of its rows into its part directory. Bad input comes back as
    the row's `error`: plancc's message, not a Ray traceback."""
    from plancc.scan import shard
    from plancc.store import token_store

    os.environ.setdefault("RAYON_NUM_THREADS", "1")  # one CPU per unit: the tokenizer gets one thread
    lo, hi, path = int(unit["lo"]), int(unit["hi"]), Path(unit["part"])
    out = {"unit": unit["unit"], "lo": lo, "hi": hi, "tokens": 0, "error": "", "input": False}
    try:
        shard.scan_part(_job(unit["job"]), lo, hi, path, owned=True)
        out["tokens"] = int(token_store.open_store(path / schemas.TOKENS_DIR).header["tokens"])
    except PlanccError as exc:
        out["error"], out["input"] = str(exc), isinstance(exc, InputError)
    return out


@functools.lru_cache(maxsize=2)
def _job(path: str):
    """The scan job a worker runs units of, read once per worker process (units carry only its path)."""
    from plancc.scan import shard

    return shard.ScanJob.from_dict(orjson.loads(Path(path).read_bytes()))


def ray_engine(*, address: str | None = None, num_cpus: int | None = None, progress: Progress = None):
    """A `plancc.scan.scanner.Engine` that scans the shards still to do on Ray, one unit each. The job goes to the
    workers as a JSON file beside the parts: every node must see `work` (on a cluster the scan cache lives on a
    shared filesystem)."""
    from plancc.scan import shard

    def run(job, todo: list[tuple[int, int]], work: Path) -> None:
        if not todo:
            return
        work.mkdir(parents=True, exist_ok=True)
        job_file = work / "job.json"
        parquet.write_json(job.to_dict(), job_file)
        units = [{"unit": i, "lo": lo, "hi": hi, "part": str(work / shard.part_name(lo, hi)), "job": str(job_file)}
                 for i, (lo, hi) in enumerate(todo)]
        with session(address, num_cpus) as ray:
            map_units(ray, units, progress=progress, total=job.rows,
                      done=job.rows - sum(hi - lo for lo, hi in todo))

    return run


def map_units(ray: Any, units: list[dict[str, Any]], *, progress: Progress = None, total: int = 0,
              done: int = 0) -> list[dict[str, Any]]:
    """`_run_unit` of every unit with Ray Data, one CPU and one block each; results in unit order.

    Bad input comes back as data and the first failed unit's message is raised here, so a bad row reads like
    the local scan's message and the same unit fails first however Ray scheduled them; a failure of Ray itself
    (a worker killed, out of memory) is one line too. Progress: rows done (`done` before the first unit), out of
    `total`, and tokens per second.
    """
    # Ray Data retries a unit whose worker died forever by default, so one that kills its worker (out of memory)
    # would never end: two retries, then the error. `max_retries` has no named parameter in Ray 2.60-2.63 and
    # warns (pyproject caps ray below 2.64, which drops the catch-all).
    from ray.util.annotations import RayDeprecationWarning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RayDeprecationWarning)
        ds = ray.data.from_items(units, override_num_blocks=len(units)).map(_run_unit, num_cpus=1, max_retries=2)
    results: list[dict[str, Any]] = []
    tokens = 0
    started = time.perf_counter()
    try:
        for result in ds.iter_rows():
            results.append(result)
            done += result["hi"] - result["lo"]
            tokens += result["tokens"]
            if progress:
                rate = tokens / max(time.perf_counter() - started, 1e-9)
                progress(f"tokenizing · {rate:,.0f} tokens/s", done, total)
    except ray.exceptions.RayError as exc:
        last = [line for line in str(exc).splitlines() if line.strip()][-1:] or [type(exc).__name__]
        raise PlanccError(f"the scan on Ray failed: {last[0].strip()} (finished parts are kept: run the same "
                          "command again to resume)") from None
    results.sort(key=lambda r: r["unit"])
    failed = [r for r in results if r["error"]]
    if failed:
        raise (InputError if failed[0]["input"] else PlanccError)(failed[0]["error"])
    return results

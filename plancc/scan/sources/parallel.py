"""Encode rows in contiguous chunks, in this process or a spawned process pool, with identical results.

Each sample is encoded independently, so results do not depend on chunking; chunks are concatenated in row order.
Workers are spawned (never forked: the parent holds tokenizer and Arrow threads) and exchange data through Arrow IPC files in a temporary directory (the input table is written once and
memory-mapped by every worker; each worker writes its chunk's tokens), so no table is pickled between processes.
"""

from __future__ import annotations

import contextlib
import math
import multiprocessing as mp
import os
import tempfile
import warnings
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

import pyarrow as pa

from plancc.core.machine import address_room, mapped_bytes, usable_cpus
from plancc.errors import PlanccError, PlanccWarning, SettingsError
from plancc.scan import formats
from plancc.scan.formats import Encoded, Encoding, RowError, RowFormat
from plancc.scan.sources.tokenizer import BUILTIN, scan_tokenizer

Progress = Callable[[str, int, int], None] | None


def _chunk_size(n: int, num_proc: int) -> int:
    return int(min(8192, max(512, math.ceil(n / max(2, num_proc * 4)))))


def _init_worker(threads: int) -> None:
    os.environ["RAYON_NUM_THREADS"] = str(threads)
    os.environ["TOKENIZERS_PARALLELISM"] = "true"


def _work(args: tuple) -> tuple[str, int, str]:
    """Encode rows [a, b) of the memory-mapped input as format `name`, with the tokenizer `options` name; returns
    ("ok", a, out_path) or ("error", row, message)."""
    in_path, out_path, a, b, name, options, template = args
    with pa.memory_map(in_path) as source:
        table = pa.ipc.open_file(source).read_all().slice(a, b - a)
        try:
            how = Encoding(scan_tokenizer(options), options, template)
            enc = formats.get(name).encode(table, how, row0=a)
        except RowError as exc:
            return "error", exc.row, exc.message
    with pa.OSFile(out_path, "wb") as sink:
        out = enc.to_table()
        with pa.ipc.new_file(sink, out.schema) as writer:
            writer.write_table(out)
    return "ok", a, out_path


THREAD_ROOM = 128 << 20  # address space one thread takes in practice: its stack and its malloc arena (64 MiB)
# address space a tokenizer.json tokenizer needs beyond what plancc maps when a scan starts (~600 MiB): measured
# (2 CPUs, a 100k-token vocabulary, `ulimit -v` in 50 MiB steps, 3-4 runs each) 400-600 MiB sometimes aborted,
# 650 MiB and more never did
TOKENIZER_ROOM = 640 << 20


def bound_workers(num_proc: int, tokenizer: str | None = None) -> int:
    """Before a scan on this machine: the tokenizer processes to start, at most the CPUs (2 always allowed; each
    loads the tokenizer and holds its rows, so beyond the CPUs they only cost memory: 1,024 took the machine down;
    the result is the same for any count, so more are lowered with a warning, not refused); and under `ulimit -v`
    start no more threads than fit (the tokenizer's pool, where a thread that cannot start is a panic printed from
    native code, and Arrow's take one per CPU otherwise; a count the user set is kept), and refuse a limit that
    leaves a `tokenizer` file (not the built-in one) less than `TOKENIZER_ROOM`: below it the tokenizer's failed
    allocations abort the process, or deadlock it, in native code that plancc cannot catch."""
    most = max(2, usable_cpus())
    if num_proc > most:
        warnings.warn(f"--num-proc {num_proc}: this process may run on {usable_cpus()} CPUs, and tokenizer processes "
                      f"beyond them only cost memory (each loads the tokenizer); using {most}", PlanccWarning,
                      stacklevel=2)
        num_proc = most
    room = address_room()
    if room is not None and tokenizer not in (None, BUILTIN) and room < TOKENIZER_ROOM:
        mapped = mapped_bytes() or 0
        raise SettingsError(f"`ulimit -v` leaves {room >> 20:,} MiB of address space beyond the {mapped >> 20:,} MiB "
                            f"plancc maps; tokenizing with {tokenizer} needs at least {TOKENIZER_ROOM >> 20} MiB more "
                            "(below that the tokenizer's failed allocations abort or hang the process): raise it to "
                            f"at least {(mapped + TOKENIZER_ROOM) >> 20:,} MiB (`ulimit -v "
                            f"{(mapped + TOKENIZER_ROOM) >> 10}`)")
    if room is not None:
        threads = max(1, min(usable_cpus(), room // THREAD_ROOM))
        os.environ.setdefault("RAYON_NUM_THREADS", str(threads))
        pa.set_cpu_count(min(pa.cpu_count(), threads))
        pa.set_io_thread_count(min(pa.io_thread_count(), threads))
    return num_proc


@contextlib.contextmanager
def workers(num_proc: int) -> Iterator[ProcessPoolExecutor | None]:
    """The tokenizer processes of a scan (None for `num_proc` 1), started once and shared by all its shards."""
    if num_proc <= 1:
        yield None
        return
    threads = max(1, (os.cpu_count() or 1) // num_proc)
    tempfile.gettempdir()  # found now, before the pool takes descriptors: its probe reports EMFILE as "no usable dir"
    pool = ProcessPoolExecutor(num_proc, mp_context=mp.get_context("spawn"), initializer=_init_worker,
                               initargs=(threads,))
    try:
        yield pool
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def encode_rows(work: pa.Table, fmt: RowFormat, how: Encoding, *, num_proc: int = 1, progress: Progress = None,
                pool: ProcessPoolExecutor | None = None) -> Encoded:
    """Encode all rows of a canonical table as `fmt` does with `how`; raises RowError for a row that cannot be
    rendered. `pool` (from `workers`) encodes in its processes (each loading the tokenizer `how.options` name);
    else `num_proc > 1` starts one for this call."""
    if pool is None and num_proc > 1:
        with workers(num_proc) as own:
            return encode_rows(work, fmt, how, num_proc=num_proc, progress=progress, pool=own)
    n = work.num_rows
    size = _chunk_size(n, num_proc if pool is not None else 1)
    bounds = [(a, min(n, a + size)) for a in range(0, n, size)]
    parts: list[Encoded] = []
    if pool is None or len(bounds) == 1:
        # Two threads: the tokenizer releases the GIL while encoding, so one chunk's Python-side work (rendering,
        # reading ids) overlaps the next chunk's encoding. Results are collected in row order.
        with ThreadPoolExecutor(2) as threads:
            chunks = threads.map(lambda ab: fmt.encode(work.slice(ab[0], ab[1] - ab[0]), how, row0=ab[0]), bounds)
            for (_, b), enc in zip(bounds, chunks, strict=True):
                parts.append(enc)
                if progress:
                    progress("tokenizing", b, n)
        return Encoded.concat(parts) if parts else Encoded.empty()
    with tempfile.TemporaryDirectory(prefix="plancc-scan-") as tmp:
        in_path = str(Path(tmp) / "input.arrow")
        with pa.OSFile(in_path, "wb") as sink, pa.ipc.new_file(sink, work.schema) as writer:
            writer.write_table(work)
        jobs = [(in_path, str(Path(tmp) / f"out-{a}.arrow"), a, b, fmt.name, how.options, how.template)
                for a, b in bounds]
        try:
            for status, where, payload in pool.map(_work, jobs):
                if status == "error":
                    raise RowError(where, payload)
                with pa.memory_map(payload) as source:
                    parts.append(Encoded.from_table(pa.ipc.open_file(source).read_all()))
                if progress:
                    progress("tokenizing", bounds[len(parts) - 1][1], n)
        except BrokenProcessPool:
            raise PlanccError(
                "tokenizer worker processes died (out of memory, or a script calling plancc.scan.scanner with "
                "num_proc > 1 without an `if __name__ == '__main__':` guard); retry with --num-proc 1"
            ) from None
    return Encoded.concat(parts)

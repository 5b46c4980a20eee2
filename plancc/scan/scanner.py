"""The scan: SOURCE → samples table (+ token store), streamed in shards, cached by (source content, tokenizer,
chat template, scan options), resumable.

    identity (tokenizer, template, location) → cache key → cache hit? done
    prepare (plancc.scan.shard: manifest of (file, rows), format from the first rows) → for each shard of
    `shard_rows` rows: reuse its finished part, or read its rows → encode (sources.parallel) → long policy,
    counts, hashes (sources.samples) → part directory → join the parts (plancc.scan.merge) → drop check
    (--max-dropped) → cache directory {samples.parquet, tokens/, scan.json}, written atomically

Memory follows one shard, not the source: rows are read a shard at a time (`sources.rows`), each shard's tokens
go to disk as it finishes, and what stays is the samples table (25 bytes a sample). A scan killed part way leaves
its finished parts in the cache (`scans/KEY.parts/`); the same scan run again (same source content, options and
`shard_rows`) reuses them and scans only the rest. The joined scan is what `plancc merge` makes of the same
parts, so a local scan, `--shard I/N` parts merged, and any engine running `plancc.scan.shard.scan_part` give the same
samples table, byte for byte.

A scan whose drops exceed `--max-dropped` writes nothing, not even its cache entry (its parts are removed); the
check also runs on every cache hit, so a threshold lowered later is never bypassed. The report (`scan.json`)
counts every dropped and truncated sample and names the tokenizer and chat template with their fingerprints;
`warnings` holds the lines a user must see (drops, template markers that are not single tokens, the split a
dataset dict was read with).

The token store (`plancc.store.token_store`) has one row per SOURCE row in source order, so `sample_id` is the row the
trainer loads; dropped rows stay in it (they are simply absent from the samples table). Under `--shift none` its
`labels` hold already-shifted labels (report `labels_shifted`). It is written for every format, an
already-tokenized source included (converted once: the runtime then maps it instead of parsing the user's files,
and a plan no longer depends on where they live). A scan of one shard has a single store; of several, a
multi-part store of the shards' stores (hard links, no copy).

`num_proc > 1` spawns worker processes (once per scan, shared by its shards): a script calling `scan` that way
needs an `if __name__ == "__main__":` guard (the `plancc` command has one).
"""

from __future__ import annotations

import dataclasses
import errno
import shutil
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from plancc.config.settings import ScanOptions
from plancc.core.faults import fault
from plancc.core.paths import cache_path
from plancc.errors import InputError, PlanccError, descriptors_hint, out_of_descriptors, out_of_memory
from plancc.scan import merge, shard
from plancc.scan.sources.parallel import bound_workers, workers
from plancc.scan.sources.rows import RowReader
from plancc.scan.sources.samples import check_drops
from plancc.scan.sources.tokenizer import spec_of
from plancc.store import atomic, outputs, schemas, token_store, token_writer
from plancc.store.scan_record import ScanRecord
from plancc.store.scan_store import ScanDir

SCAN_VERSION = shard.SCAN_VERSION
Progress = Callable[[str, int, int], None] | None


@dataclass(frozen=True)
class Scan:
    """A finished scan: the samples table, where its token store is, the source files and the scan report."""

    samples: pa.Table
    tokenized_path: Path | None  # the token store directory (None: a samples table without tokens)
    source_paths: list[str]
    report: ScanRecord
    key: str


def _load_cached(path: Path, key: str) -> Scan | None:
    """The cache entry at `path` when it is whole and of this key; None (recomputed, not trusted) when it is
    absent, damaged, edited or another scan's."""
    try:
        entry = ScanDir.open(path)
        if entry.record.key != key or entry.tokens is None:
            return None
        samples = entry.samples()
    except (PlanccError, token_store.TokenStoreError):
        return None
    return Scan(samples, entry.tokens, list(entry.record.source_paths), entry.record, key)


def _current_paths(loc, cached: list[str]) -> list[str]:
    if loc.kind == "files":
        return list(loc.paths)
    if loc.kind == "directory":
        names = [Path(p).name for p in cached]
        found = [str(Path(loc.paths[0]) / n) for n in names]
        if all(Path(f).is_file() for f in found):
            return found
        return sorted(str(p) for p in Path(loc.paths[0]).rglob("*.arrow"))
    return cached


Engine = Callable[[shard.ScanJob, list[tuple[int, int]], Path], None]
"""Runs shards: `engine(job, todo, work)` leaves a finished part (`shard.scan_part(job, lo, hi, work /
shard.part_name(lo, hi), owned=True)`) for each range of `todo`; the scan reuses the others' and joins them."""


def local_engine(reader: RowReader, *, num_proc: int = 1, progress: Progress = None) -> Engine:
    """Shards one after another in this process (`num_proc` tokenizer processes shared by all of them), reading
    the source forward with one reader; progress in rows with the tokens/s so far."""

    def run(job: shard.ScanJob, todo: list[tuple[int, int]], work: Path) -> None:
        tokens, started = 0, time.perf_counter()
        with workers(num_proc) as pool:
            for written, (lo, hi) in enumerate(todo, 1):
                path = work / shard.part_name(lo, hi)
                single = progress if len(todo) == 1 else None  # one shard: its own row-by-row progress
                shard.scan_part(job, lo, hi, path, reader=reader, num_proc=num_proc, pool=pool, progress=single,
                                owned=True)
                fault("parts_written", parts=written)
                if progress and len(todo) > 1:
                    tokens += token_store.open_store(path / schemas.TOKENS_DIR).header["tokens"]
                    rate = tokens / max(time.perf_counter() - started, 1e-9)
                    progress(f"tokenizing · {rate:,.0f} tokens/s", hi, job.rows)

    return run


def scan(source: str, options: ScanOptions, *, num_proc: int = 1, cache_dir: Path | None = None,
         progress: Progress = None, shard_rows: int = shard.SHARD_ROWS, engine: Engine | None = None) -> Scan:
    """Tokenize and scan SOURCE (or reuse the cached scan with the same key, or the finished shards of an
    interrupted one); `engine` runs the shards still to do (default: `local_engine`)."""
    started = time.perf_counter()
    if isinstance(num_proc, bool) or not isinstance(num_proc, int) or num_proc <= 0:
        raise InputError(f"--num-proc must be a positive integer, got {num_proc!r}")
    if engine is None:  # processes of this machine (Ray counts its own)
        num_proc = bound_workers(num_proc, options.tokenizer)
    shard.local_ranges(1, shard_rows)  # a bad --shard-rows is named before any work
    ident = shard.identity(source, options)
    tok, template, loc = ident
    if progress:
        progress("reading", 0, 1)
    reader = RowReader(loc, options.split) if loc.fingerprint is None else None
    source_fp = loc.fingerprint or reader.fingerprint
    key = shard.scan_key(source_fp, shard.recorded_options(options, tok, template))
    entry = cache_path(cache_dir, "scans", key)
    cached = _load_cached(entry, key)
    if cached is not None:
        if progress:
            progress("reading", 1, 1)
        # same content may now live elsewhere: point at the files of this call, not of the cached one
        paths = reader.paths if reader is not None else _current_paths(loc, cached.source_paths)
        report = cached.report.but(source=str(source), source_paths=tuple(paths),
                                   tokenizer=tok.name if tok else None)  # this call's tokenizer path, as the source
        check_drops(report, options.max_dropped)
        return dataclasses.replace(cached, source_paths=paths, report=report)
    job = shard.prepare(str(source), options, reader=reader, ident=ident)
    reader = reader or job.reader()
    if progress:
        progress("reading", 1, 1)
    try:
        with atomic.exclusive(entry.parent, f"{key}.scan"):  # a second scan of the same key waits, then reuses
            done = _load_cached(entry, key)
            if done is None:
                entry = _fill(entry, job, reader, shard_rows=shard_rows, num_proc=num_proc, progress=progress,
                              started=started, engine=engine)
                done = _load_cached(entry, key)
    except OSError as exc:
        if out_of_memory(exc):  # ENOMEM: the CLI says out of memory, and where
            raise
        raise _system_error(exc, entry.parent) from None
    finally:
        reader.close()
    report = done.report.but(source=str(source), tokenizer=tok.name if tok else None)
    check_drops(report, options.max_dropped)  # an entry another process filled meanwhile: this call's threshold
    return dataclasses.replace(done, report=report)


def _system_error(exc: OSError, cache: Path) -> PlanccError:
    """What an OSError during a scan means: a resource limit is named as such, and only a file of the cache that
    cannot be written is blamed on the cache."""
    what = exc.strerror or str(exc)
    if out_of_descriptors(exc):
        return PlanccError(f"cannot scan: {descriptors_hint()}")
    if exc.filename is not None and not str(exc.filename).startswith(str(cache)):
        return PlanccError(f"{exc.filename}: {what}")
    hint = "; set PLANCC_CACHE to a writable directory" if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS) else ""
    return PlanccError(f"cannot write the scan cache {cache}: {what}{hint}")


def _fill(entry: Path, job: shard.ScanJob, reader: RowReader, *, shard_rows: int, num_proc: int,
          progress: Progress, started: float, engine: Engine | None) -> Path:
    """Scan every shard (reusing finished ones), join them and write the cache entry; returns where it went."""
    work = entry.parent / f"{job.key}.parts"
    ranges = shard.local_ranges(job.rows, shard_rows)
    todo = [(lo, hi) for lo, hi in ranges if shard.finished_part(work / shard.part_name(lo, hi), job.key, lo, hi)
            is None]
    (engine or local_engine(reader, num_proc=num_proc, progress=progress))(job, todo, work)
    parts = [work / shard.part_name(lo, hi) for lo, hi in ranges]
    try:
        joined = merge.join(parts)
    except InputError:  # over --max-dropped or nothing kept: a finished result, not a crash: leave no trace
        shutil.rmtree(work, ignore_errors=True)
        raise
    joined = dataclasses.replace(joined, report=joined.report.but(seconds=round(time.perf_counter() - started, 3)))
    if progress:
        progress("writing", 0, 1)
    try:
        with outputs.atomic_directory(entry, owned=True, what="scan") as tmp:
            merge.write_joined(tmp, joined)
    except atomic.OutputBusy:  # another process writes the same entry: keep ours beside it
        entry = entry.parent / f"{job.key}-{uuid.uuid4().hex[:8]}"
        with outputs.atomic_directory(entry, owned=True, what="scan") as tmp:
            merge.write_joined(tmp, joined)
    shutil.rmtree(work, ignore_errors=True)  # the entry holds hard links to the parts' files
    if progress:
        progress("writing", 1, 1)
    return entry


def scan_shard(source: str, options: ScanOptions, index: int, count: int, out_dir: Path, *, overwrite: bool = False,
               num_proc: int = 1, progress: Progress = None) -> ScanRecord:
    """`plancc scan --shard I/N`: shard `index` of `count` of SOURCE's rows into the partial scan `out_dir`
    (atomically, the `-o` rules); `plancc merge` joins the parts. Returns the part's record."""
    num_proc = bound_workers(num_proc, options.tokenizer)
    if progress:
        progress("reading", 0, 1)
    ident = shard.identity(source, options)
    reader = RowReader(ident[2], options.split)
    try:
        job = shard.prepare(source, options, reader=reader, ident=ident)
        lo, hi = shard.shard_range(job.rows, index, count)
        if progress:
            progress("reading", 1, 1)
        with workers(num_proc) as pool:
            return shard.scan_part(job, lo, hi, out_dir, reader=reader, num_proc=num_proc, pool=pool,
                                   progress=progress, overwrite=overwrite)
    finally:
        reader.close()


def write_scan(result: Scan, out_dir: Path, *, overwrite: bool = False) -> None:
    """SCAN_DIR: samples.parquet, tokens/ and scan.json, replaced atomically; an existing scan only with
    `overwrite`, a folder holding anything else never (`outputs.check_output`)."""
    with outputs.atomic_directory(out_dir, overwrite=overwrite, what="scan") as tmp:
        ScanDir(tmp, result.report).write(result.samples)
        if result.tokenized_path is not None:
            token_writer.link_store(result.tokenized_path, tmp / schemas.TOKENS_DIR)


def options_from_record(record: ScanRecord, tokenizer: str | None = None) -> ScanOptions:
    """The scan options a record was made with, to rescan a source the same way (`validate --dataset`).

    The record holds the tokenizer's and template's fingerprints in its options and their locations beside;
    `tokenizer` overrides the tokenizer's location (a moved tokenizer rescans the same when its content is the
    same). A rescan compares content, so it never refuses drops (`max_dropped` 1).
    """
    recorded = record.options
    if recorded is None:
        raise InputError("the plan has no scan report (it was compiled from a bare samples table): nothing to rescan")
    template = record.chat_template
    kept = {f.name: getattr(recorded, f.name) for f in dataclasses.fields(recorded)
            if f.name not in ("tokenizer", "chat_template", "template_date")}
    return ScanOptions(**kept, tokenizer=spec_of(record.tokenizer, tokenizer),
                       chat_template=template.name if template and template.origin in ("builtin", "file") else None,
                       **({"template_date": recorded.template_date} if recorded.template_date else {}),
                       max_dropped=1.0)

"""The scan: SOURCE → samples table (+ tokenized dataset), cached by (source content, tokenizer, chat template, scan
options).

    read (sources.read) → map columns, detect format, check columns (sources.detect) → encode rows
    (sources.parallel / sources.encode, or sources.samples.from_tokenized) → long policy, counts, drops, hashes
    (sources.samples) → drop check (--max-dropped) → cache directory {samples.parquet, tokens/,
    scan.json}, written atomically

A scan whose drops exceed `--max-dropped` writes nothing, not even its cache entry; the check also runs on every
cache hit, so a threshold lowered later is never bypassed. The report (`scan.json`) counts every dropped and
truncated sample and names the tokenizer and chat template with their fingerprints; `warnings` holds the lines a
user must see (drops, template markers that are not single tokens, the split a dataset dict was read with).

The token store (`plancc.token_store`: memory-mappable flat arrays + chunk hashes) has one row per SOURCE row in
source order, so `sample_id` is the row the trainer loads; dropped rows stay in it (they are simply absent from the
samples table). Under `--shift none` its `labels` hold already-shifted labels (report `labels_shifted`). It is
written for every format, an already-tokenized source included (converted once: the runtime then maps it instead
of parsing the user's files, and a plan no longer depends on where they live); a sharded source is one store.

`num_proc > 1` spawns worker processes: a script calling `scan` that way needs an `if __name__ == "__main__":`
guard (the `plancc` command has one).
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa

from plancc import atomic, store, token_store
from plancc.config import ScanOptions, canonical_hash, default_cache_dir
from plancc.errors import InputError, PlanccError
from plancc.fingerprint import scan_identity
from plancc.sources import detect, templates
from plancc.sources.encode import Encoded, RowError
from plancc.sources.parallel import encode_rows
from plancc.sources.read import locate, read_source
from plancc.sources.samples import check_drops, drop_warning, finish, from_tokenized
from plancc.sources.tokenizer import BUILTIN, BUILTIN_NAME, Tok, load_tokenizer

SCAN_VERSION = 3  # 3: token store (tokens/) instead of tokenized.parquet, written for tokenized sources too
Progress = Callable[[str, int, int], None] | None


@dataclass(frozen=True)
class Scan:
    """A finished scan: the samples table, where its token store is, the source files and the scan report."""

    samples: pa.Table
    tokenized_path: Path | None  # the token store directory (None: a samples table without tokens)
    source_paths: list[str]
    report: dict
    key: str


def _options_dict(options: ScanOptions, tok: Tok | None, template: templates.ChatTemplate | None) -> dict[str, Any]:
    """The options that decide the samples table; the tokenizer's and template's content matter, not where they
    were found. `max_dropped` checks the result and is left out."""
    d = dataclasses.asdict(options)
    d["tokenizer"] = tok.fingerprint if tok else None
    d["chat_template"] = template.fingerprint if template else None
    d["columns"] = [list(pair) for pair in options.columns]  # as JSON reads it back from a cached report
    del d["max_dropped"]
    return d


def _needs_tokenizer(source: str, fmt: str) -> InputError:
    return InputError(f"{source}: {fmt} data must be tokenized: pass --tokenizer PATH (the model's tokenizer.json or "
                      f"Hugging Face tokenizer directory), or --tokenizer {BUILTIN} for the built-in byte-level one")


def _load_cached(path: Path, key: str) -> Scan | None:
    manifest = path / store.SCAN_MANIFEST_FILE
    if not (manifest.is_file() and (path / store.SAMPLES_FILE).is_file()):
        return None
    try:
        report = orjson.loads(manifest.read_bytes())
        samples = store.read_samples(path / store.SAMPLES_FILE)
    except (orjson.JSONDecodeError, store.StoreError):
        return None  # a damaged cache entry is recomputed, not trusted
    if report.get("key") != key:
        return None
    tokens = path / store.TOKENS_DIR
    if not token_store.is_store(tokens):
        return None
    return Scan(samples, tokens, list(report.get("source_paths", [])), report, key)


def _write_entry(directory: Path, samples, tokenized: Encoded, report: dict) -> None:
    meta = store.file_metadata("samples", report["fingerprints"], report["options"])
    store.write_parquet(samples, directory / store.SAMPLES_FILE, meta)
    token_store.write_store(directory / store.TOKENS_DIR, tokenized.ids, tokenized.labels, tokenized.offsets,
                            fingerprints=report["fingerprints"], labels_shifted=report["labels_shifted"])
    store.write_json(report, directory / store.SCAN_MANIFEST_FILE)


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


def scan(source: str, options: ScanOptions, *, num_proc: int = 1, cache_dir: Path | None = None,
         progress: Progress = None) -> Scan:
    """Tokenize and scan SOURCE (or reuse the cached scan with the same key)."""
    started = time.perf_counter()
    if isinstance(num_proc, bool) or not isinstance(num_proc, int) or num_proc <= 0:
        raise InputError(f"--num-proc must be a positive integer, got {num_proc!r}")
    tok = load_tokenizer(options.tokenizer) if options.tokenizer is not None else None
    template = templates.resolve(options.chat_template, tok)
    loc = locate(str(source))
    if progress:
        progress("reading", 0, 1)
    src = read_source(loc, options.split) if loc.fingerprint is None else None
    source_fp = loc.fingerprint or (src.fingerprint if src else "")
    opts = _options_dict(options, tok, template)
    key = canonical_hash({"version": SCAN_VERSION, "source": source_fp, "options": opts})
    entry = Path(cache_dir if cache_dir is not None else default_cache_dir()) / "scans" / key
    cached = _load_cached(entry, key)
    if cached is not None:
        if progress:
            progress("reading", 1, 1)
        # same content may now live elsewhere: point at the files of this call, not of the cached one
        paths = list(src.paths) if src is not None else _current_paths(loc, cached.source_paths)
        report = {**cached.report, "source": str(source), "source_paths": paths,
                  "tokenizer": tok.name if tok else None}  # this call's tokenizer path, as for the source
        check_drops(report, options.max_dropped)
        return dataclasses.replace(cached, source_paths=paths, report=report)
    if src is None:
        src = read_source(loc, options.split)
    if progress:
        progress("reading", 1, 1)
    src = detect.map_columns(src, options.columns)
    fmt = detect.detect_format(src) if options.format == "auto" else options.format
    work = detect.canonical(src, fmt)
    warnings = list(src.notes)
    chat = None
    if fmt == "tokenized":
        enc = from_tokenized(work, options.shift, tok.vocab_size if tok else None, src.where)
        labels_shifted = options.shift == "none"
        if progress:
            progress("tokenizing", src.num_rows, src.num_rows)
    else:
        if tok is None:
            raise _needs_tokenizer(str(source), fmt)
        if fmt == "messages":
            chat = templates.require(template, tok)
            warnings += filter(None, [templates.marker_warning(chat, tok)])
        try:
            enc = encode_rows(work, fmt, options.tokenizer, add_eos=options.add_eos, num_proc=num_proc,
                              progress=progress, template=chat.text if chat else None)
        except RowError as exc:
            raise InputError(f"{src.where(exc.row)}: {exc.message}") from None
        labels_shifted = False
    done = finish(enc, options, src.where, labels_shifted=labels_shifted)
    report = {
        **done.report,
        "format": fmt,
        "source": str(source),
        "source_kind": src.kind,
        "source_paths": list(src.paths),
        "source_fingerprint": source_fp,
        "tokenizer": tok.name if tok else None,
        "tokenizer_fingerprint": tok.fingerprint if tok else None,
        "chat_template": chat.describe() if chat else None,
        "eos_token": tok.eos_token if tok else None,
        "options": opts,
        "max_dropped": options.max_dropped,
        "labels_shifted": options.shift == "none",
        "key": key,
        "plancc_scan_version": SCAN_VERSION,
        "seconds": round(time.perf_counter() - started, 3),
    }
    report["fingerprints"] = store.samples_fingerprints(done.samples, scan_identity(report))
    report["warnings"] = warnings + list(filter(None, [drop_warning(report)]))
    check_drops(report, options.max_dropped)  # before anything is written: an over-threshold scan leaves no trace
    if progress:
        progress("writing", 0, 1)
    tokenized = done.tokenized
    try:
        try:
            with store.atomic_directory(entry, owned=True, what="scan") as tmp:
                _write_entry(tmp, done.samples, tokenized, report)
        except atomic.OutputBusy:  # another process writes the same entry: keep ours beside it
            entry = entry.parent / f"{key}-{uuid.uuid4().hex[:8]}"
            with store.atomic_directory(entry, owned=True, what="scan") as tmp:
                _write_entry(tmp, done.samples, tokenized, report)
    except OSError as exc:
        raise PlanccError(f"cannot write the scan cache {entry.parent}: {exc.strerror or exc}; "
                          "set PLANCC_CACHE to a writable directory") from None
    if progress:
        progress("writing", 1, 1)
    return Scan(done.samples, entry / store.TOKENS_DIR, list(src.paths), report, key)


def write_scan(result: Scan, out_dir: Path, *, overwrite: bool = False) -> None:
    """SCAN_DIR: samples.parquet, tokens/ and scan.json, replaced atomically; an existing scan only with
    `overwrite`, a folder holding anything else never (`store.check_output`)."""
    report = result.report
    with store.atomic_directory(out_dir, overwrite=overwrite, what="scan") as tmp:
        meta = store.file_metadata("samples", report["fingerprints"],
                                   report.get("options", {}))
        store.write_parquet(result.samples, tmp / store.SAMPLES_FILE, meta)
        if result.tokenized_path is not None:
            token_store.link_store(result.tokenized_path, tmp / store.TOKENS_DIR)
        store.write_json(report, tmp / store.SCAN_MANIFEST_FILE)


def options_from_report(report: dict[str, Any], tokenizer: str | None = None) -> ScanOptions:
    """The scan options a report was made with, to rescan a source the same way (`validate --dataset`).

    The report stores the tokenizer's and template's fingerprints in its options and their locations beside;
    `tokenizer` overrides the tokenizer's location (a moved tokenizer rescans the same when its content is the
    same). A rescan compares content, so it never refuses drops (`max_dropped` 1).
    """
    options = dict(report.get("options") or {})
    if not options:
        raise InputError("the plan has no scan report (it was compiled from a bare samples table): nothing to rescan")
    recorded = report.get("tokenizer")
    options["tokenizer"] = tokenizer or (BUILTIN if recorded == BUILTIN_NAME else recorded)
    template = report.get("chat_template") or {}
    options["chat_template"] = template.get("name") if template.get("origin") in ("builtin", "file") else None
    return ScanOptions(**options, max_dropped=1.0)

"""A scan's unit of work: one shard, a contiguous range of the source's global rows, scanned into a partial scan.

    prepare(SOURCE, options) -> ScanJob        (once: tokenizer, template, manifest, format, cache key)
    scan_part(job, lo, hi, PART_DIR)           (per shard, anywhere: read rows [lo, hi) -> encode -> finish ->
                                                PART_DIR {samples.parquet, tokens/, scan.json}, atomically)
    plancc.scan.merge.join / merge(PART_DIRS)       (check and join the parts: the scan)

Row `i` of the source (in the manifest's sorted file order, `sources.rows`) is `sample_id` i in every engine, so
a part's samples carry their global ids and its token store holds rows lo..hi-1 (row `sample_id - lo`). Each
sample is encoded on its own, so a part's rows are the same bytes whichever shard (or how many) they fell in;
joining parts in row order gives the samples table a one-shard scan gives, byte for byte.

A `ScanJob` is plain JSON (`to_dict`/`from_dict`): a job runner or cluster engine ships it to its workers, which
call `scan_part` (they need the source files and the tokenizer at the same paths). `shard_range(rows, i, n)` is
`--shard I/N`'s range; a local scan cuts `local_ranges(rows, shard_rows)`.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from plancc.config.settings import ScanOptions
from plancc.core.hashing import canonical_hash
from plancc.errors import InputError, SettingsError
from plancc.scan import formats
from plancc.scan.formats import Encoded, Encoding, RowError, turn_ends
from plancc.scan.sources import templates
from plancc.scan.sources.chat import has_generation_tags, reads_clock
from plancc.scan.sources.parallel import encode_rows
from plancc.scan.sources.read import Located, locate
from plancc.scan.sources.rows import Manifest, RowReader
from plancc.scan.sources.samples import finish
from plancc.scan.sources.tokenizer import BUILTIN, Tok, scan_tokenizer
from plancc.store import outputs, schemas, token_writer
from plancc.store.samples import samples_fingerprints
from plancc.store.scan_record import COUNTS, Counted, PartRange, RecordedOptions, ScanRecord, Template
from plancc.store.scan_store import ScanDir

SCAN_VERSION = 10  # 10: token stores hash each row (a digest independent of the shards); 9: a text that already ends
# in the eos gets no second one (a scan that appended one is not reused); 8: strftime_now is midnight UTC in the C
# locale (a scan that read the machine's time zone is not reused); 7: a turn whose text renders to nothing is not
# trained (blank_turns); 6: reports count end_only samples; 5: token store headers carry header_hash; 4: streamed in
# shards (a multi-part token store when several); 3: the token store
SHARD_ROWS = 65_536  # rows per shard of a local scan: memory per shard and resume granularity, never the result
PROBE_ROWS = 1_000  # rows the format is detected from (the first of the source, the same for every shard)
Progress = Callable[[str, int, int], None] | None


def recorded_options(options: ScanOptions, tok: Tok | None,
                     template: templates.ChatTemplate | None) -> RecordedOptions:
    """What the scan records of `options` (and hashes into its key): the tokenizer's and template's content, not
    where they were found (`RecordedOptions`)."""
    return RecordedOptions.of(options, tok.fingerprint if tok else None, template.fingerprint if template else None,
                              bool(template and reads_clock(template.text)))


TAG_FIXED = ("roles_to_train", "train_on_eos")  # what a template's {% generation %} blocks decide themselves
EVERY_TOKEN_FIXED = (*TAG_FIXED, "end_of_turn", "eot_tokens", "train_on_eot")  # moot when every token is trained


def _check_decided(chat: templates.ChatTemplate, options: ScanOptions) -> None:
    """`train_on = all_tokens`, or a template whose `{% generation %}` blocks mark what is trained, leaves no room
    for the settings that choose turns and ends: one set anyway is an error rather than a setting silently
    ignored."""
    if options.train_on == "all_tokens":
        fixed, why = EVERY_TOKEN_FIXED, "train_on all_tokens trains every token (leave it unset)"
    elif has_generation_tags(chat.text):
        fixed, why = TAG_FIXED, (f"chat template {chat.name} marks what is trained with {{% generation %}} blocks "
                                 "(leave it unset, or use a template without them)")
    else:
        return
    defaults = ScanOptions()
    for name in fixed:
        if getattr(options, name) != getattr(defaults, name):
            raise SettingsError(f"{name} cannot apply: {why}", name)


def _clock_note(chat: templates.ChatTemplate, options: ScanOptions) -> list[str]:
    """The note for a template that reads the date: which one it was given."""
    if not reads_clock(chat.text):
        return []
    return [f"chat template {chat.name} reads the date (strftime_now): rendered with template_date "
            f"{options.template_date}, not today's (set template_date to change it)"]


def scan_key(source_fingerprint: str, opts: RecordedOptions) -> str:
    """The scan cache key: what the samples table depends on (the source's content and its recorded options)."""
    return canonical_hash({"version": SCAN_VERSION, "source": source_fingerprint, "options": opts.to_json()})


def needs_tokenizer(source: str, fmt: str) -> InputError:
    """The error for a format that needs tokenizing when no --tokenizer was given."""
    return InputError(f"{source}: {fmt} data must be tokenized: pass --tokenizer PATH (the model's tokenizer.json or "
                      f"Hugging Face tokenizer directory), or --tokenizer {BUILTIN} for the built-in byte-level one")


@dataclass(frozen=True)
class ScanJob:
    """Everything a shard needs, decided once for the whole source (JSON-able)."""

    located: Located
    manifest: Manifest
    options: ScanOptions
    format: str
    template: str | None  # the chat template's text (messages only)
    key: str
    report: ScanRecord  # the entries every part and the joined scan share

    @property
    def rows(self) -> int:
        """Rows in the whole source."""
        return self.manifest.rows

    def to_dict(self) -> dict[str, Any]:
        """The job as JSON-able data (for engines shipping it to workers)."""
        opts = dataclasses.asdict(self.options)
        opts["columns"] = [list(pair) for pair in self.options.columns]
        return {"located": {**dataclasses.asdict(self.located), "paths": list(self.located.paths)},
                "manifest": self.manifest.to_dict(), "options": opts, "format": self.format,
                "template": self.template, "key": self.key, "report": self.report.to_json()}

    @staticmethod
    def from_dict(d: dict[str, Any]) -> ScanJob:
        """The job `to_dict` wrote."""
        loc = d["located"]
        return ScanJob(Located(loc["source"], loc["kind"], tuple(loc["paths"]), loc["fingerprint"]),
                       Manifest.from_dict(d["manifest"]), ScanOptions(**d["options"]), d["format"], d["template"],
                       d["key"], ScanRecord.from_json(d["report"], "scan job"))

    @property
    def sequences(self) -> int:
        """Sequences each source row gives (`RowFormat.sequences`: a preference pair's two completions)."""
        return formats.get(self.format).sequences

    @property
    def data_kind(self) -> str:
        """What the samples table holds (`schemas.data_kind_of`): sft, or the format's preference data."""
        return formats.get(self.format).data_kind

    def reader(self) -> RowReader:
        """A reader of this job's source that trusts the job's manifest (no recount)."""
        return RowReader(self.located, self.options.split, manifest=self.manifest)


def identity(source: str, options: ScanOptions) -> tuple[Tok | None, templates.ChatTemplate | None, Located]:
    """The tokenizer, chat template and location of a scan: all that its cache key needs besides the content."""
    tok = scan_tokenizer(options)
    return tok, templates.resolve(options.chat_template, tok), locate(str(source))


def prepare(source: str, options: ScanOptions, *, reader: RowReader | None = None,
            ident: tuple[Tok | None, templates.ChatTemplate | None, Located] | None = None) -> ScanJob:
    """The job of scanning SOURCE with `options`: counts every file's rows (the manifest) and detects the format
    from the first rows; raises InputError for a source or setting that cannot work."""
    tok, template, loc = ident or identity(source, options)
    reader = reader or RowReader(loc, options.split)
    probe = formats.map_columns(reader.read(0, min(reader.manifest.rows, PROBE_ROWS)), options.columns)
    fmt = formats.choose(probe, options)
    warnings = reader.notes
    chat = None
    if fmt.tokenizes:
        if tok is None:
            raise needs_tokenizer(str(source), fmt.name)
        if fmt.needs_template(probe):
            chat = templates.require(template, tok)
            _check_decided(chat, options)
            warnings += filter(None, [templates.marker_warning(chat, tok)])
            warnings += _clock_note(chat, options)
            warnings += turn_ends.check(tok, chat.text, chat.name, options)
    opts = recorded_options(options, tok, template)
    key = scan_key(reader.fingerprint, opts)
    described = chat.describe() if chat else None
    report = ScanRecord.of(
        format=fmt.name,
        source=str(source),
        source_kind=probe.kind,
        source_paths=tuple(reader.paths),
        source_files=reader.manifest.named_files(),
        source_fingerprint=reader.fingerprint,
        tokenizer=tok.name if tok else None,
        tokenizer_fingerprint=tok.fingerprint if tok else None,
        chat_template=Template(described["name"], described["fingerprint"], described["origin"],
                               bool(described.get("generation"))) if described else None,
        **({"text_format": tuple(shaped.items())} if (shaped := fmt.text_format(options)) else {}),
        eos_token=tok.eos_token if tok else None,
        options=opts,
        max_dropped=options.max_dropped,
        labels_shifted=options.shift == "none",
        key=key,
        plancc_scan_version=SCAN_VERSION,
        warnings=tuple(warnings),
    )
    return ScanJob(loc, reader.manifest, options, fmt.name, chat.text if chat else None, key, report)


def shard_range(rows: int, index: int, count: int) -> tuple[int, int]:
    """Rows of shard `index` of `count` (`--shard I/N`): [I*R//N, (I+1)*R//N), so N shards tile the source."""
    if not (isinstance(count, int) and isinstance(index, int) and count >= 1 and 0 <= index < count):
        raise InputError(f"--shard {index}/{count}: expected I/N with 0 <= I < N (e.g. --shard 0/8)")
    return index * rows // count, (index + 1) * rows // count


def local_ranges(rows: int, shard_rows: int = SHARD_ROWS) -> list[tuple[int, int]]:
    """The shards a local scan cuts: `shard_rows` rows each, the last one shorter."""
    if isinstance(shard_rows, bool) or not isinstance(shard_rows, int) or shard_rows < 1:
        raise InputError(f"--shard-rows must be a positive integer, got {shard_rows!r}")
    return [(a, min(rows, a + shard_rows)) for a in range(0, rows, shard_rows)]


def _encode(job: ScanJob, reader: RowReader, lo: int, hi: int, *, num_proc: int, pool, progress: Progress):
    """(encoded rows, labels already shifted, where) of rows [lo, hi)."""
    options = job.options
    src = formats.map_columns(reader.read(lo, hi), options.columns)
    fmt = formats.get(job.format)
    work, fmt = fmt.shape(fmt.canonical(src, options), options)
    tok = scan_tokenizer(options)
    how = Encoding(tok, options, job.template)
    shifted = None if progress is None else (lambda phase, done, total: progress(phase, lo + done, job.rows))
    try:
        enc = encode_rows(work, fmt, how, num_proc=num_proc, progress=shifted, pool=pool) if fmt.tokenizes \
            else fmt.encode(work, how)
    except RowError as exc:
        raise InputError(f"{src.where(exc.row)}: {exc.message}") from None
    return enc, fmt.labels_shifted(options), src.where


def _global(counts: ScanRecord, lo: int) -> ScanRecord:
    """A part's counts with rows named by their global index."""
    return counts.but(**{k: Counted(getattr(counts, k).count, tuple(lo + r for r in getattr(counts, k).first_rows))
                         for k in COUNTS})


def part_report(job: ScanJob, lo: int, hi: int, counts: ScanRecord, samples: pa.Table,
                seconds: float) -> ScanRecord:
    """A part's record: the job's, the part's counts and row range, fingerprints of its rows."""
    report = job.report.but(**counts.held(), part=PartRange(lo, hi, job.rows), seconds=round(seconds, 3))
    return report.but(fingerprints=tuple(samples_fingerprints(samples, report.identity).items()))


def scan_part(job: ScanJob, lo: int, hi: int, out_dir: str | Path, *, reader: RowReader | None = None,
              num_proc: int = 1, pool=None, progress: Progress = None, owned: bool = False,
              overwrite: bool = False) -> ScanRecord:
    """Scan rows [lo, hi) of the job's source into the partial scan `out_dir` (written atomically: it is whole or
    absent; `owned`: a directory plancc owns, replaced whatever it holds; else `outputs.check_output` rules, with
    `overwrite`). Returns the part's record (also its `scan.json`)."""
    started = time.perf_counter()
    if lo < hi:
        enc, shifted, where = _encode(job, reader or job.reader(), lo, hi, num_proc=num_proc, pool=pool,
                                      progress=progress)
        done = finish(enc, job.options, where, labels_shifted=shifted, sequences=job.sequences, first_row=lo)
        samples, counts, tokens = done.samples, _global(done.report, lo), done.tokenized
    else:  # more shards than rows: an empty part keeps the coverage whole
        samples, tokens = schemas.samples_schema(False, job.data_kind).empty_table(), Encoded.empty()
        counts = ScanRecord.of(rows_read=0, retained=0, dropped_samples=0, truncated_samples=0,
                               **{k: Counted(0, ()) for k in COUNTS})
    report = part_report(job, lo, hi, counts, samples, time.perf_counter() - started)
    with outputs.atomic_directory(out_dir, owned=owned, overwrite=overwrite, what="scan") as tmp:
        ScanDir(tmp, report).write(samples)
        token_writer.write_store(tmp / schemas.TOKENS_DIR, tokens.ids, tokens.labels, tokens.offsets,
                                fingerprints=report.fingerprint_map, labels_shifted=report.labels_shifted)
    return report


def part_name(lo: int, hi: int) -> str:
    """The folder name of the part of rows [lo, hi) in a scan's work directory (sorts in row order)."""
    return f"{lo:012d}-{hi:012d}"


def finished_part(path: Path, key: str, lo: int, hi: int) -> ScanRecord | None:
    """The record of a part already written at `path` for this key and range (resume), else None."""
    try:
        part = ScanDir.open(path)
    except InputError:  # absent or damaged: scanned again
        return None
    report = part.record
    if report.key != key or report.part is None or (report.part.lo, report.part.hi) != (lo, hi) or part.tokens is None:
        return None
    return report


__all__ = ["SCAN_VERSION", "SHARD_ROWS", "ScanJob", "finished_part", "local_ranges", "part_name", "prepare",
           "scan_part", "shard_range"]

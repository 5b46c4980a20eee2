"""Join the parts of a sharded scan (`plancc merge PART... -o SCAN`, and every local scan's shards) into one scan.

The parts must fit together, else the merge names them and what differs, and writes nothing:

- compatible: the same scan version, source content, format, options (sequence_len, shift, long policy,
  columns, ...), tokenizer and chat template (by content fingerprint), and the same source row count;
- disjoint and complete: their row ranges, sorted, tile [0, rows) (an overlap or a gap names its rows);
- intact: each part's samples table hashes to its recorded fingerprints and its token store holds its rows.

The joined samples table is the parts' concatenated in row order (their sample ids are already global), so it is
byte for byte the table a one-shard scan writes; its fingerprints are recomputed over it. Token data is never
copied: one part's store is hard-linked as the scan's store, several become a multi-part store whose parts are
hard links to theirs (`token_writer.write_parts`; a copy only across filesystems, counted in the report).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from plancc.errors import InputError
from plancc.scan import formats
from plancc.scan.sources.samples import FIRST_ROWS, check_drops, check_retained, drop_warning
from plancc.store import outputs, schemas, token_store, token_writer
from plancc.store.samples import samples_fingerprints
from plancc.store.scan_record import COUNTS, TOTALS, Counted, MergedFrom, RecordedOptions, ScanRecord
from plancc.store.scan_store import ScanDir

SHARED = ("plancc_scan_version", "source_fingerprint", "format", "options")  # what every part must agree on
PER_PART = ("part", "fingerprints", "seconds", *TOTALS, *COUNTS)


@dataclass(frozen=True)
class Part:
    """One partial scan directory, whose record's `part` gives its row range."""
    scan: ScanDir

    @property
    def path(self) -> Path:
        """Where the part is."""
        return self.scan.path

    @property
    def report(self) -> ScanRecord:
        """The part's record."""
        return self.scan.record

    @property
    def lo(self) -> int:
        """First source row of the part."""
        return self.report.part.lo

    @property
    def hi(self) -> int:
        """One past the part's last source row."""
        return self.report.part.hi


@dataclass(frozen=True)
class Joined:
    """Parts checked to fit, joined: the whole samples table, the parts in row order, the merged record."""
    samples: pa.Table
    parts: list[Part]  # in row order
    report: ScanRecord

    @property
    def stores(self) -> list[Path]:
        """Each part's token store, in row order: the parts of the merged multi-part store."""
        return [p.path / schemas.TOKENS_DIR for p in self.parts]


def read_part(path: str | Path) -> Part:
    """Open the partial scan at `path`, or raise an InputError saying why it is not one."""
    scan = ScanDir.open(path)
    if scan.record.part is None:
        raise InputError(f"{scan.path}: a whole scan, not a part of a sharded scan (`plancc scan --shard I/N` writes "
                         "parts)")
    return Part(scan)


def _option_differences(x: RecordedOptions | None, y: RecordedOptions | None) -> list[str]:
    """What differs between two parts' recorded options, option by option."""
    if x is None or y is None:
        return [] if x == y else [f"options {x!r} vs {y!r}"]
    a, b = x.to_json(), y.to_json()
    return [f"{k} {a.get(k)!r} vs {b.get(k)!r}" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]


def _differences(a: ScanRecord, b: ScanRecord) -> list[str]:
    """What differs between two parts' shared fields, option by option."""
    out = []
    for key in SHARED:
        x, y = getattr(a, key), getattr(b, key)
        if key == "options":
            out += _option_differences(x, y)
        elif x != y:
            out.append(f"{key} {x!r} vs {y!r}")
    if a.part.rows != b.part.rows:
        out.append(f"source rows {a.part.rows} vs {b.part.rows}")
    return out


def check(parts: list[Part]) -> list[Part]:
    """The parts sorted by row range, after the compatibility and coverage checks (InputError naming parts)."""
    if not parts:
        raise InputError("merge: no parts given")
    first = parts[0]
    for p in parts[1:]:
        diff = _differences(first.report, p.report)
        if diff:
            raise InputError(f"merge: {p.path} does not fit {first.path} (another source, options or tokenizer): "
                             f"{'; '.join(diff)}")
    parts = sorted(parts, key=lambda p: (p.lo, p.hi))
    rows = first.report.part.rows
    at, prev = 0, None
    for p in parts:
        if not 0 <= p.lo <= p.hi <= rows:
            raise InputError(f"merge: {p.path} claims rows {p.lo}..{p.hi - 1}, outside the source's {rows} rows")
        if p.lo < at:
            raise InputError(f"merge: {p.path} (rows {p.lo}..{p.hi - 1}) overlaps {prev.path} (rows "
                             f"{prev.lo}..{prev.hi - 1}): each row must come from one part")
        if p.lo > at:
            raise InputError(f"merge: rows {at}..{p.lo - 1} of {rows} are missing (no part covers them; the next "
                             f"part is {p.path})")
        at, prev = p.hi, p
    if at < rows:
        raise InputError(f"merge: rows {at}..{rows - 1} of {rows} are missing (the last part {prev.path} ends at row "
                         f"{at - 1})")
    return parts


def _part_samples(p: Part) -> pa.Table:
    """A part's samples, checked against its fingerprints and its token store's rows."""
    try:
        table = p.scan.samples()
        m = token_store.open_store(p.path / schemas.TOKENS_DIR)
    except (schemas.StoreError, token_store.TokenStoreError) as exc:
        raise InputError(f"merge: part {p.path}: {exc}") from None
    except InputError:
        raise InputError(f"merge: part {p.path}: its samples table or token store does not match its recorded "
                         "fingerprints (a file was changed or swapped in); rescan this shard") from None
    k = formats.get(p.report.format).sequences if p.report.format else 1  # sequences a source row gives
    if m.header["rows"] != k * (p.hi - p.lo):
        raise InputError(f"merge: part {p.path}: its token store holds {m.header['rows']} rows, its range "
                         f"{p.lo}..{p.hi - 1} gives {k * (p.hi - p.lo)}")
    return table


def joined_report(parts: list[Part]) -> ScanRecord:
    """The record of the parts together: their shared entries, their counts summed (first rows kept)."""
    first = parts[0].report
    summed = {k: sum(getattr(p.report, k) for p in parts) for k in TOTALS}
    counted = {k: Counted(sum(getattr(p.report, k).count for p in parts),
                          tuple(r for p in parts for r in getattr(p.report, k).first_rows)[:FIRST_ROWS])
               for k in COUNTS}
    return first.without(*PER_PART).but(**summed, **counted,
                                        seconds=round(sum(float(p.report.seconds) for p in parts), 3))


def join(paths: list[str | Path]) -> Joined:
    """Check the parts at `paths` and join them (nothing written); raises InputError naming a part that does not
    fit, and when the whole drops more than its --max-dropped or keeps no sample."""
    parts = check([read_part(p) for p in paths])
    tables = [_part_samples(p) for p in parts]
    samples = pa.concat_tables(tables).combine_chunks() if len(tables) > 1 else tables[0]
    del tables  # the parts' tables: only the joined one stays (memory: the samples table once)
    report = joined_report(parts)
    check_retained(report)
    report = report.but(fingerprints=tuple(samples_fingerprints(samples, report.identity).items()))
    report = report.but(warnings=(*report.warnings, *filter(None, [drop_warning(report)])))
    check_drops(report, float(report.max_dropped))
    return Joined(samples, parts, report)


def write_joined(directory: Path, joined: Joined) -> ScanRecord:
    """A scan directory's files (into `directory`, a fresh temporary one of `outputs.atomic_directory`); returns
    the record written (a note added when token files had to be copied)."""
    report = joined.report
    stores = [s for s in joined.stores if token_store.open_store(s).header["rows"] > 0] or joined.stores[:1]
    if len(stores) == 1:
        copied = token_writer.link_store(stores[0], directory / schemas.TOKENS_DIR)
    else:
        copied = token_writer.write_parts(directory / schemas.TOKENS_DIR, stores, fingerprints=report.fingerprint_map,
                                         labels_shifted=report.labels_shifted)
    if copied:
        report = report.but(warnings=(*report.warnings, f"{copied} token files were copied, not hard-linked (the "
                                      "parts are on another filesystem)"))
    ScanDir(directory, report).write(joined.samples)
    return report


def merge(paths: list[str | Path], output: str | Path, *, overwrite: bool = False) -> ScanRecord:
    """`plancc merge`: check and join the parts at `paths` into the scan directory `output` (atomically; the
    `-o` rules of `outputs.check_output`). Returns the joined scan's record."""
    outputs.check_output(output, overwrite=overwrite)
    joined = join(paths)
    merged = tuple(MergedFrom(str(p.path.absolute()), p.lo, p.hi) for p in joined.parts)
    joined = dataclasses.replace(joined, report=joined.report.but(merged_from=merged))
    with outputs.atomic_directory(output, overwrite=overwrite, what="scan") as tmp:
        return write_joined(tmp, joined)

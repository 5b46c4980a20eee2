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

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa

from plancc.errors import InputError
from plancc.scan.shard import COUNTS
from plancc.scan.sources.samples import FIRST_ROWS, check_drops, check_retained, drop_warning
from plancc.store import outputs, parquet, plan_files, schemas, token_store, token_writer
from plancc.store.fingerprint import scan_identity

SHARED = ("plancc_scan_version", "source_fingerprint", "format", "options")  # what every part must agree on
PER_PART = ("part", "fingerprints", "seconds", "rows_read", "retained", "dropped_samples", "truncated_samples",
            *COUNTS)


@dataclass(frozen=True)
class Part:
    """One partial scan directory and its report (`scan.json`, whose `part` gives its row range)."""
    path: Path
    report: dict[str, Any]

    @property
    def lo(self) -> int:
        """First source row of the part."""
        return int(self.report["part"]["lo"])

    @property
    def hi(self) -> int:
        """One past the part's last source row."""
        return int(self.report["part"]["hi"])


@dataclass(frozen=True)
class Joined:
    """Parts checked to fit, joined: the whole samples table, the parts in row order, the merged report."""
    samples: pa.Table
    parts: list[Part]  # in row order
    report: dict[str, Any]

    @property
    def stores(self) -> list[Path]:
        """Each part's token store, in row order: the parts of the merged multi-part store."""
        return [p.path / schemas.TOKENS_DIR for p in self.parts]


def read_part(path: str | Path) -> Part:
    """Open the partial scan at `path`, or raise an InputError saying why it is not one."""
    p = Path(path)
    try:
        report = orjson.loads((p / schemas.SCAN_MANIFEST_FILE).read_bytes())
    except FileNotFoundError:
        raise InputError(f"{p}: not a scan directory (no {schemas.SCAN_MANIFEST_FILE})") from None
    except (OSError, orjson.JSONDecodeError) as exc:
        raise InputError(f"{p / schemas.SCAN_MANIFEST_FILE}: not readable ({exc})") from None
    if not isinstance(report, dict) or not isinstance(report.get("part"), dict):
        raise InputError(f"{p}: a whole scan, not a part of a sharded scan (`plancc scan --shard I/N` writes parts)")
    return Part(p, report)


def _differences(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """What differs between two parts' shared fields, option by option."""
    out = []
    for key in SHARED:
        x, y = a.get(key), b.get(key)
        if key == "options" and isinstance(x, dict) and isinstance(y, dict):
            out += [f"{k} {x.get(k)!r} vs {y.get(k)!r}" for k in sorted(set(x) | set(y)) if x.get(k) != y.get(k)]
        elif x != y:
            out.append(f"{key} {x!r} vs {y!r}")
    rows = (a["part"].get("rows"), b["part"].get("rows"))
    if rows[0] != rows[1]:
        out.append(f"source rows {rows[0]} vs {rows[1]}")
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
    rows = int(first.report["part"]["rows"])
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
        table = parquet.read_samples(p.path / schemas.SAMPLES_FILE)
        m = token_store.open_store(p.path / schemas.TOKENS_DIR)
    except (schemas.StoreError, token_store.TokenStoreError) as exc:
        raise InputError(f"merge: part {p.path}: {exc}") from None
    fps = plan_files.samples_fingerprints(table, scan_identity(p.report))
    if fps != p.report.get("fingerprints") or m.header["fingerprints"] != fps:
        raise InputError(f"merge: part {p.path}: its samples table or token store does not match its recorded "
                         "fingerprints (a file was changed or swapped in); rescan this shard")
    if m.header["rows"] != p.hi - p.lo:
        raise InputError(f"merge: part {p.path}: its token store holds {m.header['rows']} rows, its range "
                         f"{p.lo}..{p.hi - 1} has {p.hi - p.lo}")
    return table


def joined_report(parts: list[Part]) -> dict[str, Any]:
    """The scan report of the parts together: their shared fields, their counts summed (first rows kept)."""
    base = {k: v for k, v in parts[0].report.items() if k not in PER_PART}
    report = {**base, **{k: sum(int(p.report[k]) for p in parts)
                         for k in ("rows_read", "retained", "dropped_samples", "truncated_samples")}}
    for k in COUNTS:
        report[k] = {"count": sum(p.report[k]["count"] for p in parts),
                     "first_rows": [r for p in parts for r in p.report[k]["first_rows"]][:FIRST_ROWS]}
    report["seconds"] = round(sum(float(p.report.get("seconds", 0)) for p in parts), 3)
    return report


def join(paths: list[str | Path]) -> Joined:
    """Check the parts at `paths` and join them (nothing written); raises InputError naming a part that does not
    fit, and when the whole drops more than its --max-dropped or keeps no sample."""
    parts = check([read_part(p) for p in paths])
    tables = [_part_samples(p) for p in parts]
    samples = pa.concat_tables(tables).combine_chunks() if len(tables) > 1 else tables[0]
    del tables  # the parts' tables: only the joined one stays (memory: the samples table once)
    report = joined_report(parts)
    check_retained(report)
    report["fingerprints"] = plan_files.samples_fingerprints(samples, scan_identity(report))
    report["warnings"] = [*report.get("warnings", []), *filter(None, [drop_warning(report)])]
    check_drops(report, float(report.get("max_dropped", 0.05)))
    return Joined(samples, parts, report)


def write_joined(directory: Path, joined: Joined) -> None:
    """A scan directory's files (into `directory`, a fresh temporary one of `outputs.atomic_directory`)."""
    report = joined.report
    parquet.write_parquet(joined.samples, directory / schemas.SAMPLES_FILE,
                        parquet.file_metadata("samples", report["fingerprints"], report["options"]))
    stores = [s for s in joined.stores if token_store.open_store(s).header["rows"] > 0] or joined.stores[:1]
    if len(stores) == 1:
        copied = token_writer.link_store(stores[0], directory / schemas.TOKENS_DIR)
    else:
        copied = token_writer.write_parts(directory / schemas.TOKENS_DIR, stores, fingerprints=report["fingerprints"],
                                          labels_shifted=report["labels_shifted"])
    if copied:
        report["warnings"] = [*report["warnings"], f"{copied} token files were copied, not hard-linked (the parts "
                              "are on another filesystem)"]
    parquet.write_json(report, directory / schemas.SCAN_MANIFEST_FILE)


def merge(paths: list[str | Path], output: str | Path, *, overwrite: bool = False) -> dict[str, Any]:
    """`plancc merge`: check and join the parts at `paths` into the scan directory `output` (atomically; the
    `-o` rules of `outputs.check_output`). Returns the joined scan's report."""
    outputs.check_output(output, overwrite=overwrite)
    joined = join(paths)
    joined.report["merged_from"] = [{"path": str(p.path.absolute()), "lo": p.lo, "hi": p.hi} for p in joined.parts]
    with outputs.atomic_directory(output, overwrite=overwrite, what="scan") as tmp:
        write_joined(tmp, joined)
    return joined.report


"""What a path given as a compile's SOURCE (or to `show`) holds: a plan directory, a scan directory, a samples
table, or none of them (a raw source to scan). `open_samples` is the one place that tells them apart and reads
what it finds, checked: a plan directory through `Plan` (its samples against the plan file's fingerprints, its
token store against its digest), a scan directory through `ScanDir` (against its record), a samples table for the
shape the planner needs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from plancc.errors import InputError, PlanMismatchError
from plancc.store import atomic
from plancc.store.outputs import output_kind
from plancc.store.parquet import read_file_meta, read_samples
from plancc.store.plan import Plan
from plancc.store.samples import check_samples, is_samples_table, near_samples_table
from plancc.store.scan_record import RecordedOptions, ScanRecord
from plancc.store.scan_store import ScanDir
from plancc.store.schemas import PLAN_FILE, SAMPLES_FILE, SCAN_MANIFEST_FILE, StoreError

KINDS = ("plan", "scan", "table")


@dataclass(frozen=True, eq=False)
class StoredSamples:
    """A samples table found at a path: what holds it (`kind`: plan, scan or table), the file, the table, how it
    was made (`record`: the scan's record, a plan's scan record with its source paths, the options a scan's
    samples file records on its own, or nothing), the token store that goes with it, and the plan (a plan
    directory's)."""

    kind: str
    path: Path  # the samples file
    table: pa.Table
    record: ScanRecord
    tokens: Path | None
    plan: Plan | None = None


def samples_kind(path: str | Path) -> str | None:
    """'plan', 'scan' or 'table' when `path` holds a samples table (without reading it), else None."""
    p = Path(path).expanduser()
    if p.is_dir():
        if not (p / SAMPLES_FILE).is_file():
            return None
        return "plan" if (p / PLAN_FILE).is_file() else "scan" if (p / SCAN_MANIFEST_FILE).is_file() else None
    try:
        return "table" if p.suffix.lower() == ".parquet" and is_samples_table(set(pq.read_schema(p).names)) \
            else None
    except (pa.ArrowException, OSError):
        return None


def open_samples(path: str | Path) -> StoredSamples | None:
    """The samples table at `path` (a plan or scan directory, or a Parquet samples table), checked; None for
    anything else. Refuses (one line, exit 2) a plancc directory without its samples, a samples table edited after
    its scan or plan recorded it, a Parquet file that is a samples table but for some columns, and rows the
    planner cannot use."""
    p = Path(path).expanduser()
    if p.is_dir() or not p.exists():
        atomic.recover(p)
    if p.is_dir():
        if not (p / SAMPLES_FILE).is_file():
            kind = output_kind(p)
            if kind is not None:
                raise InputError(f"{p} is a plancc {kind} directory without its {SAMPLES_FILE}: it was deleted or "
                                 "moved; compile or scan the source again")
            return None
        if (p / PLAN_FILE).is_file():
            return _plan_samples(p)
        if (p / SCAN_MANIFEST_FILE).is_file():
            scan = ScanDir.open(p)
            table = read_samples(scan.samples_file)
            check_samples(table, scan.samples_file)
            scan.check(table)
            return StoredSamples("scan", scan.samples_file, table, scan.record, scan.tokens)
        return _table(p / SAMPLES_FILE)
    if p.is_file() and p.suffix.lower() == ".parquet":
        try:
            names = set(pq.read_schema(p).names)
        except (pa.ArrowException, OSError) as exc:
            raise InputError(f"{p}: not a readable Parquet file ({exc})") from None
        if not is_samples_table(names):
            near_samples_table(p, names)
            return None
        return _table(p)
    return None


def _plan_samples(directory: Path) -> StoredSamples:
    """A plan directory's samples, through `Plan`: checked against the plan file's fingerprints, its token store
    against its digest; its scan record with where the source files were."""
    try:
        plan = Plan(directory)
        table = plan.samples_table()
        tokens = plan.tokens()
    except (StoreError, PlanMismatchError) as exc:
        raise InputError(f"{exc}") from None
    check_samples(table, directory / SAMPLES_FILE)
    record = plan.scan_record.but(source_paths=plan.manifest.data.source)
    return StoredSamples("plan", directory / SAMPLES_FILE, table, record, tokens.path if tokens else None, plan)


def _table(f: Path) -> StoredSamples:
    """A bare samples table: a scan's samples file on its own still carries its scan's options (sequence_len,
    shift: `plancc.build.carry`); any other records nothing of how it was made."""
    table = read_samples(f)
    check_samples(table, f)
    try:
        meta = read_file_meta(f)
    except StoreError:
        meta = {}  # written by another engine: fine, the plan recomputes its fingerprints
    options = RecordedOptions.from_metadata(meta.get("settings")) if meta.get("kind") == "samples" else None
    return StoredSamples("table", f, table, ScanRecord.of(options=options) if options is not None else ScanRecord(),
                         None)

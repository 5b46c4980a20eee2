"""A compile's samples: read from a samples table, scan directory or plan directory (`open_stored`), or scanned from
a raw source through the scan cache (`scan_source`), with the scan record that says how they were made."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from plancc.config.settings import ScanOptions
from plancc.errors import InputError
from plancc.store import plan_files, schemas
from plancc.store.plan import Plan
from plancc.store.scan_record import ScanRecord

if TYPE_CHECKING:  # the scanner loads tokenizers and source readers: imported only for a raw source
    from plancc.scan.scanner import Progress


@dataclass(frozen=True)
class Samples:
    """The samples a plan is compiled from: the samples table, the scan record saying how they were made (its
    `source_paths`: where the source files are now) and the token store folder (None: a bare samples table); for
    a recipe, each sample's position in the mixture (`index`) and what the manifest says of each dataset."""

    table: pa.Table
    record: ScanRecord
    tokens: Path | None
    index: np.ndarray | None = None
    datasets: list[dict[str, Any]] | None = None


def open_stored(source: str) -> Samples | None:
    """The samples of a samples table, scan dir or plan dir, with its scan record and token store; None for a raw
    source (to scan)."""
    given = plan_files.read_samples_source(source)
    if given is None:
        return None
    table, info = given
    tokenized = Path(info["tokenized_path"]) if info.get("tokenized_path") else None
    record = info["record"]
    if record is not None:
        if record.part is not None:
            part = record.part
            raise InputError(f"{source} is a partial scan (rows {part.lo}..{part.hi - 1} of {part.rows}, from "
                             "`plancc scan --shard`): join every part first with `plancc merge PART_DIR... -o "
                             "SCAN_DIR`, then compile SCAN_DIR")
        return Samples(table, record, tokenized)
    folder = Path(info["path"]).parent
    if (folder / schemas.PLAN_FILE).is_file():  # a plan directory: its plan file's metadata is the record
        plan = Plan(folder)
        return Samples(table, plan.scan_record.but(source_paths=tuple(plan.manifest["data"].get("source", []))),
                       tokenized)
    options = info["scan_options"]  # a scan's samples.parquet alone: the options it was made under
    return Samples(table, ScanRecord.of(options=options) if options is not None else ScanRecord(), None)


def scan_source(source: str, options: ScanOptions, *, num_proc: int = 1, cache_dir: Path | None = None,
                progress: Progress = None) -> Samples:
    """The samples of a raw source, scanned with `options` (or found in the scan cache)."""
    from plancc.scan import scanner  # tokenizers and source readers: only for a raw source

    result = scanner.scan(source, options, num_proc=num_proc, cache_dir=cache_dir, progress=progress)
    return Samples(result.samples, result.report.but(source_paths=tuple(result.source_paths)), result.tokenized_path)

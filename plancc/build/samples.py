"""A compile's samples: read from a samples table, scan directory or plan directory (`open_stored`, through `open_samples`), or scanned from
a raw source through the scan cache (`scan_source`), with the scan record that says how they were made."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from plancc.config.settings import ScanOptions
from plancc.errors import InputError
from plancc.store.samples_source import open_samples
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
    """The samples of a samples table, scan dir or plan dir (`open_samples`), with its scan record and token store;
    None for a raw source (to scan)."""
    stored = open_samples(source)
    if stored is None:
        return None
    part = stored.record.part
    if part is not None:
        raise InputError(f"{source} is a partial scan (rows {part.lo}..{part.hi - 1} of {part.rows}, from "
                         "`plancc scan --shard`): join every part first with `plancc merge PART_DIR... -o "
                         "SCAN_DIR`, then compile SCAN_DIR")
    return Samples(stored.table, stored.record, stored.tokens)


def scan_source(source: str, options: ScanOptions, *, num_proc: int = 1, cache_dir: Path | None = None,
                progress: Progress = None) -> Samples:
    """The samples of a raw source, scanned with `options` (or found in the scan cache)."""
    from plancc.scan import scanner  # tokenizers and source readers: only for a raw source

    result = scanner.scan(source, options, num_proc=num_proc, cache_dir=cache_dir, progress=progress)
    return Samples(result.samples, result.report.but(source_paths=tuple(result.source_paths)), result.tokenized_path)

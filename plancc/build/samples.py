"""A compile's samples: read from a samples table, scan directory or plan directory (`open_samples`), or scanned
from a raw source (through the scan cache), with the scan record that says how they were made."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa

from plancc.config.settings import ScanOptions
from plancc.errors import InputError
from plancc.store.samples_source import open_samples
from plancc.store.scan_record import ScanRecord

if TYPE_CHECKING:  # the scanner loads tokenizers and source readers: imported only for a raw source
    from plancc.scan.scanner import Progress


def load_samples(source: str, scan_options: ScanOptions, *, num_proc: int = 1, cache_dir: Path | None = None,
                 progress: Progress = None) -> tuple[pa.Table, ScanRecord, Path | None]:
    """(samples table, scan record, token store folder or None) from a samples table, scan dir, plan dir or raw
    source; the record's `source_paths` are where the source files are now."""
    stored = open_samples(source)
    if stored is not None:  # a samples table, scan dir or plan dir: carry its scan record and tokenized rows along
        part = stored.record.part
        if part is not None:
            raise InputError(f"{source} is a partial scan (rows {part.lo}..{part.hi - 1} of {part.rows}, from "
                             "`plancc scan --shard`): join every part first with `plancc merge PART_DIR... -o "
                             "SCAN_DIR`, then compile SCAN_DIR")
        return stored.table, stored.record, stored.tokens
    from plancc.scan import scanner  # tokenizers and source readers: only for a raw source

    result = scanner.scan(source, scan_options, num_proc=num_proc, cache_dir=cache_dir, progress=progress)
    return result.samples, result.report.but(source_paths=tuple(result.source_paths)), result.tokenized_path

"""A compile's samples: read from a samples table, scan directory or plan directory, or scanned from a raw source
(through the scan cache), with the scan report that says how they were made."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from plancc.config import ScanOptions
from plancc.errors import InputError
from plancc.store import parquet, plan_files, schemas

if TYPE_CHECKING:  # the scanner loads tokenizers and source readers: imported only for a raw source
    from plancc.scan.scanner import Progress


def load_samples(source: str, scan_options: ScanOptions, *, num_proc: int = 1, cache_dir: Path | None = None,
                 progress: Progress = None) -> tuple[pa.Table, dict[str, Any], Path | None]:
    """(samples table, scan info, token store folder or None) from a samples table, scan dir, plan dir or raw source."""
    given = plan_files.read_samples_source(source)
    if given is not None:  # a samples table, scan dir or plan dir: carry its scan report and tokenized rows along
        table, info = given
        tokenized = Path(info["tokenized_path"]) if info.get("tokenized_path") else None
        manifest = Path(info["path"]).parent / schemas.MANIFEST_FILE
        if info.get("report"):
            part = info["report"].get("part")
            if part:
                raise InputError(f"{source} is a partial scan (rows {part['lo']}..{part['hi'] - 1} of "
                                 f"{part['rows']}, from `plancc scan --shard`): join every part first with "
                                 "`plancc merge PART_DIR... -o SCAN_DIR`, then compile SCAN_DIR")
            return table, info["report"], tokenized
        if manifest.is_file():
            previous = parquet.read_manifest(manifest.parent)
            return table, {**previous["scan"], "source_paths": previous["data"].get("source", [])}, tokenized
        # a scan's samples.parquet on its own still carries its scan's options (sequence_len, shift: `carry`)
        return table, ({"options": info["scan_options"]} if info.get("scan_options") else {}), None
    from plancc.scan import scanner  # tokenizers and source readers: only for a raw source

    result = scanner.scan(source, scan_options, num_proc=num_proc, cache_dir=cache_dir, progress=progress)
    return result.samples, {**result.report, "source_paths": result.source_paths}, result.tokenized_path

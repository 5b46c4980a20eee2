"""A scan directory (`plancc scan -o`, a `--shard` part, a scan cache entry): its samples table, token store and
record (`scan.json`), opened and checked against each other in one place.

`ScanDir.open` reads the record; `samples()` reads the samples table and checks it still hashes to the
fingerprints the record holds, and its token store (when there is one) to the same: a scan whose rows were
edited or whose store was swapped in from another scan is refused, naming the file, before anything is planned
from it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from plancc.errors import InputError
from plancc.store import token_store
from plancc.store.parquet import file_metadata, read_samples, write_parquet
from plancc.store.samples import samples_fingerprints
from plancc.store.scan_record import ScanRecord
from plancc.store.schemas import SAMPLES_FILE, SCAN_MANIFEST_FILE, TOKENS_DIR


class ScanDirError(InputError):
    """A scan directory without its samples table."""


@dataclass(frozen=True)
class ScanDir:
    """An opened scan directory: where it is and its record."""

    path: Path
    record: ScanRecord

    @staticmethod
    def open(path: str | Path) -> ScanDir:
        """The scan directory at `path` (ScanRecordError naming its scan.json when that is missing or malformed;
        ScanDirError when it has no samples table)."""
        p = Path(path)
        record = ScanRecord.read(p)
        if not (p / SAMPLES_FILE).is_file():
            raise ScanDirError(f"{p} is a plancc scan directory without its {SAMPLES_FILE}: it was deleted or moved; "
                               "scan the source again")
        return ScanDir(p, record)

    @property
    def record_file(self) -> Path:
        """The record's file (for messages)."""
        return self.path / SCAN_MANIFEST_FILE

    @property
    def samples_file(self) -> Path:
        """The samples table's file."""
        return self.path / SAMPLES_FILE

    @property
    def tokens(self) -> Path | None:
        """The token store folder, None when the scan has none."""
        tokens = self.path / TOKENS_DIR
        return tokens if token_store.is_store(tokens) else None

    def samples(self) -> pa.Table:
        """The samples table, checked against the record's fingerprints, and the token store's header against the
        same (an InputError naming what disagrees; a StoreError or TokenStoreError
        for a file that cannot be read)."""
        table = read_samples(self.samples_file)
        self.check(table)
        return table

    def check(self, table: pa.Table) -> None:
        """`table` (this scan's samples, read) against the record's fingerprints, and the token store's header
        against the same: an InputError naming what disagrees."""
        found, recorded = samples_fingerprints(table, self.record.identity), self.record.fingerprint_map
        for key in ("dataset", "metadata"):
            if found[key] != recorded.get(key):
                raise InputError(f"{self.samples_file}: its rows do not hash to the {key} fingerprint "
                                 f"{self.record_file} records (the samples table was edited or swapped in): rescan "
                                 "the source")
        tokens = self.tokens
        if tokens is not None and token_store.open_store(tokens).header["fingerprints"] != recorded:
            raise InputError(f"{tokens}: its fingerprints are not those {self.record_file} records (the token store "
                             "was swapped in from another scan): rescan the source")

    def write(self, samples: pa.Table) -> None:
        """The samples table and the record into this (fresh) directory; the token store is the caller's."""
        options = self.record.options.to_json() if self.record.options is not None else {}
        write_parquet(samples, self.samples_file, file_metadata("samples", self.record.fingerprint_map, options))
        self.record.write(self.path)

"""A source's rows by global row range, read a range at a time: what a scan shard reads.

The **manifest** lists the source's files in sorted order with their row counts; a row's global index (its
`sample_id`) is its file's first row plus its row in the file. So any reader of any range, in any process or on
any machine, sees the same rows under the same ids, and a sharded scan needs no coordination but the manifest:

    files  a.jsonl (3 rows)   b.jsonl (2 rows)
    rows   0 1 2              3 4              shard [2, 4) = a.jsonl row 2 + b.jsonl row 0

Memory follows the range, not the source (each file type's reader is `plancc.store.data_files`): JSON lines stream
line by line, Parquet by row group, Arrow IPC by record batch (memory-mapped). A `.json` array or `.csv` file is parsed whole (one file at a time: memory grows with the
largest file, not with the number of files), a `save_to_disk` directory or Hub dataset is memory-mapped by
`datasets`. `RowReader` keeps the file it read last open, so consecutive ranges (a local scan's shards) read
each file once, and never more than one file is open; a range far into a JSON lines file skips the lines before
it without parsing them.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from plancc.errors import InputError
from plancc.scan.sources.read import Located, Source, _combine, read_source
from plancc.store.data_files import Rows, open_rows


@dataclass(frozen=True)
class Manifest:
    """The rows of a source: `files` as (path, row count) in sorted file order (a directory or Hub dataset is one
    entry). JSON-able (`to_dict`/`from_dict`) so that a shard job on another machine reads the same rows."""

    source: str
    kind: str  # Located.kind: "files" | "directory" | "hub"
    files: tuple[tuple[str, int], ...]
    split: str | None = None

    @property
    def rows(self) -> int:
        """Rows in all files."""
        return sum(n for _, n in self.files)

    def named_files(self) -> tuple[tuple[str, int], ...]:
        """(name, rows) of each file, named relative to the folder the files share (a lone file by its base name):
        where a sample's row is, without this machine's paths (`ScanRecord.source_files`)."""
        paths = [os.path.abspath(p) for p, _ in self.files]
        top = os.path.commonpath([os.path.dirname(p) for p in paths])
        return tuple((os.path.relpath(p, top), n) for p, (_, n) in zip(paths, self.files, strict=True))

    def to_dict(self) -> dict[str, Any]:
        """The manifest as JSON-able data."""
        return {"source": self.source, "kind": self.kind, "files": [list(f) for f in self.files], "split": self.split}

    @staticmethod
    def from_dict(d: dict[str, Any]) -> Manifest:
        """The manifest `to_dict` wrote."""
        return Manifest(d["source"], d["kind"], tuple((str(p), int(n)) for p, n in d["files"]), d.get("split"))


# ---------------------------------------------------------------- the reader


class RowReader:
    """Rows [lo, hi) of a located source as one `Source` (global ids: row i of it is sample lo + i)."""

    def __init__(self, loc: Located, split: str | None = None, *, manifest: Manifest | None = None):
        """`manifest`: the counts a coordinator already took (a shard worker trusts them instead of recounting)."""
        if split is not None and loc.kind == "files":
            raise InputError(f"{loc.source}: --split {split} applies to dataset directories and Hub ids, not to "
                             "files")
        self.loc, self.split = loc, split
        self.current: tuple[str, Rows] | None = None  # one file open at a time: bounded memory and descriptors
        self.whole: Source | None = None  # a directory or Hub dataset: memory-mapped by datasets
        if loc.kind != "files":
            self.whole = read_source(loc, split)
            counts = [(loc.source, self.whole.num_rows)]
        elif manifest is None:
            counts = [(p, self._cursor(p).count()) for p in loc.paths]
        self.manifest = manifest or Manifest(loc.source, loc.kind, tuple(counts), split)
        if self.manifest.rows == 0:
            raise InputError(f"{loc.source}: the dataset is empty (no rows)")

    @property
    def paths(self) -> list[str]:
        """The files the rows come from (a dataset directory's or Hub dataset's Arrow files)."""
        return list(self.whole.paths) if self.whole is not None else list(self.loc.paths)

    def _cursor(self, path: str):
        if self.current is None or self.current[0] != path:
            self.close()
            self.current = (path, open_rows(path))
        return self.current[1]

    @property
    def notes(self) -> list[str]:
        """Notes the whole-file reader gave (e.g. which split was used)."""
        return list(self.whole.notes) if self.whole is not None else []

    @property
    def fingerprint(self) -> str:
        """The source's content fingerprint."""
        return self.loc.fingerprint or (self.whole.fingerprint if self.whole is not None else "")

    def read(self, lo: int, hi: int) -> Source:
        """Source rows [lo, hi) as a Source (file, row and line kept for error messages)."""
        if not 0 <= lo <= hi <= self.manifest.rows:
            raise ValueError(f"rows [{lo}, {hi}) outside the source's {self.manifest.rows} rows")
        if self.whole is not None:
            w = self.whole
            return dataclasses.replace(w, table=w.table.slice(lo, hi - lo), loose={k: v[lo:hi] for k, v in
                                       w.loose.items()}, num_rows=hi - lo, files=[(w.files[0][0], 0, hi - lo)],
                                       row0={w.files[0][0]: lo})
        parts, row0, start = [], {}, 0
        for path, n in self.manifest.files:
            a, b = max(lo - start, 0), min(hi - start, n)
            if a < b:
                table, loose = self._cursor(path).read(a, b)
                parts.append((path, table, loose))
                row0[path] = a
            start += n
        kind = "glob" if len(self.manifest.files) > 1 else Path(self.manifest.files[0][0]).suffix[1:]
        src = _combine(parts, kind, self.loc.fingerprint or "")
        src.paths, src.row0 = [p for p, _ in self.manifest.files], row0
        return src

    def close(self) -> None:
        """Close the open file, if any."""
        if self.current is not None:
            self.current[1].close()
            self.current = None

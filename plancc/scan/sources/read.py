"""Read a SOURCE (file, glob, `save_to_disk` directory or Hub id) into one Arrow table, remembering where rows came from.

Files are read by their suffix through the one table of file types (`plancc.store.data_files`, which the runtime
reads `data=` through too). A column whose JSON values have mixed types is kept as a Python list (`Source.loose`)
instead of failing the read: it is only an error if the chosen format needs it, and then the format's module
(`plancc.scan.formats`) names its first bad row. A scan reads row ranges through `sources.rows`.
"""

from __future__ import annotations

import fnmatch
import glob as globlib
import hashlib
import os
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from plancc.core.paths import not_regular
from plancc.errors import InputError, PlanccWarning
from plancc.store.data_files import SUFFIXES, read_file
from plancc.store.json_rows import parsed_rows


@dataclass
class Source:
    """Rows of a source: typed columns in `table`, mixed-type JSON columns in `loose` (Python lists)."""

    table: pa.Table
    loose: dict[str, list[Any]]
    files: list[tuple[str, int, int]]  # (path, first global row, row count)
    paths: list[str]
    fingerprint: str
    kind: str
    num_rows: int = 0
    notes: list[str] = field(default_factory=list)  # what the user should hear (e.g. which split was used)
    row0: dict[str, int] = field(default_factory=dict)  # a range of a file (sources.rows): its first row's index
    renamed: dict[str, str] = field(default_factory=dict)  # column -> the file's field it was read from (--columns)
    _lines: dict[str, list[int]] = field(default_factory=dict, repr=False)

    @property
    def column_names(self) -> list[str]:
        """Every column: the typed ones in `table`, then the mixed-type ones in `loose`."""
        return [*self.table.column_names, *self.loose]

    def where(self, row: int) -> str:
        """Human location of a global row: file, row inside the file and, for JSON lines, the line number."""
        for path, start, count in self.files:
            if start <= row < start + count:
                local = row - start + self.row0.get(path, 0)
                text = f"{path} row {local}"
                if path.endswith(".jsonl") or path in self._lines:
                    line = self._line_of(path, local)
                    if line is not None:
                        text += f" (line {line})"
                return text
        return f"{self.paths[0] if self.paths else '?'} row {row}"

    def json_values(self, column: str) -> Iterator[tuple[int, Any]]:
        """(row, value) of `column` in the rows from JSON files, parsed again from their text (an integer stays an
        integer there, where Arrow made the column floats): what a format names its first bad row by."""
        name = self.renamed.get(column, column)
        for path, start, count in self.files:
            if Path(path).suffix.lower() in (".json", ".jsonl"):
                for k, row in enumerate(parsed_rows(path, self.row0.get(path, 0), count)):
                    yield start + k, row.get(name) if isinstance(row, dict) else None

    def _line_of(self, path: str, local: int) -> int | None:
        if path not in self._lines:
            try:
                with open(path, "rb") as f:
                    self._lines[path] = [i for i, ln in enumerate(f, 1) if ln.strip()]
            except OSError:
                return None
        lines = self._lines[path]
        return lines[local] if local < len(lines) else None


def _file_digest(paths: list[str]) -> str:
    h = hashlib.blake2b(digest_size=16)
    for p in paths:
        h.update(os.path.basename(p).encode() + b"\0")
        with open(p, "rb") as f:
            while chunk := f.read(1 << 22):
                h.update(chunk)
    return h.hexdigest()


# ---------------------------------------------------------------- sources


def _combine(parts: list[tuple[str, pa.Table, dict[str, list[Any]]]], kind: str, fingerprint: str) -> Source:
    loose_names = {name for _, _, loose in parts for name in loose}
    tables, loose_all, files, start = [], {n: [] for n in loose_names}, [], 0
    for path, table, loose in parts:
        n = table.num_rows if table.num_columns else (len(next(iter(loose.values()))) if loose else 0)
        for name in loose_names:
            if name in loose:
                loose_all[name].extend(loose[name])
            elif name in table.column_names:
                loose_all[name].extend(table.column(name).to_pylist())
                table = table.drop([name])
            else:
                loose_all[name].extend([None] * n)
        if table.num_columns == 0 and n:
            table = pa.table({"__rows": pa.nulls(n)})
        tables.append(table)
        files.append((path, start, n))
        start += n
    if len(tables) == 1:
        table = tables[0]
    else:
        try:
            table = pa.concat_tables(tables, promote_options="permissive")
        except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            raise InputError(f"files of {kind} source have incompatible columns: {exc}") from None
    if "__rows" in table.column_names:
        table = table.drop(["__rows"])
    return Source(table=table, loose=loose_all, files=files, paths=[p for p, _, _ in parts],
                  fingerprint=fingerprint, kind=kind, num_rows=start)


def _expand(source: str) -> list[str] | None:
    """Absolute paths of the files SOURCE names: a path that exists is taken literally (`train[v2].jsonl`), else
    a glob; None for a directory or something that is not local."""
    p = Path(source).expanduser()
    if p.is_file():
        return [os.path.abspath(p)]
    special = not_regular(p, "a source from regular files or a directory")
    if special:
        raise InputError(special)
    if p.exists() or not globlib.has_magic(source):
        return None
    matches = _unique_files(_glob(os.path.expanduser(source)))
    if not matches:
        raise InputError(f"no files match {source}")
    return matches


def _unique_files(found: list[str]) -> list[str]:
    """Files among `found`, sorted, each real file once (the first of its names through symlinks)."""
    seen: dict[str, str] = {}
    for path in sorted(os.path.abspath(f) for f in found if os.path.isfile(f)):
        first = seen.setdefault(os.path.realpath(path), path)
        if first != path:
            warnings.warn(f"{path} is the same file as {first}: read once", PlanccWarning, stacklevel=3)
    return list(seen.values())


def _glob(pattern: str) -> list[str]:
    """Paths matching `pattern` (`*`, `?`, `[...]`; `**` any number of directories; hidden names only when the
    pattern spells the dot). `**` walks the tree itself: a directory reached twice (a symlink loop, or a second
    link to a searched directory) is skipped with a warning instead of searched again, forever."""
    if "**" not in pattern:
        _listable(os.path.dirname(pattern), pattern)
        return globlib.glob(pattern)
    parts = pattern.split("/")
    fixed = next(i for i, part in enumerate(parts) if globlib.has_magic(part))
    root = "/".join(parts[:fixed]) or ("/" if pattern.startswith("/") else ".")
    pats = parts[fixed:]
    found, visited = [], set()

    def unreadable(exc: OSError) -> None:
        rel = os.path.relpath(exc.filename, root).split(os.sep)
        if not any(name.startswith(".") and name != "." for name in rel):  # hidden: the pattern never looks in it
            raise _unreadable(exc.filename, exc, pattern)

    for dirpath, dirnames, filenames in os.walk(root, onerror=unreadable, followlinks=True):
        st = os.stat(dirpath)
        visited.add((st.st_dev, st.st_ino))
        keep = []
        for d in sorted(dirnames):
            full = os.path.join(dirpath, d)
            try:
                st = os.stat(full)
            except OSError:
                continue
            if (st.st_dev, st.st_ino) in visited:
                warnings.warn(f"{full} is a directory already searched (a symlink loop, or a second link to "
                              "it): skipped", PlanccWarning, stacklevel=4)
            else:
                visited.add((st.st_dev, st.st_ino))
                keep.append(d)
        dirnames[:] = keep
        rel = [] if dirpath == root else os.path.relpath(dirpath, root).split(os.sep)
        found += [os.path.join(dirpath, f) for f in filenames if _match([*rel, f], pats)]
    return found


def _unreadable(directory: str, exc: OSError, pattern: str) -> InputError:
    return InputError(f"{directory}: cannot read directory ({exc.strerror}): {pattern} would miss the files in it; "
                      "make it readable or narrow the pattern")


def _listable(parent: str, pattern: str) -> None:
    """Every directory `pattern` searches can be listed: `glob` skips one it cannot read, and its files with it."""
    if not globlib.has_magic(parent):
        return
    _listable(os.path.dirname(parent), pattern)
    for d in globlib.glob(parent):
        try:
            with os.scandir(d):
                pass
        except NotADirectoryError:
            continue
        except OSError as exc:
            raise _unreadable(d, exc, pattern) from None


def _match(names: list[str], pats: list[str]) -> bool:
    if not pats:
        return not names
    if pats[0] == "**":
        return any(_match(names[i:], pats[1:]) for i in range(len(names) + 1)
                   if not any(n.startswith(".") for n in names[:i]))
    return (bool(names) and fnmatch.fnmatchcase(names[0], pats[0])
            and (not names[0].startswith(".") or pats[0].startswith(".")) and _match(names[1:], pats[1:]))


def _pick_split(where: str, splits: list[str], split: str | None) -> tuple[str, list[str]]:
    """The split to read from a dataset dict: `--split`, else `train` (said in a note), else an error."""
    if split is not None:
        if split not in splits:
            raise InputError(f"{where}: --split {split}: no such split (splits: {', '.join(splits)})")
        return split, []
    if "train" not in splits:
        raise InputError(f"{where}: dataset dict has no 'train' split: pass --split (splits: {', '.join(splits)})")
    return "train", ([f"{where}: dataset dict: using split 'train' of {', '.join(splits)} (choose with --split)"]
                     if len(splits) > 1 else [f"{where}: dataset dict: using its split 'train' (--split)"])


def _saved_dataset(path: Path, split: str | None) -> Source:
    import datasets

    try:
        ds = datasets.load_from_disk(str(path))
    except Exception as exc:  # datasets raises many unrelated types here
        raise InputError(f"{path}: cannot load dataset directory ({exc})") from None
    notes: list[str] = []
    if isinstance(ds, datasets.DatasetDict):
        split, notes = _pick_split(str(path), list(ds), split)
        ds = ds[split]
    elif split is not None:
        raise InputError(f"{path}: --split {split}: this directory holds one dataset, not a dataset dict")
    files = [f["filename"] for f in ds.cache_files]
    table = ds.with_format("arrow")[:] if ds._indices is not None else ds.data.table
    fp = hashlib.blake2b((_file_digest(files) + str(ds._fingerprint)).encode(), digest_size=16).hexdigest()
    return Source(table=table, loose={}, files=[(str(path), 0, table.num_rows)], paths=files or [str(path)],
                  fingerprint=fp, kind="dataset directory", num_rows=table.num_rows, notes=notes)


def _hub_reachable(timeout: float = 3.0) -> bool:
    """One short TCP probe, so an unreachable Hub answers in seconds instead of minutes of retries."""
    import socket
    from urllib.parse import urlparse

    url = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    try:
        socket.create_connection((url.hostname or "huggingface.co", url.port or 443), timeout=timeout).close()
        return True
    except OSError:
        return False


def _hub_dataset(source: str, split: str | None) -> Source:
    offline = any(os.environ.get(v, "").upper() in ("1", "ON", "YES", "TRUE")
                  for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))
    reason_offline = " (offline: HF_HUB_OFFLINE is set)" if offline else ""
    if not offline and not _hub_reachable():
        offline, reason_offline = True, " (the Hub is not reachable from here)"
    import datasets

    saved = datasets.config.HF_HUB_OFFLINE
    try:
        datasets.config.HF_HUB_OFFLINE = saved or offline  # offline: only the local datasets cache is tried
        ds = datasets.load_dataset(source, split=split or "train")
    except Exception as exc:  # network, not found, gated, offline: all one answer for the user
        reason = str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__
        raise InputError(
            f"{source}: not a local file, glob or dataset directory, and the Hub dataset could not be loaded"
            f"{reason_offline}: {reason}"
        ) from None
    finally:
        datasets.config.HF_HUB_OFFLINE = saved
    files = [f["filename"] for f in ds.cache_files]
    table = ds.data.table
    notes = [] if split else [f"{source}: using split 'train' of the Hub dataset (choose with --split)"]
    return Source(table=table, loose={}, files=[(source, 0, table.num_rows)], paths=files,
                  fingerprint=f"hub:{source}:{ds._fingerprint}", kind="hub", num_rows=table.num_rows, notes=notes)


def _looks_local(source: str) -> bool:
    first = Path(source).expanduser().parts[0] if source else ""
    return (Path(source).suffix.lower() in SUFFIXES or source.startswith((".", "/", "~"))
            or source.count("/") > 1 or (os.sep in source and Path(first).exists()))


@dataclass(frozen=True)
class Located:
    """Where a SOURCE lives, found without parsing it: local files (with a content fingerprint), a dataset
    directory, or a Hub id (fingerprint known only after loading)."""

    source: str
    kind: str  # "files" | "directory" | "hub"
    paths: tuple[str, ...]
    fingerprint: str | None


def locate(source: str) -> Located:
    """What `source` names (files or a glob, a saved dataset, a Hub id) and a digest of its content for the
    scan cache key."""
    paths = _expand(source)
    if paths is not None:
        return Located(source, "files", tuple(paths), _file_digest(paths))
    d = Path(source).expanduser().absolute()  # recorded absolute: a plan is used from other folders
    if d.is_dir():
        if any((d / n).exists() for n in ("state.json", "dataset_dict.json", "dataset_info.json")):
            files = sorted(str(p) for p in d.rglob("*") if p.is_file() and p.suffix != ".lock")
            return Located(str(d), "directory", (str(d),), _file_digest(files))
        files = sorted(str(p) for p in d.iterdir() if p.is_file() and p.suffix.lower() in SUFFIXES)
        if not files:
            raise InputError(f"{d}: directory holds no dataset (no save_to_disk files, no {', '.join(SUFFIXES)})")
        suffix = Path(files[0]).suffix
        files = [f for f in files if f.endswith(suffix)]
        return Located(source, "files", tuple(files), _file_digest(files))
    if _looks_local(source):
        raise InputError(f"{source}: no such file or directory")
    return Located(source, "hub", (), None)


def read_source(source: str | Located, split: str | None = None) -> Source:
    """Read a located SOURCE (`split`: of a dataset dict or Hub dataset); raises InputError naming the file (and
    line) that cannot be used."""
    loc = source if isinstance(source, Located) else locate(source)
    if split is not None and loc.kind == "files":
        raise InputError(f"{loc.source}: --split {split} applies to dataset directories and Hub ids, not to files")
    if loc.kind == "files":
        parts = [(p, *read_file(p)) for p in loc.paths]
        src = _combine(parts, "glob" if len(parts) > 1 else Path(loc.paths[0]).suffix[1:], loc.fingerprint or "")
    elif loc.kind == "directory":
        src = _saved_dataset(Path(loc.paths[0]), split)
        src.fingerprint = loc.fingerprint or src.fingerprint
    else:
        src = _hub_dataset(loc.source, split)
    if src.num_rows == 0:
        raise InputError(f"{loc.source}: the dataset is empty (no rows)")
    return src

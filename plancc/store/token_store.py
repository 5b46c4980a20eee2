"""The token store: the tokenized dataset as flat `.npy` arrays that every reader memory-maps, with chunk hashes.

A store is a directory (`tokens/` in a scan or plan directory)::

    input_ids.npy     int32 [T]     every row's tokens, concatenated (row = sample_id)
    labels.npy        int32 [T]     labels, same layout (already shifted when the scan ran with --shift none)
    offsets.npy       int64 [N+1]   row i = input_ids[offsets[i]:offsets[i+1]]
    chunks.npy        int64 [C+1]   chunk k = rows chunks[k]:chunks[k+1] (whole rows, ~CHUNK_TOKENS tokens)
    chunk_hashes.npy  uint64 [C]    xxh3-64 of chunk k: its row lengths, then its ids, then its labels
    tokens.json       counts, chunk size, the largest id, the samples' dataset/metadata fingerprints, a hash of
                      the chunk index, and `header_hash`: a hash of all of its own other values

Why flat `.npy` and not Arrow IPC: one contiguous array per column is what the collator gathers from (one
vectorized index over all samples, no record-batch boundaries, no int32 list-offset limit at 2**31 tokens), and
`numpy.load(mmap_mode="r")` maps it with no copy and no dependency: pages come from the OS page cache, shared by
every rank of a node, and a process's memory grows only with the pages it touches. The format is readable by any
tool (numpy, or plain offsets arithmetic); `to_table` wraps the maps as a zero-copy Arrow table with
`input_ids`/`labels` columns that `datasets.Dataset(table)` accepts.

A **multi-part** store (a sharded or streamed scan, `plancc merge`) is a directory of single stores, one per
part in row order, under a header of format `plancc.tokens-parts/2` that lists them (`dir`, `rows`, `tokens`,
`index_hash`, `header_hash`: a part swapped, truncated or rewritten is refused) with the whole dataset's counts,
largest id, fingerprints and its own `header_hash`::

    tokens/tokens.json   {"format": "plancc.tokens-parts/2", "parts": [{"dir": "part-00000", ...}, ...], ...}
    tokens/part-00000/   a single store: rows 0 .. n0-1 of the dataset
    tokens/part-00001/   rows n0 .. n0+n1-1

`open_store` opens it as one dataset from its header alone (`token_parts`): a part is opened, checked against the
header's record of it and mapped the first time one of its rows is read, so that opening costs the same for 1 part
or 1,000; `input_ids`/`labels` index like one array (a row never spans two parts, so a row's slice is a view of one
part's map) and `offsets` like the whole store's. Every array is mapped without holding a descriptor (`token_parts.map_array`): a
process needs one descriptor per multi-part store, whatever its parts and whatever it reads. Stores are written,
joined into parts and placed by hard links in `token_writer`.

Verification scales with what a reader touches: `open_store` checks the header (its `header_hash`: a value such as
`chunk_tokens` or `max_id` that nothing else binds is edited in vain), every file's size and dtype, the offsets' ends
and the chunk index hash (constant work whatever T); `verify_chunk` rehashes one chunk (64 KiB of ids and labels
at the default size, microseconds of hashing: docs/benchmarks.md) and is what readers call the first time they
touch a chunk; `verify_all` rehashes every chunk (and `parts_problem` opens every part). The dataset fingerprint
keeps its meaning: it is computed from the samples table's per-sample `token_hash`, which the store records at
write and a plan compares at open.
"""

from __future__ import annotations

import os
import stat
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import orjson
import xxhash

from plancc.core.plan_arrays import IGNORE_INDEX
from plancc.errors import PlanccError, descriptors_hint, out_of_descriptors
from plancc.store.schemas import TOKENS_DIR
from plancc.store.token_parts import Concat, Joined, PartOffsets, Parts, map_array

FORMAT = "plancc.tokens/2"  # 2: the header carries header_hash (1 did not: an edited chunk_tokens went unseen)
HEADER_FILE = "tokens.json"
ARRAYS = {  # file stem -> dtype
    "input_ids": np.dtype("<i4"),
    "labels": np.dtype("<i4"),
    "offsets": np.dtype("<i8"),
    "chunks": np.dtype("<i8"),
    "chunk_hashes": np.dtype("<u8"),
}
CHUNK_TOKENS = 8192
HEADER_KEYS = sorted(["chunk_tokens", "chunks", "fingerprints", "format", "header_hash", "index_hash",
                      "labels_shifted", "max_id", "rows", "tokens"])
PARTS_FORMAT = "plancc.tokens-parts/2"
PARTS_KEYS = sorted(["fingerprints", "format", "header_hash", "labels_shifted", "max_id", "parts", "rows", "tokens"])
PART_KEYS = sorted(["dir", "header_hash", "index_hash", "rows", "tokens"])  # one entry of a multi-part header's parts
OLD_FORMATS = ("plancc.tokens/1", "plancc.tokens-parts/1")


class TokenStoreError(PlanccError):
    """A token store is missing, truncated, foreign or changed; the message names the file (and the row)."""


class FileTypeError(PlanccError):
    """A path where plancc reads a file holds a FIFO, device, socket or directory: refused before any read."""


@dataclass(frozen=True)
class MappedTokens:
    """A store opened read-only: memory maps (no data read yet) and its header. A multi-part store's arrays are
    its parts' as one (`token_parts`: `Concat`, `PartOffsets`; `chunks` and `chunk_hashes` `Joined`, read only by
    checks of the whole store) and `parts` its parts (each a single store, mapped when first read); a single
    store's `parts` is empty."""

    path: Path
    input_ids: np.ndarray | Concat
    labels: np.ndarray | Concat
    offsets: np.ndarray | PartOffsets
    chunks: np.ndarray | Joined
    chunk_hashes: np.ndarray | Joined
    header: dict[str, Any]
    parts: Parts[MappedTokens] | tuple[()] = ()

    @property
    def num_chunks(self) -> int:
        """Hash chunks in the store."""
        return int(self.chunk_hashes.shape[0])

    @property
    def digest(self) -> str:
        """The store's content digest: its header's `header_hash`, which covers the chunk index hash (every chunk's
        hash) of the store or of each part; a plan records it and compares it at open (constant work)."""
        return self.header["header_hash"]


_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def open_file(path: str | Path, *, dir_fd: int | None = None, shown: str | Path | None = None) -> BinaryIO:
    """`path` (relative to `dir_fd` when given) opened read-only, refused unless it is a regular file.

    The type is checked on the open descriptor before anything is read: the open does not block (O_NONBLOCK) and a
    FIFO, device or socket would stall or stream forever, a directory is not the file asked for (`FileTypeError`).
    The file object stays valid when the path is later replaced (a plan recompiled with --overwrite): readers keep
    what they opened. The message names `shown` (default `path`); a failed open raises its OSError (the caller
    names the file its way).
    """
    shown = path if shown is None else shown
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0), dir_fd=dir_fd)
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        kind = next((name for test, name in _KINDS if test(mode)), "not a regular file")
        raise FileTypeError(f"{shown} is {kind}, not a regular file; plancc reads only regular files there")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb", buffering=0)


def open_dir(path: str | Path, error: type[PlanccError], *, dir_fd: int | None = None,
             shown: str | Path | None = None) -> int:
    """A directory descriptor for `path` (relative to `dir_fd`): files opened through it all come from this one
    directory even when its path is swapped for another meanwhile. Refuses anything but a directory."""
    shown = path if shown is None else shown
    try:
        return os.open(path, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0), dir_fd=dir_fd)
    except FileNotFoundError:
        raise
    except NotADirectoryError:
        raise error(f"{shown} is not a directory") from None
    except OSError as exc:
        raise error(f"{shown}: cannot open it{_why(exc)}") from None


# ---------------------------------------------------------------- hashes (what the writer records)


def chunk_bounds(offsets: np.ndarray, chunk_tokens: int = CHUNK_TOKENS) -> np.ndarray:
    """Row bounds of chunks of whole rows: a chunk starts at the first row starting at or after k*chunk_tokens."""
    total = int(offsets[-1])
    starts = np.searchsorted(offsets[:-1], np.arange(0, max(total, 1), chunk_tokens, dtype=np.int64), side="left")
    return np.unique(np.concatenate([[0], starts, [offsets.shape[0] - 1]])).astype(np.int64)


def chunk_hash(ids: np.ndarray, labels: np.ndarray, offsets: np.ndarray, lo: int, hi: int) -> int:
    """xxh3-64 of rows [lo, hi): their lengths (int64), then their ids and labels (int32, little-endian)."""
    a, b = int(offsets[lo]), int(offsets[hi])
    h = xxhash.xxh3_64()
    h.update(np.ascontiguousarray(np.diff(offsets[lo:hi + 1]), dtype="<i8").data)
    h.update(np.ascontiguousarray(ids[a:b], dtype="<i4").data)
    h.update(np.ascontiguousarray(labels[a:b], dtype="<i4").data)
    return h.intdigest()


def index_hash(chunks: np.ndarray, hashes: np.ndarray) -> str:
    """xxh3-128 of the chunk index (row bounds, then hashes): the header binds every chunk's hash through it."""
    return xxhash.xxh3_128_hexdigest(chunks.astype("<i8").tobytes() + hashes.astype("<u8").tobytes())


def header_hash(header: dict[str, Any]) -> str:
    """xxh3-128 of a header's values but `header_hash` itself, as canonical JSON (sorted keys): an edit of any
    value, or of its type (8192 -> 8192.0, a number -> a string), changes it; spacing and key order do not."""
    return xxhash.xxh3_128_hexdigest(orjson.dumps({k: v for k, v in header.items() if k != "header_hash"},
                                                  option=orjson.OPT_SORT_KEYS))


# ---------------------------------------------------------------- reading


def is_store(path: str | Path) -> bool:
    """Whether `path` holds a token store (its header file)."""
    return (Path(path) / HEADER_FILE).is_file()


def store_in(folder: str | Path) -> Path | None:
    """The token store a folder names: the folder itself, or the `tokens/` of a plan or scan directory; None for
    neither."""
    return next((p for p in (Path(folder), Path(folder) / TOKENS_DIR) if is_store(p)), None)


def _map(path: Path, dir_fd: int, name: str, length: int) -> np.ndarray:
    """Array `name` of the store opened through `dir_fd`, checked against the header's dtype and length, mapped."""
    where = f"token store {path}: {name}.npy"
    try:
        f = open_file(f"{name}.npy", dir_fd=dir_fd, shown=path / f"{name}.npy")
    except FileNotFoundError:
        raise TokenStoreError(f"{where} is missing") from None
    except OSError as exc:
        raise TokenStoreError(f"{where}: cannot read it{_why(exc)}") from None
    with f:
        try:
            version = np.lib.format.read_magic(f)
            read = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}[version]
            shape, _, dtype = read(f)  # 1-D: Fortran order is the same layout
        except Exception as exc:  # a damaged header reaches numpy's literal parser: SyntaxError, TokenError, ...
            raise TokenStoreError(f"{where} is not a readable .npy file ({type(exc).__name__}: {exc or 'empty'})"
                                  ) from None
        if dtype != ARRAYS[name] or len(shape) != 1 or shape[0] != length:
            raise TokenStoreError(f"{where} holds {dtype}[{shape}], its header says {ARRAYS[name]}[{length}] (a file "
                                  "was replaced or truncated)")
        offset, size = f.tell(), os.fstat(f.fileno()).st_size
        if offset + length * dtype.itemsize != size:
            raise TokenStoreError(f"{where} has {size - offset - length * dtype.itemsize} bytes beyond its array (a "
                                  "file was appended to or replaced)")
        try:
            return map_array(f, offset, dtype, length)
        except OSError as exc:
            raise TokenStoreError(f"{where}: cannot map it{_why(exc)}") from None


def _why(exc: OSError) -> str:
    """` (REASON)` of a failed open or map for a message, with what to do when the process ran out of file
    descriptors."""
    return f" ({exc.strerror or exc})" + (f"; {descriptors_hint()}" if out_of_descriptors(exc) else "")


def read_header(path: str | Path, dir_fd: int | None = None) -> dict[str, Any]:
    """A store's header (single or multi-part; read through `dir_fd` when given), refused unless it is this
    plancc's format and unedited: its values must hash to its `header_hash`."""
    path = Path(path)
    try:
        with open_file(HEADER_FILE if dir_fd is not None else path / HEADER_FILE, dir_fd=dir_fd,
                       shown=path / HEADER_FILE) as f:
            header = orjson.loads(f.read())
    except FileNotFoundError:
        raise TokenStoreError(f"{path} is not a token store (no {HEADER_FILE})") from None
    except OSError as exc:
        raise TokenStoreError(f"token store {path}: cannot read {HEADER_FILE}{_why(exc)}") from None
    except orjson.JSONDecodeError as exc:
        raise TokenStoreError(f"token store {path}: {HEADER_FILE} is not valid JSON ({exc})") from None
    got = header.get("format") if isinstance(header, dict) else None
    if got in OLD_FORMATS:
        raise TokenStoreError(f"token store {path}: {HEADER_FILE} has format {got!r}, written by an older plancc whose "
                              "header is not checksummed: recompile the plan (or rescan: `plancc scan`)")
    if got not in (FORMAT, PARTS_FORMAT):
        raise TokenStoreError(f"token store {path}: {HEADER_FILE} has format {got!r}; this plancc reads {FORMAT} and "
                              f"{PARTS_FORMAT}")
    if header.get("header_hash") != header_hash(header):
        raise TokenStoreError(f"token store {path}: {HEADER_FILE} was edited (its values do not hash to its "
                              f"header_hash {header.get('header_hash')!r})")
    return header


def _counts(header: dict[str, Any], names: tuple[str, ...]) -> bool:
    return all(type(header.get(n)) is int and header[n] >= 0 for n in names)


def open_store(path: str | Path, dir_fd: int | None = None) -> MappedTokens:
    """Map a store read-only after the constant-cost checks (header, sizes, dtypes, ends, index hash).

    Every file is opened once, through one descriptor of the store's directory (`dir_fd`, else `path` opened; a
    multi-part store holds a copy of it to open its parts when first read), so the store is read whole from the
    directory that was there at open, whatever later replaces its path."""
    path = Path(path)
    own = dir_fd is None
    if own:
        try:
            dir_fd = open_dir(path, TokenStoreError, shown=f"token store {path}")
        except FileNotFoundError:
            raise TokenStoreError(f"{path} is not a token store (it does not exist)") from None
    try:
        return _open_single(path, dir_fd)
    finally:
        if own:
            os.close(dir_fd)


def _open_single(path: Path, dir_fd: int) -> MappedTokens:
    header = read_header(path, dir_fd)
    if header["format"] == PARTS_FORMAT:
        return _open_parts(path, dir_fd, header)
    if (sorted(header) != HEADER_KEYS or not _counts(header, ("rows", "tokens", "chunks", "chunk_tokens"))
            or header["chunk_tokens"] < 1 or type(header["max_id"]) is not int
            or type(header["labels_shifted"]) is not bool or not isinstance(header["fingerprints"], dict)):
        raise TokenStoreError(f"token store {path}: {HEADER_FILE} has keys {sorted(header)} or values of the wrong "
                              f"type; a store's header holds exactly {HEADER_KEYS}")
    rows, tokens, chunks = header["rows"], header["tokens"], header["chunks"]
    lengths = {"input_ids": tokens, "labels": tokens, "offsets": rows + 1, "chunks": chunks + 1, "chunk_hashes": chunks}
    maps = {name: _map(path, dir_fd, name, n) for name, n in lengths.items()}
    m = MappedTokens(path, *(maps[n] for n in lengths), header)
    if int(m.offsets[0]) != 0 or int(m.offsets[-1]) != tokens or int(m.chunks[0]) != 0 or int(m.chunks[-1]) != rows:
        raise TokenStoreError(f"token store {path}: offsets.npy or chunks.npy does not span the store's "
                              f"{rows} rows and {tokens} tokens (a file was changed)")
    if index_hash(np.asarray(m.chunks), np.asarray(m.chunk_hashes)) != header.get("index_hash"):
        raise TokenStoreError(f"token store {path}: chunks.npy or chunk_hashes.npy changed since it was written")
    return m


def _open_parts(path: Path, dir_fd: int, header: dict[str, Any]) -> MappedTokens:
    """A multi-part store as one, from its header alone: each part is mapped (and bound to the header's record of
    it) the first time one of its rows is read (`token_parts`), through a descriptor of the store's folder, the
    one the store holds whatever its number of parts."""
    if (sorted(header) != PARTS_KEYS or not isinstance(header["parts"], list) or not header["parts"]
            or not _counts(header, ("rows", "tokens")) or type(header["labels_shifted"]) is not bool):
        raise TokenStoreError(f"token store {path}: {HEADER_FILE} has keys {sorted(header)}, values of the wrong type "
                              f"or no parts; a multi-part store's header holds exactly {PARTS_KEYS}")
    keys = set(PART_KEYS)
    for p in header["parts"]:  # a thousand parts: plain tests, no Path per part
        if not (type(p) is dict and p.keys() == keys and type(p["rows"]) is int and p["rows"] >= 0
                and type(p["tokens"]) is int and p["tokens"] >= 0 and type(p["dir"]) is str
                and p["dir"] not in ("", ".", "..") and "/" not in p["dir"] and "\0" not in p["dir"]):
            raise TokenStoreError(f"token store {path}: {HEADER_FILE} lists a part {p!r} that is not a folder in it "
                                  f"with exactly {PART_KEYS}")
    records = header["parts"]
    rows, tokens = [p["rows"] for p in records], [p["tokens"] for p in records]
    if sum(rows) != header["rows"] or sum(tokens) != header["tokens"]:
        raise TokenStoreError(f"token store {path}: its parts hold {sum(rows)} rows and {sum(tokens)} tokens; "
                              f"{HEADER_FILE} says {header['rows']} and {header['tokens']}")
    try:
        held = os.dup(dir_fd)
    except OSError as exc:
        raise TokenStoreError(f"token store {path}: cannot hold it open{_why(exc)}") from None
    parts: Parts[MappedTokens] = Parts(rows, tokens, lambda k: _open_part(path, held, header, k))
    weakref.finalize(parts, os.close, held)
    dtype = ARRAYS["input_ids"]
    return MappedTokens(path, Concat(parts.token_starts, lambda k: parts[k].input_ids, dtype),
                        Concat(parts.token_starts, lambda k: parts[k].labels, dtype),
                        PartOffsets(parts, lambda k: parts[k].offsets), Joined(lambda: _chunk_bounds(parts)),
                        Joined(lambda: np.concatenate([np.asarray(m.chunk_hashes) for m in parts])), header, parts)


def _open_part(path: Path, dir_fd: int, header: dict[str, Any], k: int) -> MappedTokens:
    """Part `k` of a multi-part store, opened through the store's folder, refused unless it is the part the header
    records (rows, tokens, chunk index and header hashes, label layout, ids within the store's largest)."""
    p = header["parts"][k]
    where = path / p["dir"]
    try:
        part_fd = open_dir(p["dir"], TokenStoreError, dir_fd=dir_fd, shown=f"token store {where}")
    except FileNotFoundError:
        raise TokenStoreError(f"token store {path}: its part {p['dir']} is missing") from None
    try:
        m = _open_single(where, part_fd)
    finally:
        os.close(part_fd)
    if m.parts:
        raise TokenStoreError(f"token store {where}: a part is itself multi-part")
    got = {k: m.header[k] for k in ("rows", "tokens", "index_hash", "header_hash")}
    if got != {k: p.get(k) for k in got} or m.header["labels_shifted"] != header["labels_shifted"]:
        raise TokenStoreError(f"token store {where} holds {got} but {path / HEADER_FILE} records "
                              f"{ {k: p.get(k) for k in got} } (a part was replaced or rewritten)")
    if m.header["max_id"] > header["max_id"]:
        raise TokenStoreError(f"token store {where} holds ids up to {m.header['max_id']}, {path / HEADER_FILE} says "
                              f"{header['max_id']}")
    return m


def _chunk_bounds(parts: Parts[MappedTokens]) -> np.ndarray:
    """The whole store's chunk bounds (rows): every part's, in row order (reads every part's index)."""
    shifted = [np.asarray(m.chunks[1:]) + r for m, r in zip(parts, parts.row_starts, strict=False)]
    return np.concatenate([np.zeros(1, np.int64), *shifted]).astype(np.int64)


def parts_problem(m: MappedTokens) -> str | None:
    """None when every part of a multi-part store opens and is the part its header records (what a reader checks
    of a part when it first reads one of its rows) and the parts hold ids up to the header's `max_id`; else what is
    wrong. Reads every part's header and chunk index (a single store: nothing to check)."""
    try:
        found = max((part.header["max_id"] for part in m.parts), default=m.header["max_id"])
    except TokenStoreError as exc:
        return str(exc)
    if found != m.header["max_id"]:
        return (f"token store {m.path}: its parts hold ids up to {found}; {HEADER_FILE} says {m.header['max_id']}")
    return None


def layout_problem(m: MappedTokens) -> str | None:
    """None when every (part's) chunk index splits its rows at its `chunk_tokens`; else what differs."""
    for part in m.parts or (m,):
        if not np.array_equal(chunk_bounds(part.offsets, part.header["chunk_tokens"]), part.chunks):
            return (f"{part.path}: chunks.npy does not split the rows at chunk_tokens={part.header['chunk_tokens']} "
                    f"({HEADER_FILE} or the offsets changed)")
    return None


def verify_chunk(m: MappedTokens, k: int) -> bool:
    """True when chunk `k` still hashes to its recorded hash (the same bytes `chunk_hash` reads)."""
    lo, hi = int(m.chunks[k]), int(m.chunks[k + 1])
    if not (0 <= lo <= hi <= m.offsets.shape[0] - 1):
        return False
    a, b = int(m.offsets[lo]), int(m.offsets[hi])
    if not 0 <= a <= b <= m.input_ids.shape[0]:
        return False
    h = xxhash.xxh3_64()
    h.update(np.ascontiguousarray(np.diff(m.offsets[lo:hi + 1]), dtype="<i8").data)
    h.update(np.ascontiguousarray(m.input_ids[a:b]).data)  # a chunk lies in one part: a view of its map
    h.update(np.ascontiguousarray(m.labels[a:b]).data)
    return h.intdigest() == int(m.chunk_hashes[k])


def chunk_where(m: MappedTokens, k: int) -> str:
    """Chunk `k` of a store for a message: `FOLDER chunk K (rows A..B)`, the folder and chunk index of the part
    that holds it in a multi-part store (rows are the whole store's: sample ids)."""
    path, local = m.path, k
    for part in m.parts:
        if local < part.num_chunks:
            path = part.path
            break
        local -= part.num_chunks
    return f"{path} chunk {local} (rows {int(m.chunks[k])}..{int(m.chunks[k + 1]) - 1})"


def verify_all(m: MappedTokens) -> int | None:
    """The first chunk that does not match its hash, or None (reads the whole store)."""
    return next((k for k in range(m.num_chunks) if not verify_chunk(m, k)), None)


def to_table(path: str | Path):
    """The store as an Arrow table (`input_ids`, `labels`: large_list<int32>) over the maps, no copy; e.g.
    `datasets.Dataset(to_table("plan/tokens"))`."""
    import pyarrow as pa

    m = open_store(path)
    if m.parts:
        return pa.concat_tables([to_table(part.path) for part in m.parts])
    off = pa.array(np.asarray(m.offsets))
    return pa.table({"input_ids": pa.LargeListArray.from_arrays(off, pa.array(np.asarray(m.input_ids))),
                     "labels": pa.LargeListArray.from_arrays(off, pa.array(np.asarray(m.labels)))})


def _row_blocks(starts: np.ndarray, ends: np.ndarray, block: int) -> Iterator[tuple[int, int, int, int]]:
    """Rows [i, j) at a time, with the tokens [a, b) they span: about `block` tokens (at least one row) each."""
    i = 0
    while i < starts.shape[0]:
        j = max(i + 1, int(np.searchsorted(starts, starts[i] + block, side="right")))
        yield i, j, int(starts[i]), int(ends[i:j].max())
        i = j


def label_counts(labels: np.ndarray, starts: np.ndarray, ends: np.ndarray, block: int = 1 << 24) -> np.ndarray:
    """Supervised labels (!= -100) of each row [starts[i], ends[i]) (ascending), a block of tokens at a time, so
    that memory stays bounded on a mapped store."""
    out = np.empty(starts.shape[0], dtype=np.int64)
    for i, j, a, b in _row_blocks(starts, ends, block):
        sup = np.zeros(b - a + 1, dtype=np.int64)
        np.cumsum(np.asarray(labels[a:b]) != IGNORE_INDEX, out=sup[1:])
        out[i:j] = sup[ends[i:j] - a] - sup[starts[i:j] - a]
    return out


def row_hashes(ids, labels, starts: np.ndarray, ends: np.ndarray, block: int = 1 << 24) -> np.ndarray:
    """`token_hash` of each row [starts[i], ends[i]) (ascending), a block of tokens at a time (bounded memory on
    a mapped or multi-part store)."""
    from plancc.store.fingerprint import token_hashes  # lazy: compiled hashing, only when asked

    out = np.empty(starts.shape[0], dtype=np.uint64)
    for i, j, a, b in _row_blocks(starts, ends, block):
        off = np.stack([starts[i:j] - a, ends[i:j] - a], axis=1).reshape(-1)  # rows as CSR pairs; [::2] keeps them
        x, y = np.asarray(ids[a:b]), np.asarray(labels[a:b])
        out[i:j] = token_hashes(x, off, y, off)[::2]
    return out


def compare_samples(ids: np.ndarray, labels: np.ndarray, offsets: np.ndarray, samples: Any, *,
                    hashes: bool = True) -> str | None:
    """None when every sample of `samples` (a samples table, sorted by sample_id) has its recorded length, label
    count (and, with `hashes`, content hash) in these rows; else what differs, naming the first such sample."""
    sid = samples.column("sample_id").to_numpy()
    if sid.size and (sid.min() < 0 or sid.max() >= offsets.shape[0] - 1):
        return f"the plan uses sample_id {int(sid.max())} but the dataset has {offsets.shape[0] - 1} rows"
    starts, ends = np.asarray(offsets[sid]), np.asarray(offsets[sid + 1])
    outside = np.flatnonzero((starts < 0) | (ends < starts) | (ends > ids.shape[0]))
    if outside.size:
        return f"the row offsets of {outside.size} samples are out of range (first: sample_id {int(sid[outside[0]])})"
    bad = np.flatnonzero(ends - starts != samples.column("length").to_numpy())
    if bad.size:
        return f"{bad.size} samples changed length (first: sample_id {int(sid[bad[0]])})"
    bad = np.flatnonzero(label_counts(labels, starts, ends) != samples.column("label_count").to_numpy())
    if bad.size:
        return f"{bad.size} samples changed their supervised label count (first: sample_id {int(sid[bad[0]])})"
    if hashes:
        bad = np.flatnonzero(row_hashes(ids, labels, starts, ends) != samples.column("token_hash").to_numpy())
        if bad.size:
            return (f"{bad.size} samples changed content (dataset fingerprint mismatch; first: sample_id "
                    f"{int(sid[bad[0]])})")
    return None

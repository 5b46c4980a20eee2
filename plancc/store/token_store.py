"""The token store: the tokenized dataset as flat `.npy` arrays that every reader memory-maps, with row hashes.

A store is a directory (`tokens/` in a scan or plan directory)::

    input_ids.npy   int32 [T]     every row's tokens, concatenated (row = sample_id)
    labels.npy      int32 [T]     labels, same layout (already shifted when the scan ran with --shift none)
    offsets.npy     int64 [N+1]   row i = input_ids[offsets[i]:offsets[i+1]]
    chunks.npy      int64 [C+1]   chunk k = rows chunks[k]:chunks[k+1] (whole rows, ~CHUNK_TOKENS tokens, at most
                                  CHUNK_ROWS rows): the unit a reader verifies at once
    row_hashes.npy  uint64 [N]    each row's hash (`token_digest`: its ids and labels)
    blocks.npy      uint64 [B]    a hash per BLOCK_ROWS row hashes, counted from row 0
    tokens.json     counts, chunk size, the largest id, the samples' dataset/metadata fingerprints, a hash of the
                    chunk index, `content_hash` (of blocks.npy), and `header_hash`: a hash of all of its own values

Why flat `.npy` and not Arrow IPC: one contiguous array per column is what the collator gathers from (one
vectorized index over all samples, no record-batch boundaries, no int32 list-offset limit at 2**31 tokens), and
a memory map reads it with no copy: pages come from the OS page cache, shared by
every rank of a node, and a process's memory grows only with the pages it touches. The format is readable by any
tool (numpy, or plain offsets arithmetic); `to_table` wraps the maps as a zero-copy Arrow table with
`input_ids`/`labels` columns that `datasets.Dataset(table)` accepts.

A **multi-part** store (a sharded or streamed scan, `plancc merge`) is a directory of single stores, one per
part in row order, under a header of format `plancc.tokens-parts/3` that lists them (`dir`, `rows`, `tokens`,
`header_hash`: a part swapped, truncated or rewritten is refused) with the whole dataset's counts, largest id,
fingerprints, the whole dataset's `blocks.npy` and `content_hash`, and its own `header_hash`::

    tokens/tokens.json   {"format": "plancc.tokens-parts/3", "parts": [{"dir": "part-00000", ...}, ...], ...}
    tokens/blocks.npy    the block hashes of all rows, counted from row 0 of the first part
    tokens/part-00000/   a single store: rows 0 .. n0-1 of the dataset
    tokens/part-00001/   rows n0 .. n0+n1-1

`open_store` opens it as one dataset from its header and block hashes (`token_parts`): a part is opened, checked
against the header's record of it and mapped the first time one of its rows is read, so that opening takes the same
descriptors for 1 part or 1,000; `input_ids`/`labels`/`row_hashes` index like one array (a row never spans two
parts, so a row's slice is a view of one part's map) and `offsets` like the whole store's. Every array is mapped
without holding a descriptor (`token_parts.map_array`). Stores are written, joined into parts and placed by hard
links in `token_writer`.

The store's `digest` (`token_digest`) depends on its rows and their order only, never on how they are split into
parts or chunks: the same rows scanned locally, on Ray or in merged shards give one digest, which a plan binds.
Verification scales with what a reader touches: `open_store` checks the header (its `header_hash`), every file's
size and dtype, the offsets' ends, the chunk index hash and `content_hash` over the block hashes (work in
proportion to rows / BLOCK_ROWS, no token read); `verify_rows` checks rows: their row hashes against the block
hashes that cover them (a multi-part store's own, which its digest binds, not its parts'), and their tokens against
the row hashes; readers call it the first time they touch a chunk; `verify_all` checks every block and chunk (and
`parts_problem` opens every part). The dataset fingerprint keeps its meaning: it is computed from the samples
table's per-sample `token_hash`, which the store records at write and a plan compares at open.
"""

from __future__ import annotations

import os
import stat
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import orjson
import xxhash

from plancc.errors import PlanccError, descriptors_hint, out_of_descriptors
from plancc.store import token_digest
from plancc.store.schemas import TOKENS_DIR
from plancc.store.token_parts import Concat, Joined, PartOffsets, Parts, map_array

FORMAT = "plancc.tokens/3"  # 3: row hashes and a digest independent of the part layout; 2: header_hash
HEADER_FILE = "tokens.json"
ARRAYS = {  # file stem -> dtype
    "input_ids": np.dtype("<i4"),
    "labels": np.dtype("<i4"),
    "offsets": np.dtype("<i8"),
    "chunks": np.dtype("<i8"),
    "row_hashes": np.dtype("<u8"),
    "blocks": np.dtype("<u8"),
}
CHUNK_TOKENS = 8192
CHUNK_ROWS = 64  # at most: a chunk of short rows costs a row hash each to verify
HEADER_KEYS = sorted(["block_rows", "chunk_rows", "chunk_tokens", "chunks", "content_hash", "fingerprints", "format",
                      "header_hash", "index_hash", "labels_shifted", "max_id", "rows", "tokens"])
PARTS_FORMAT = "plancc.tokens-parts/3"
PARTS_KEYS = sorted(["block_rows", "content_hash", "fingerprints", "format", "header_hash", "labels_shifted",
                     "max_id", "parts", "rows", "tokens"])
PART_KEYS = sorted(["dir", "header_hash", "rows", "tokens"])  # one entry of a multi-part header's parts
OLD_FORMATS = {  # format -> what the older plancc's store lacked
    "plancc.tokens/1": "is not checksummed", "plancc.tokens-parts/1": "is not checksummed",
    "plancc.tokens/2": "has a digest that depends on how the scan was split",
    "plancc.tokens-parts/2": "has a digest that depends on how the scan was split",
}


class TokenStoreError(PlanccError):
    """A token store is missing, truncated, foreign or changed; the message names the file (and the row)."""


class FileTypeError(PlanccError):
    """A path where plancc reads a file holds a FIFO, device, socket or directory: refused before any read."""


@dataclass(frozen=True)
class MappedTokens:
    """A store opened read-only: memory maps (no data read yet), the block hashes and its header. A multi-part
    store's arrays are its parts' as one (`token_parts`: `Concat`, `PartOffsets`; `chunks` `Joined`, read only by
    checks of the whole store), its `blocks` the whole dataset's, and `parts` its parts (each a single store, mapped
    when first read); a single store's `parts` is empty."""

    path: Path
    input_ids: np.ndarray | Concat
    labels: np.ndarray | Concat
    offsets: np.ndarray | PartOffsets
    chunks: np.ndarray | Joined
    row_hashes: np.ndarray | Concat
    blocks: np.ndarray  # the whole dataset's block hashes (checked against content_hash at open)
    header: dict[str, Any]
    parts: Parts[MappedTokens] | tuple[()] = ()

    @property
    def num_chunks(self) -> int:
        """Chunks in the store (the units a reader verifies; a multi-part store's: reads every part's index)."""
        return int(self.chunks.shape[0] - 1)

    @property
    def rows(self) -> int:
        """Rows in the store."""
        return int(self.header["rows"])

    @property
    def digest(self) -> str:
        """The store's content digest (`token_digest.digest`): its rows and their order, not its layout; a plan
        records it and compares it at open (constant work)."""
        return token_digest.digest(self.header)


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


def chunk_bounds(offsets: np.ndarray, chunk_tokens: int = CHUNK_TOKENS, chunk_rows: int = CHUNK_ROWS) -> np.ndarray:
    """Row bounds of chunks of whole rows: a chunk starts at the first row starting at or after k*chunk_tokens, and
    at every chunk_rows-th row."""
    total, rows = int(offsets[-1]), offsets.shape[0] - 1
    starts = np.searchsorted(offsets[:-1], np.arange(0, max(total, 1), chunk_tokens, dtype=np.int64), side="left")
    return np.unique(np.concatenate([[0], starts, np.arange(0, rows, chunk_rows), [rows]])).astype(np.int64)


def index_hash(chunks: np.ndarray) -> str:
    """xxh3-128 of the chunk index (its row bounds): the header binds the verification units through it."""
    return xxhash.xxh3_128_hexdigest(np.ascontiguousarray(chunks, dtype="<i8").data)


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
    if isinstance(got, str) and got in OLD_FORMATS:
        raise TokenStoreError(f"token store {path}: {HEADER_FILE} has format {got!r}, written by an older plancc whose "
                              f"store {OLD_FORMATS[got]}: recompile the plan (or rescan: `plancc scan`)")
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
    """Map a store read-only after the constant-cost checks (header, sizes, dtypes, ends, index and content hashes).

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
    if (sorted(header) != HEADER_KEYS
            or not _counts(header, ("rows", "tokens", "chunks", "chunk_tokens", "chunk_rows", "block_rows"))
            or min(header["chunk_tokens"], header["chunk_rows"], header["block_rows"]) < 1
            or type(header["max_id"]) is not int
            or type(header["labels_shifted"]) is not bool or not isinstance(header["fingerprints"], dict)):
        raise TokenStoreError(f"token store {path}: {HEADER_FILE} has keys {sorted(header)} or values of the wrong "
                              f"type; a store's header holds exactly {HEADER_KEYS}")
    rows, tokens, chunks = header["rows"], header["tokens"], header["chunks"]
    lengths = {"input_ids": tokens, "labels": tokens, "offsets": rows + 1, "chunks": chunks + 1, "row_hashes": rows,
               "blocks": token_digest.block_count(rows, header["block_rows"])}
    maps = {name: _map(path, dir_fd, name, n) for name, n in lengths.items()}
    m = MappedTokens(path, maps["input_ids"], maps["labels"], maps["offsets"], maps["chunks"], maps["row_hashes"],
                     _blocks(path, maps["blocks"], header), header)
    if int(m.offsets[0]) != 0 or int(m.offsets[-1]) != tokens or int(m.chunks[0]) != 0 or int(m.chunks[-1]) != rows:
        raise TokenStoreError(f"token store {path}: offsets.npy or chunks.npy does not span the store's "
                              f"{rows} rows and {tokens} tokens (a file was changed)")
    if index_hash(m.chunks) != header["index_hash"] or (m.chunks[1:] < m.chunks[:-1]).any():
        raise TokenStoreError(f"token store {path}: chunks.npy changed since it was written")
    return m


def _blocks(path: Path, blocks: np.ndarray, header: dict[str, Any]) -> np.ndarray:
    """The block hashes, in memory, refused unless they hash to the header's `content_hash`."""
    blocks = np.array(blocks)
    if token_digest.content_hash(blocks) != header["content_hash"]:
        raise TokenStoreError(f"token store {path}: blocks.npy changed since it was written (its block hashes do "
                              f"not hash to the content_hash in {HEADER_FILE})")
    return blocks


def _open_parts(path: Path, dir_fd: int, header: dict[str, Any]) -> MappedTokens:
    """A multi-part store as one, from its header and block hashes alone: each part is mapped (and bound to the
    header's record of it) the first time one of its rows is read (`token_parts`), through a descriptor of the
    store's folder, the one the store holds whatever its number of parts."""
    if (sorted(header) != PARTS_KEYS or not isinstance(header["parts"], list) or not header["parts"]
            or not _counts(header, ("rows", "tokens", "block_rows")) or header["block_rows"] < 1
            or type(header["labels_shifted"]) is not bool):
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
    blocks = _blocks(path, _map(path, dir_fd, "blocks", token_digest.block_count(sum(rows), header["block_rows"])),
                     header)
    try:
        held = os.dup(dir_fd)
    except OSError as exc:
        raise TokenStoreError(f"token store {path}: cannot hold it open{_why(exc)}") from None
    parts: Parts[MappedTokens] = Parts(rows, tokens, lambda k: _open_part(path, held, header, k))
    weakref.finalize(parts, os.close, held)
    ids, hashes = ARRAYS["input_ids"], ARRAYS["row_hashes"]
    return MappedTokens(path, Concat(parts.token_starts, lambda k: parts[k].input_ids, ids),
                        Concat(parts.token_starts, lambda k: parts[k].labels, ids),
                        PartOffsets(parts, lambda k: parts[k].offsets), Joined(lambda: _chunk_bounds(parts)),
                        Concat(parts.row_starts, lambda k: parts[k].row_hashes, hashes), blocks, header, parts)


def _open_part(path: Path, dir_fd: int, header: dict[str, Any], k: int) -> MappedTokens:
    """Part `k` of a multi-part store, opened through the store's folder, refused unless it is the part the header
    records (rows, tokens, header hash, label layout, ids within the store's largest)."""
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
    got = {k: m.header[k] for k in ("rows", "tokens", "header_hash")}
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
    """None when every (part's) chunk index splits its rows at its `chunk_tokens` and `chunk_rows`; else what
    differs."""
    for part in m.parts or (m,):
        size = {k: part.header[k] for k in ("chunk_tokens", "chunk_rows")}
        if not np.array_equal(chunk_bounds(part.offsets, **size), part.chunks):
            return (f"{part.path}: chunks.npy does not split the rows at chunk_tokens={size['chunk_tokens']} and "
                    f"chunk_rows={size['chunk_rows']} ({HEADER_FILE} or the offsets changed)")
    return None


def _rows_match(m: MappedTokens, lo: int, hi: int, stored: np.ndarray) -> bool:
    """Whether rows [lo, hi)'s tokens hash to `stored` (their recorded row hashes)."""
    a, b = int(m.offsets[lo]), int(m.offsets[hi])
    if not 0 <= a <= b <= m.input_ids.shape[0]:
        return False
    got = token_digest.row_hashes(m.input_ids[a:b], m.labels[a:b], np.asarray(m.offsets[lo:hi + 1]) - a)
    return np.array_equal(got, stored)


def verify_rows(m: MappedTokens, lo: int, hi: int) -> bool:
    """True when rows [lo, hi) (of the whole store: sample ids) still hash to their row hashes, and those to the
    block hashes that cover them (which `content_hash` bound at open; a block may span two parts)."""
    if not (0 <= lo <= hi <= m.rows):
        return False
    size = m.header["block_rows"]
    first, last = lo // size, token_digest.block_count(hi, size)
    stored = np.asarray(m.row_hashes[first * size:min(last * size, m.rows)])
    if not np.array_equal(token_digest.block_hashes([stored], size), m.blocks[first:last]):
        return False
    return _rows_match(m, lo, hi, stored[lo - first * size:hi - first * size])


def verify_chunk(m: MappedTokens, k: int) -> bool:
    """True when chunk `k`'s rows still hash to their row hashes and those to their block hashes (`verify_rows`)."""
    return verify_rows(m, int(m.chunks[k]), int(m.chunks[k + 1]))


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
    """The first chunk that does not match, or None: every block of row hashes against its block hash, then every
    chunk's rows against their row hashes (reads the whole store once). A block that does not match names the first
    chunk over it whose rows do not match their hashes (a row hash edited), else its first chunk."""
    size, chunks = m.header["block_rows"], np.asarray(m.chunks)
    got = token_digest.block_hashes(token_digest.stretches(m.row_hashes, m.rows), size)
    bad = np.flatnonzero(got != m.blocks) if got.shape == m.blocks.shape else np.zeros(1, np.int64)
    which = range(m.num_chunks)
    if bad.size:
        lo, hi = int(bad[0]) * size, min((int(bad[0]) + 1) * size, m.rows)
        first, last = np.searchsorted(chunks, [lo, max(hi - 1, lo)], side="right") - 1
        which = range(int(first), int(last) + 1)
    return next((k for k in which if not _rows_match(m, int(chunks[k]), int(chunks[k + 1]), np.asarray(
        m.row_hashes[int(chunks[k]):int(chunks[k + 1])]))), which[0] if bad.size else None)


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

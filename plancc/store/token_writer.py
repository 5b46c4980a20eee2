"""Writing token stores (the format: `token_store`): a single store from a scan's arrays (`write_store`), a
multi-part store that joins stores in row order (`write_parts`), and a store placed in another directory
(`link_store`). Joining and placing use hard links, so merging shards or placing a store in a plan never copies
token data on one filesystem; across filesystems a file is copied and counted.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from plancc.store import token_digest
from plancc.store.token_store import (
    ARRAYS,
    CHUNK_ROWS,
    CHUNK_TOKENS,
    FORMAT,
    HEADER_FILE,
    PARTS_FORMAT,
    TokenStoreError,
    chunk_bounds,
    header_hash,
    index_hash,
    open_store,
    read_header,
)


def write_header(directory: Path, header: dict[str, Any]) -> None:
    """`header` and its `header_hash` written as `directory`'s HEADER_FILE."""
    header = {**header, "header_hash": header_hash(header)}
    (directory / HEADER_FILE).write_bytes(orjson.dumps(header, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS))


def _write_array(path: Path, array: np.ndarray, dtype: np.dtype) -> None:
    with open(path, "wb") as f:
        np.save(f, np.ascontiguousarray(array, dtype=dtype), allow_pickle=False)
        f.flush()
        os.fsync(f.fileno())


def write_store(directory: str | Path, ids: np.ndarray, labels: np.ndarray, offsets: np.ndarray, *,
                fingerprints: dict[str, str], labels_shifted: bool = False,
                chunk_tokens: int = CHUNK_TOKENS, chunk_rows: int = CHUNK_ROWS,
                block_rows: int = token_digest.BLOCK_ROWS) -> None:
    """Write a store into `directory` (created; the caller makes the write atomic, e.g. `outputs.atomic_directory`).

    `fingerprints` are the samples table's `dataset`/`metadata` fingerprints: a plan checks them at open.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    offsets = np.asarray(offsets, dtype=np.int64)
    if offsets.shape[0] < 1 or offsets[0] != 0 or offsets[-1] != len(ids) or len(ids) != len(labels):
        raise ValueError("token store: offsets must start at 0 and end at len(ids) == len(labels)")
    chunks = chunk_bounds(offsets, chunk_tokens, chunk_rows)
    rows = token_digest.row_hashes(ids, labels, offsets)
    blocks = token_digest.block_hashes([rows], block_rows)
    arrays = {"input_ids": ids, "labels": labels, "offsets": offsets, "chunks": chunks, "row_hashes": rows,
              "blocks": blocks}
    for name, dtype in ARRAYS.items():
        _write_array(directory / f"{name}.npy", arrays[name], dtype)
    header = {
        "format": FORMAT,
        "rows": int(offsets.shape[0] - 1),
        "tokens": int(offsets[-1]),
        "chunk_tokens": int(chunk_tokens),
        "chunk_rows": int(chunk_rows),
        "chunks": int(chunks.shape[0] - 1),
        "labels_shifted": bool(labels_shifted),
        "max_id": int(ids.max()) if len(ids) else -1,  # a trainer sizes its vocabulary without reading the ids
        "fingerprints": {k: fingerprints[k] for k in ("dataset", "metadata") if k in fingerprints},
        "index_hash": index_hash(chunks),
        "block_rows": int(block_rows),
        "content_hash": token_digest.content_hash(blocks),
    }
    write_header(directory, header)


def _link(src: Path, dst: Path) -> bool:
    """Hard-link `src` at `dst`; False when it had to be copied (another filesystem)."""
    try:
        os.link(src, dst)
        return True
    except OSError:
        import shutil

        shutil.copyfile(src, dst)
        return False


def link_store(src: str | Path, dst: str | Path) -> int:
    """Place store `src` (single or multi-part) at `dst` (absent): hard links when on one filesystem (no second
    copy of the tokens); returns how many files had to be copied instead."""
    src, dst = Path(src), Path(dst)
    header = read_header(src)
    dst.mkdir(parents=True)
    if header.get("format") == PARTS_FORMAT:
        copied = sum(link_store(src / p["dir"], dst / p["dir"]) for p in header["parts"])
        return copied + sum(not _link(src / name, dst / name) for name in ("blocks.npy", HEADER_FILE))
    return sum(not _link(src / name, dst / name) for name in [*(f"{n}.npy" for n in ARRAYS), HEADER_FILE])


def _single_parts(path: Path) -> list[Path]:
    """The single stores a store consists of, in row order."""
    header = read_header(path)
    if header["format"] == PARTS_FORMAT:
        return [path / p["dir"] for p in header["parts"]]
    return [path]


def _row_hashes(path: Path) -> Iterator[np.ndarray]:
    """The row hashes of the single store at `path` a stretch at a time, refused (`TokenStoreError`) unless they
    hash to its own block hashes: the joined store's block hashes are computed from row hashes its parts vouch
    for."""
    m = open_store(path)
    got = token_digest.block_hashes(token_digest.stretches(m.row_hashes, m.rows), m.header["block_rows"])
    if not np.array_equal(got, m.blocks):
        raise TokenStoreError(f"token store {m.path}: row_hashes.npy changed since it was written")
    yield from token_digest.stretches(m.row_hashes, m.rows)


def write_parts(directory: str | Path, stores: list[Path], *, fingerprints: dict[str, str],
                labels_shifted: bool, block_rows: int = token_digest.BLOCK_ROWS) -> int:
    """Write a multi-part store at `directory` (absent) joining `stores` (single or multi-part, in row order) by
    hard links, with the block hashes of all their rows (read from their row hashes: the joined store's digest is
    a single store's of the same rows); `fingerprints` are the joined samples table's. Returns how many files were
    copied (not linked)."""
    directory = Path(directory)
    directory.mkdir(parents=True)
    singles = [p for s in stores for p in _single_parts(Path(s))]
    parts, copied, max_id = [], 0, -1
    for k, single in enumerate(singles):
        m = open_store(single)
        if m.header["labels_shifted"] != labels_shifted:
            raise TokenStoreError(f"token store {single} has labels_shifted {m.header['labels_shifted']}, the "
                                  f"others {labels_shifted}")
        name = f"part-{k:05d}"
        copied += link_store(single, directory / name)
        parts.append({"dir": name, **{k: m.header[k] for k in ("rows", "tokens", "header_hash")}})
        max_id = max(max_id, m.header["max_id"])
    del m
    blocks = token_digest.block_hashes((s for p in singles for s in _row_hashes(p)), block_rows)
    _write_array(directory / "blocks.npy", blocks, ARRAYS["blocks"])
    header = {
        "format": PARTS_FORMAT,
        "parts": parts,
        "rows": sum(p["rows"] for p in parts),
        "tokens": sum(p["tokens"] for p in parts),
        "max_id": max_id,
        "labels_shifted": bool(labels_shifted),
        "fingerprints": {k: fingerprints[k] for k in ("dataset", "metadata") if k in fingerprints},
        "block_rows": int(block_rows),
        "content_hash": token_digest.content_hash(blocks),
    }
    write_header(directory, header)
    return copied

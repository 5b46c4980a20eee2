"""What binds a token store's content, whatever the layout it was written in (one store, or parts of any sizes).

Three levels, each a hash of the one below, computed once at write:

    row hash     xxh3-64 of one row's labels (little-endian int32 bytes), seeded with the xxh3-64 of its ids: the
                 row's content and its length; stored per row (`row_hashes.npy`)
    block hash   xxh3-64 of BLOCK_ROWS consecutive row hashes (the last block may be shorter), blocks counted from
                 row 0 of the whole dataset (`blocks.npy`, of the store or of a multi-part store's top)
    content      xxh3-128 of the block hashes (`content_hash` in the header)

The store's **digest** hashes the header values that say what the dataset is (rows, tokens, the largest id, label
layout, the samples table's fingerprints, the block size and `content_hash`): the same rows in the same order give
the same digest from a local scan, a Ray scan or merged shards, and a plan binds it (`fingerprints.tokens`).

Opening hashes only the block hashes (a store of 100M rows has about 100k: constant work at any token count);
rows are verified lazily: a reader checks a block's row hashes against its block hash and the rows' tokens against
their row hashes the first time it reads them (`token_store.verify_rows`).

`compare_samples` binds a store's rows to a samples table (each sample's length, label count and `token_hash`,
the hash the dataset fingerprint is computed from): what a plan checks of the rows it uses.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from itertools import pairwise
from typing import Any

import numpy as np
import orjson
import xxhash

from plancc.core.plan_arrays import IGNORE_INDEX

BLOCK_ROWS = 1024  # row hashes per block: 8 KiB read to check a block, ~100k block hashes hashed at open per 100M rows
DIGEST_KEYS = ("block_rows", "content_hash", "fingerprints", "labels_shifted", "max_id", "rows", "tokens")
_ROWS_AT_ONCE = 1 << 16  # rows hashed per stretch at write: bounded memory for the offsets as Python ints


def row_hashes(ids: np.ndarray | bytes, labels: np.ndarray | bytes, offsets: np.ndarray) -> np.ndarray:
    """The row hash of each row [offsets[i], offsets[i+1]) of `ids`/`labels` (int32 values, or their
    little-endian bytes as read from a file), uint64."""
    ids_bytes = memoryview(np.ascontiguousarray(np.frombuffer(ids, "<i4") if isinstance(ids, bytes) else ids,
                                                dtype="<i4")).cast("B")
    label_bytes = memoryview(np.ascontiguousarray(np.frombuffer(labels, "<i4") if isinstance(labels, bytes)
                                                  else labels, dtype="<i4")).cast("B")
    offsets = np.asarray(offsets, dtype=np.int64)
    n = offsets.shape[0] - 1
    out = np.empty(max(n, 0), dtype=np.uint64)
    h = xxhash.xxh3_64_intdigest
    for lo in range(0, n, _ROWS_AT_ONCE):
        at = (offsets[lo:lo + _ROWS_AT_ONCE + 1] * 4).tolist()
        out[lo:lo + len(at) - 1] = [h(label_bytes[a:b], h(ids_bytes[a:b])) for a, b in pairwise(at)]
    return out


def block_hashes(stretches: Iterable[np.ndarray], block_rows: int = BLOCK_ROWS) -> np.ndarray:
    """The block hash of every `block_rows` row hashes of `stretches` (uint64 arrays, consecutive in row order, of
    any lengths: a store's whole array, or the parts' read a stretch at a time), uint64."""
    out, carry = [], np.zeros(0, "<u8")
    for arr in stretches:
        arr = np.asarray(arr, dtype="<u8")
        if carry.size:
            take = block_rows - carry.size
            carry, arr = np.concatenate([carry, arr[:take]]), arr[take:]
            if carry.size < block_rows:
                continue
            out.append(xxhash.xxh3_64_intdigest(carry.data))
        whole = arr.shape[0] - arr.shape[0] % block_rows
        out += [xxhash.xxh3_64_intdigest(arr[i:i + block_rows].data) for i in range(0, whole, block_rows)]
        carry = arr[whole:].copy()
    if carry.size:
        out.append(xxhash.xxh3_64_intdigest(carry.data))
    return np.array(out, dtype=np.uint64)


def block_count(rows: int, block_rows: int) -> int:
    """Blocks of a store of `rows` rows."""
    return -(-rows // block_rows)


def content_hash(blocks: np.ndarray) -> str:
    """xxh3-128 (hex) of the block hashes."""
    return xxhash.xxh3_128_hexdigest(np.ascontiguousarray(blocks, dtype="<u8").data)


def digest(header: dict[str, Any]) -> str:
    """The store's digest from its header (single or multi-part alike): xxh3-128 of the DIGEST_KEYS values as
    canonical JSON."""
    return xxhash.xxh3_128_hexdigest(orjson.dumps({k: header.get(k) for k in DIGEST_KEYS},
                                                  option=orjson.OPT_SORT_KEYS))


def stretches(row_hashes: Any, rows: int, step: int = 1 << 20) -> Iterator[np.ndarray]:
    """Row hashes [0, rows) of `row_hashes` (a map, or a multi-part store's `Concat`) a stretch at a time: bounded
    memory, and a multi-part store's parts read one after another."""
    for a in range(0, rows, step):
        yield np.asarray(row_hashes[a:min(a + step, rows)], dtype="<u8")


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


def sample_hashes(ids, labels, starts: np.ndarray, ends: np.ndarray, block: int = 1 << 24) -> np.ndarray:
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
        bad = np.flatnonzero(sample_hashes(ids, labels, starts, ends) != samples.column("token_hash").to_numpy())
        if bad.size:
            return (f"{bad.size} samples changed content (dataset fingerprint mismatch; first: sample_id "
                    f"{int(sid[bad[0]])})")
    return None

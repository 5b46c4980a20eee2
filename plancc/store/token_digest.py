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
their row hashes the first time it reads them (`token_store.verify_chunk`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from itertools import pairwise
from typing import Any

import numpy as np
import orjson
import xxhash

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


def stretches(read, rows: int, step: int = 1 << 20) -> Iterator[np.ndarray]:
    """Row hashes [0, rows) a stretch at a time through `read(a, b)` (their bytes): bounded memory, and pages read
    through a file stay out of the reader's resident set."""
    for a in range(0, rows, step):
        yield np.frombuffer(read(a, min(a + step, rows)), dtype="<u8")

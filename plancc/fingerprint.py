"""Content, metadata, config and plan hashes.

Per-sample `token_hash` is a 64-bit hash of one sample's `input_ids` and `labels`, computed in a compiled loop so a
scan of millions of samples pays nothing for it. Whole-table fingerprints are BLAKE2b digests over fixed-width
little-endian array bytes: identical arrays give identical digests on any machine.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numba
import numpy as np
import pyarrow as pa

from plancc import store
from plancc.config import canonical_hash


@numba.njit(cache=True, inline="always")
def _round(h, v):
    h = h ^ (v * np.uint64(0xC2B2AE3D27D4EB4F))
    h = (h << np.uint64(31)) | (h >> np.uint64(33))
    return h * np.uint64(0x9E3779B185EBCA87)


@numba.njit(cache=True, inline="always")
def _avalanche(h):
    h = h ^ (h >> np.uint64(33))
    h = h * np.uint64(0xC2B2AE3D27D4EB4F)
    h = h ^ (h >> np.uint64(29))
    h = h * np.uint64(0x165667B19E3779F9)
    return h ^ (h >> np.uint64(32))


@numba.njit(cache=True)
def _hash_pairs(ids, ids_offsets, labels, labels_offsets):
    n = ids_offsets.shape[0] - 1
    out = np.empty(n, dtype=np.uint64)
    for i in range(n):
        a0, a1 = ids_offsets[i], ids_offsets[i + 1]
        b0, b1 = labels_offsets[i], labels_offsets[i + 1]
        h = np.uint64(0x27D4EB2F165667C5) ^ np.uint64(a1 - a0)
        for j in range(a0, a1):
            h = _round(h, np.uint64(np.uint32(ids[j])))
        h = _round(h, np.uint64(b1 - b0) ^ np.uint64(0xFFFFFFFF00000000))
        for j in range(b0, b1):
            h = _round(h, np.uint64(np.uint32(labels[j])))
        out[i] = _avalanche(h)
    return out


def token_hashes(ids: np.ndarray, ids_offsets: np.ndarray, labels: np.ndarray, labels_offsets: np.ndarray) -> np.ndarray:
    """64-bit content hash per sample of (input_ids, labels), given flat values and CSR offsets (n+1 each)."""
    return _hash_pairs(
        np.ascontiguousarray(ids, dtype=np.int32),
        np.ascontiguousarray(ids_offsets, dtype=np.int64),
        np.ascontiguousarray(labels, dtype=np.int32),
        np.ascontiguousarray(labels_offsets, dtype=np.int64),
    )


def array_digest(*arrays: np.ndarray) -> str:
    """BLAKE2b-128 over the arrays' little-endian bytes, each prefixed by dtype and length."""
    h = hashlib.blake2b(digest_size=16)
    for a in arrays:
        a = np.ascontiguousarray(a)
        a = a.astype(a.dtype.newbyteorder("<"), copy=False)
        h.update(f"{a.dtype.str}:{a.size};".encode())
        h.update(memoryview(a).cast("B"))
    return h.hexdigest()


def dataset_fingerprint(sample_id: np.ndarray, token_hash: np.ndarray) -> str:
    """Equal digest means equal token content (ids and labels) of the same retained sample ids."""
    return array_digest(sample_id.astype(np.int64), token_hash.astype(np.uint64))


def metadata_fingerprint(sample_id: np.ndarray, length: np.ndarray, label_count: np.ndarray,
                         first_label_supervised: np.ndarray, identity: dict[str, str | None] | None = None) -> str:
    """What the planner saw of each sample (lengths and label counts) and what made them: the tokenizer's and the
    chat template's fingerprints (`identity`; none for a bare or already tokenized table)."""
    digest = array_digest(
        sample_id.astype(np.int64),
        length.astype(np.int32),
        label_count.astype(np.int32),
        first_label_supervised.astype(np.uint8),
    )
    made_by = {k: v for k, v in (identity or {}).items() if v}
    return canonical_hash({"samples": digest, **made_by}) if made_by else digest


def scan_identity(report: dict[str, Any]) -> dict[str, str | None]:
    """The tokenizer and chat template fingerprints a scan report records (for the metadata fingerprint)."""
    template = report.get("chat_template") or {}
    return {"tokenizer": report.get("tokenizer_fingerprint"), "chat_template": template.get("fingerprint")}


def samples_fingerprints(table: pa.Table, identity: dict[str, str | None] | None = None) -> dict[str, str]:
    """`dataset` and `metadata` fingerprints of a samples table made with `identity` (see scan_identity)."""
    col = {name: store.column(table, name) for name in
           ("sample_id", "length", "label_count", "first_label_supervised", "token_hash")}
    return {
        "dataset": dataset_fingerprint(col["sample_id"], col["token_hash"]),
        "metadata": metadata_fingerprint(col["sample_id"], col["length"], col["label_count"],
                                         col["first_label_supervised"], identity),
    }


def config_fingerprint(settings: dict[str, Any]) -> str:
    return canonical_hash(settings)


__all__ = [
    "array_digest",
    "config_fingerprint",
    "dataset_fingerprint",
    "metadata_fingerprint",
    "samples_fingerprints",
    "scan_identity",
    "token_hashes",
]

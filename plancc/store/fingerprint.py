"""Content, metadata, config, plan and metrics digests.

Per-sample `token_hash` is a 64-bit hash of one sample's `input_ids` and `labels`, computed in a compiled loop
(`plancc.store.token_hash`, loaded only when tokens are hashed) so a scan of millions of samples pays nothing for it.
Whole-table fingerprints are BLAKE2b digests over fixed-width little-endian array bytes: identical arrays give
identical digests on any machine. This module imports numpy and the standard library only, so the runtime checks
a plan's digests without loading the compile side.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import numpy as np

from plancc.core.hashing import canonical_hash

PLAN_FINGERPRINT_COLUMNS = ("index", "update", "rank", "micro_step", "batch_bounds", "row_bounds", "sample_ids",
                            "tokens", "label_count", "cost", "num_items")

# a preference plan's update totals (`schemas.KIND_PLAN_FIELDS`): hashed when the plan has them, so SFT plans keep
# the fingerprints they had
KIND_FINGERPRINT_COLUMNS = ("num_pairs", "num_chosen_items", "num_desirable", "num_undesirable")

EVAL_FINGERPRINT_COLUMNS = ("index", "rank", "batch_bounds", "row_bounds", "sample_ids", "tokens", "label_count", "cost")


def token_hashes(ids: np.ndarray, ids_offsets: np.ndarray, labels: np.ndarray, labels_offsets: np.ndarray) -> np.ndarray:
    """64-bit content hash per sample of (input_ids, labels), given flat values and CSR offsets (n+1 each)."""
    from plancc.store.token_hash import hash_pairs  # numba: only where tokens are hashed

    return hash_pairs(
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
    return array_digest(sample_id.astype(np.int64, copy=False), token_hash.astype(np.uint64, copy=False))


def metadata_fingerprint(sample_id: np.ndarray, length: np.ndarray, label_count: np.ndarray,
                         first_label_supervised: np.ndarray, identity: dict[str, str | None] | None = None) -> str:
    """What the planner saw of each sample (lengths and label counts) and what made them: the tokenizer's and the
    chat template's fingerprints (`identity`; none for a bare or already tokenized table)."""
    digest = array_digest(  # no copies of arrays already of these types (10M samples: 250 MB saved)
        sample_id.astype(np.int64, copy=False),
        length.astype(np.int32, copy=False),
        label_count.astype(np.int32, copy=False),
        first_label_supervised.astype(np.uint8, copy=False),
    )
    made_by = {k: v for k, v in (identity or {}).items() if v}
    return canonical_hash({"samples": digest, **made_by}) if made_by else digest


# eos tokens a tokenizer directory without `eos_token` in its tokenizer_config.json is searched for, in this order
EOS_GUESSES = ("<|eos|>", "</s>", "<|endoftext|>", "<|end_of_text|>", "<｜end▁of▁sentence｜>", "<|im_end|>", "<eos>")


def _token_text(value: Any) -> str | None:
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def tokenizer_specials(config: dict[str, Any], has_token: Callable[[str], bool]) -> tuple[str | None, str | None]:
    """(eos, bos) of a tokenizer directory: its tokenizer_config.json's (or a tokenizer object's attributes), the eos
    else the first of `EOS_GUESSES` in the vocabulary. Compile appends that eos, and the runtime identifies a
    trainer's tokenizer alike (`plancc.store.tokenizer_identity`)."""
    eos = _token_text(config.get("eos_token"))
    if eos is None:
        eos = next((t for t in EOS_GUESSES if has_token(t)), None)
    return eos, _token_text(config.get("bos_token"))


def plan_fingerprint(cols: dict[str, np.ndarray]) -> str:
    """Digest of one epoch's plan rows in global order: order, membership, mapping and counts (`num_items` too).

    `cols` holds the plan columns as arrays plus the nested `sample_ids` as CSR (`sample_ids`, `row_bounds`,
    `batch_bounds`); compile hashes what it writes and the store hashes what it reads with this one function.
    """
    return array_digest(*(cols[k] for k in PLAN_FINGERPRINT_COLUMNS),
                        *(cols[k] for k in KIND_FINGERPRINT_COLUMNS if k in cols))


def eval_fingerprint(cols: dict[str, np.ndarray]) -> str:
    """Digest of the eval plan's rows (`evaluation.eval_columns`, CSR like `plan_fingerprint`'s): membership,
    order, ranks and counts."""
    return array_digest(*(cols[k] for k in EVAL_FINGERPRINT_COLUMNS))


def config_fingerprint(settings: dict[str, Any]) -> str:
    """Digest of every plan setting (`PlanSettings.to_dict()`)."""
    return canonical_hash(settings)


def before_checksum(epoch: np.ndarray, label_count: np.ndarray) -> str:
    """Digest of the before stage's label count per microbatch (`epoch`, `label_count`, in (epoch, index) order):
    the plan file records it, so an edit of before.parquet is detected like one of metrics.parquet."""
    return array_digest(epoch.astype(np.int32), label_count.astype(np.int64))


def metrics_checksum(rows: list[dict[str, Any]]) -> str:
    """Digest of the metrics rows as stored (epoch, stage, every metric; floats exactly): they have no fingerprint,
    so the plan file records this to make any edit of metrics.parquet detectable."""
    return canonical_hash({"metrics": rows})


__all__ = [
    "EOS_GUESSES",
    "EVAL_FINGERPRINT_COLUMNS",
    "PLAN_FINGERPRINT_COLUMNS",
    "array_digest",
    "before_checksum",
    "config_fingerprint",
    "dataset_fingerprint",
    "eval_fingerprint",
    "metadata_fingerprint",
    "metrics_checksum",
    "plan_fingerprint",
    "token_hashes",
    "tokenizer_specials",
]

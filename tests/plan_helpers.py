"""Test helpers: random token-level datasets and the samples tables they imply (by SPEC 2's definitions)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from plancc.fingerprint import token_hashes


def random_dataset(rng: np.random.Generator, n: int, max_len: int, mask_rate: float = 0.6
                   ) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """(input_ids, labels) per sample; every sample keeps at least one supervised target after its shift."""
    ids, labels = [], []
    for _ in range(n):
        length = int(rng.integers(2, max_len + 1))
        tok = rng.integers(0, 1000, length).astype(np.int32)
        lab = tok.copy()
        lab[rng.random(length) < mask_rate] = -100
        if (lab[1:] == -100).all():
            lab[-1] = tok[-1]
        ids.append(tok)
        labels.append(lab)
    return ids, labels


def samples_table(ids: list[np.ndarray], labels: list[np.ndarray], sample_ids: np.ndarray | None = None) -> pa.Table:
    """The samples table SPEC 2 defines for these samples (label_count counts the given label arrays)."""
    n = len(ids)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum([len(x) for x in ids], out=offsets[1:])
    flat_ids = np.concatenate(ids) if n else np.zeros(0, np.int32)
    flat_labels = np.concatenate(labels) if n else np.zeros(0, np.int32)
    return pa.table(
        {
            "sample_id": np.arange(n, dtype=np.int64) if sample_ids is None else sample_ids.astype(np.int64),
            "length": np.diff(offsets).astype(np.int32),
            "label_count": np.array([int((x != -100).sum()) for x in labels], dtype=np.int32),
            "first_label_supervised": np.array([bool(x[0] != -100) for x in labels]),
            "token_hash": token_hashes(flat_ids, offsets, flat_labels, offsets),
        }
    )


def write_samples_file(directory: Path, seed: int, n: int, max_len: int) -> Path:
    """`directory/samples.parquet`: the samples table of `random_dataset` drawn with `seed` (a compile source)."""
    ids, labels = random_dataset(np.random.default_rng(seed), n, max_len)
    path = directory / "samples.parquet"
    pq.write_table(samples_table(ids, labels), path)
    return path


def direct_targets(rows: list[list[int]], labels: list[np.ndarray], shift: str) -> int:
    """Supervised targets of one microbatch counted on the label tokens themselves (SPEC 3), no plan helpers."""
    total = 0
    for row in rows:
        if shift == "row":
            joined = np.concatenate([labels[i] for i in row])
            total += int((joined[1:] != -100).sum())
        elif shift == "sample":
            total += sum(int((labels[i][1:] != -100).sum()) for i in row)
        else:  # "none": the label arrays are already shifted labels
            total += sum(int((labels[i] != -100).sum()) for i in row)
    return total

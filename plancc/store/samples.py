"""The samples table's own facts: its fingerprints, and what a plannable one looks like."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow as pa

from plancc.config.settings import ROLES
from plancc.core.hashing import canonical_hash
from plancc.core.plan_arrays import SampleArrays
from plancc.errors import InputError
from plancc.store.fingerprint import array_digest, dataset_fingerprint, metadata_fingerprint
from plancc.store.parquet import column, sample_arrays
from plancc.store.schemas import DATASET_COLUMN, SAMPLES_SCHEMA, data_kind_of, samples_schema


def samples_fingerprints(table: pa.Table, identity: dict[str, str | None] | None = None) -> dict[str, str]:
    """`dataset` and `metadata` fingerprints of a samples table made with `identity` (`ScanRecord.identity`)."""
    col = {name: column(table, name) for name in SAMPLES_SCHEMA.names}
    if DATASET_COLUMN in table.column_names:  # a recipe's: which dataset each sample is of is what the plan saw
        codes, names = dataset_codes(table)
        identity = {**(identity or {}), "datasets": canonical_hash({"names": names, "codes": array_digest(codes)})}
    kind = data_kind_of(table.column_names)
    if kind != "sft":  # preference data: which completions pair up (or are desirable) is what the plan saw too
        arrays = sample_arrays(table)
        labels = [arrays.pair_id, arrays.chosen] if kind == "preference" else [arrays.desirable]
        identity = {**(identity or {}), kind: array_digest(*(a.astype(np.int64) for a in labels))}
    with ThreadPoolExecutor(1) as pool:  # two digests of a few GB at 100M samples, one a core (hashlib frees the GIL)
        dataset = pool.submit(dataset_fingerprint, col["sample_id"], col["token_hash"])
        metadata = metadata_fingerprint(col["sample_id"], col["length"], col["label_count"],
                                        col["first_label_supervised"], identity)
        return {"dataset": dataset.result(), "metadata": metadata}


def dataset_codes(table: pa.Table) -> tuple[np.ndarray, list[str]]:
    """A recipe samples table's `dataset` column as (int32 code per sample, names in order of first appearance)."""
    encoded = table.column(DATASET_COLUMN).combine_chunks().dictionary_encode()
    return column(pa.table({"c": encoded.indices}), "c"), encoded.dictionary.to_pylist()


def check_samples(table: pa.Table, path: Path) -> None:
    """Refuse a samples table plancc cannot plan (one line naming `path`, the row and what is wrong): ids negative,
    unsorted or repeated, a length that is not positive, a label count outside [0, length], a supervised first label
    that the label count leaves out (the planner's target counts would go negative), no rows."""
    sid = column(table, "sample_id")
    length = column(table, "length")
    count = column(table, "label_count")
    problems = [
        (np.flatnonzero(sid < 0), "sample_id is negative"),
        (np.flatnonzero(np.diff(sid) <= 0) + 1, "sample_id is not strictly increasing (unsorted or duplicate)"),
        (np.flatnonzero(length <= 0), "length must be positive"),
        (np.flatnonzero((count < 0) | (count > length)), "label_count must be in [0, length]"),
        (np.flatnonzero(column(table, "first_label_supervised") & (count == 0)),
         "first_label_supervised is true but label_count is 0 (a supervised first label is one of the labels)"),
    ]
    for rows, what in problems:
        if rows.size:
            raise InputError(f"{path} row {int(rows[0])}: {what}")
    if table.num_rows == 0:
        raise InputError(f"{path}: the samples table is empty")


def near_samples_table(path: Path, names: set[str]) -> None:
    """Refuse a Parquet file that is a samples table but for some columns (it has sample_id, length and label_count
    and no column any source format reads): telling its format would fail with a message about formats."""
    if {"sample_id", "length", "label_count"} <= names and not names & set(ROLES):
        want = set(samples_schema(False, data_kind_of(names)).names)
        wrong = [f"lacks {sorted(want - names)}"] if want - names else []
        wrong += [f"has {sorted(names - want)} besides"] if names - want else []
        raise InputError(f"{path} looks like a samples table but {' and '.join(wrong)}: a samples table has exactly "
                         f"the columns {sorted(want)} (schemas/samples.arrow.json)")


def is_samples_table(names: set[str]) -> bool:
    """Whether Parquet columns `names` are exactly a samples table's (SFT, or preference data's)."""
    return names == set(samples_schema(False, data_kind_of(names)).names)


def kind_counts(s: SampleArrays) -> dict[str, int]:
    """What a preference loss over all of `s` divides by: its pairs, or its desirable and undesirable completions
    (nothing for SFT samples)."""
    if s.kind == "preference":
        return {"pairs": int(s.chosen.sum())}
    if s.kind == "unpaired_preference":
        return {"desirable": int(s.desirable.sum()), "undesirable": int((~s.desirable).sum())}
    return {}

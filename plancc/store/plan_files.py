"""The tables a compile writes into a plan directory (plan, eval, metrics, before, samples) and the samples
source a compile reads from (a samples table, scan directory or plan directory)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from plancc.config.settings import ROLES
from plancc.core import layout
from plancc.core.hashing import canonical_hash
from plancc.errors import InputError
from plancc.store import atomic, token_store
from plancc.store.fingerprint import (
    array_digest,
    dataset_fingerprint,
    metadata_fingerprint,
)
from plancc.store.outputs import output_kind
from plancc.store.parquet import (
    arrow_array,
    column,
    file_metadata,
    optional_array,
    read_file_meta,
    read_samples,
    string_array,
    write_json,
    write_parquet,
)
from plancc.store.scan_record import RecordedOptions, ScanRecord
from plancc.store.schemas import (
    BEFORE_FILE,
    BEFORE_SCHEMA,
    DATASET_COLUMN,
    EVAL_FILE,
    EVAL_SCHEMA,
    MANIFEST_FILE,
    META_KEY,
    METRICS_FILE,
    PLAN_FILE,
    PLAN_ROW_GROUP,
    PLAN_SCHEMA,
    SAMPLES_FILE,
    SAMPLES_SCHEMA,
    SCAN_MANIFEST_FILE,
    TOKENS_DIR,
    StoreError,
    metrics_schema,
    samples_schema,
)


def metrics_table(rows: list[dict[str, Any]]) -> pa.Table:
    """Rows of {epoch, stage, metric...} as the metrics table."""
    schema = metrics_schema()
    arrays = [string_array([row[f.name] for row in rows]) if pa.types.is_string(f.type)
              else optional_array([row.get(f.name) for row in rows], f.type) for f in schema]
    return pa.Table.from_arrays(arrays, schema=schema)


def plan_table(cols: dict[str, Any], schema: pa.Schema = PLAN_SCHEMA) -> pa.Table:
    """Arrow plan table from `pipeline.plan_columns` arrays: the CSR bounds become the nested `sample_ids` lists."""
    rows = pa.ListArray.from_arrays(arrow_array(cols["row_bounds"], pa.int32()), arrow_array(cols["sample_ids"], pa.int64()))
    nested = pa.ListArray.from_arrays(arrow_array(cols["batch_bounds"], pa.int32()), rows)
    arrays = [nested if f.name == "sample_ids" else arrow_array(cols[f.name], f.type) for f in schema]
    return pa.Table.from_arrays(arrays, schema=schema)


def eval_table(cols: dict[str, Any]) -> pa.Table:
    """Arrow eval plan table from `evaluation.eval_columns` arrays."""
    return plan_table(cols, EVAL_SCHEMA)


def eval_summary(cols: dict[str, np.ndarray], world_size: int) -> dict[str, int]:
    """What the manifest records of the eval plan: its sizes and the global target count the loss divides by."""
    n = int(cols["index"].shape[0])
    return {
        "samples": int(cols["sample_ids"].shape[0]),
        "batches": n,
        "batches_per_rank": layout.steps_per_rank(n, world_size),
        "tokens": int(cols["tokens"].sum()),
        "label_count": int(cols["label_count"].sum()),
        "cost": int(cols["cost"].sum()),
    }


def before_table(epochs: list[int], label_counts: list[np.ndarray]) -> pa.Table:
    """The before stage's label count per microbatch of each epoch, in (epoch, index) order."""
    epoch = np.concatenate([np.full(len(c), e, dtype=np.int32) for e, c in zip(epochs, label_counts, strict=True)])
    index = np.concatenate([np.arange(len(c), dtype=np.int64) for c in label_counts])
    counts = np.concatenate(label_counts).astype(np.int64)
    return pa.Table.from_arrays([arrow_array(epoch, pa.int32()), arrow_array(index, pa.int64()),
                                 arrow_array(counts, pa.int64())], schema=BEFORE_SCHEMA)


def write_plan_files(directory: Path, plan: pa.Table, samples: pa.Table, metrics: pa.Table, before: pa.Table,
                     fingerprints: dict[str, Any], settings: dict[str, Any], manifest: dict[str, Any],
                     evaluation: pa.Table | None = None) -> None:
    """Write the plan directory's files into `directory` (a temporary one from `atomic_directory`).

    The plan file's metadata is the whole manifest (plus its kind): `manifest.json` is its human-readable mirror,
    so that nothing a reader relies on lives only in an unchecked JSON file.
    """
    plan_meta = {META_KEY: orjson.dumps({**manifest, "kind": "plan"}, option=orjson.OPT_SORT_KEYS)}
    write_parquet(plan, directory / PLAN_FILE, plan_meta, PLAN_ROW_GROUP)
    schema = samples_schema(DATASET_COLUMN in samples.column_names)
    write_parquet(samples.select(schema.names).cast(schema), directory / SAMPLES_FILE,
                  file_metadata("samples", fingerprints, settings))
    write_parquet(metrics, directory / METRICS_FILE, file_metadata("metrics", fingerprints, settings))
    write_parquet(before, directory / BEFORE_FILE, file_metadata("before", fingerprints, settings))
    if evaluation is not None:
        write_parquet(evaluation, directory / EVAL_FILE, file_metadata("eval", fingerprints, settings))
    write_json(manifest, directory / MANIFEST_FILE)


def _check_samples(table: pa.Table, path: Path) -> None:
    sid = column(table, "sample_id")
    length = column(table, "length")
    count = column(table, "label_count")
    problems = [
        (np.flatnonzero(sid < 0), "sample_id is negative"),
        (np.flatnonzero(np.diff(sid) <= 0) + 1, "sample_id is not strictly increasing (unsorted or duplicate)"),
        (np.flatnonzero(length <= 0), "length must be positive"),
        (np.flatnonzero((count < 0) | (count > length)), "label_count must be in [0, length]"),
    ]
    for rows, what in problems:
        if rows.size:
            raise InputError(f"{path} row {int(rows[0])}: {what}")
    if table.num_rows == 0:
        raise InputError(f"{path}: the samples table is empty")


def _near_samples_table(path: Path, names: set[str]) -> None:
    """Refuse a Parquet file that is a samples table but for some columns (it has sample_id, length and label_count
    and no column any source format reads): telling its format would fail with a message about formats."""
    if {"sample_id", "length", "label_count"} <= names and not names & set(ROLES):
        want = set(SAMPLES_SCHEMA.names)
        wrong = [f"lacks {sorted(want - names)}"] if want - names else []
        wrong += [f"has {sorted(names - want)} besides"] if names - want else []
        raise InputError(f"{path} looks like a samples table but {' and '.join(wrong)}: a samples table has exactly "
                         f"the columns {SAMPLES_SCHEMA.names} (schemas/samples.arrow.json)")


def read_samples_source(path: str | Path) -> tuple[pa.Table, dict] | None:
    """A samples table given as SOURCE (Parquet with the samples schema, or a SCAN_DIR/PLAN_DIR); else None."""
    p = Path(path).expanduser()
    if p.is_dir() or not p.exists():
        atomic.recover(p)
    if p.is_dir():
        f = p / SAMPLES_FILE
        if not f.is_file():
            kind = output_kind(p)
            if kind is not None:
                raise InputError(f"{p} is a plancc {kind} directory without its {SAMPLES_FILE}: it was deleted or "
                                 "moved; compile or scan the source again")
            return None
    elif p.is_file() and p.suffix.lower() == ".parquet":
        f = p
        try:
            names = set(pq.read_schema(f).names)
        except (pa.ArrowException, OSError) as exc:
            raise InputError(f"{f}: not a readable Parquet file ({exc})") from None
        if names != set(SAMPLES_SCHEMA.names):
            _near_samples_table(f, names)
            return None
    else:
        return None
    table = read_samples(f)
    _check_samples(table, f)
    try:
        meta = read_file_meta(f)
    except StoreError:
        meta = None  # written by another engine: fine, the plan recomputes its fingerprints
    info: dict[str, Any] = {"path": str(f), "meta": meta}
    # a scan's samples.parquet on its own still carries its scan's options (sequence_len, shift: `carry`)
    info["scan_options"] = RecordedOptions.from_metadata(meta.get("settings")) if meta and meta.get("kind") == \
        "samples" else None
    tokens = f.parent / TOKENS_DIR
    info["tokenized_path"] = str(tokens) if token_store.is_store(tokens) else None
    info["record"] = None
    if f.name == SAMPLES_FILE and (f.parent / SCAN_MANIFEST_FILE).is_file():
        record = info["record"] = ScanRecord.read(f.parent)
        check_recorded(table, f, record.identity, record.fingerprint_map, f.parent / SCAN_MANIFEST_FILE,
                       info["tokenized_path"])
    else:
        _check_planned(f, table, info)
    return table, info


def _check_planned(f: Path, table: pa.Table, info: dict[str, Any]) -> None:
    """A plan directory given as SOURCE: its samples and token store against its `manifest.json`."""
    record_file = f.parent / MANIFEST_FILE
    if not record_file.is_file() or f.name != SAMPLES_FILE:
        return  # a bare samples table: nothing records what it held
    try:
        record = orjson.loads(record_file.read_bytes())
        identity = ScanRecord.from_json(record["scan"], f"{record_file} scan").identity
        recorded = {k: record["fingerprints"][k] for k in ("dataset", "metadata")}
    except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError):
        raise InputError(f"{record_file} is not a readable plancc record (edited?): rescan the source") from None
    check_recorded(table, f, identity, recorded, record_file, info["tokenized_path"])


def check_recorded(table: pa.Table, f: Path, identity: dict[str, str | None], recorded: dict[str, str],
                   record_file: Path, tokens: str | Path | None) -> None:
    """A scan's or plan's samples (`table`, read from `f`) must still hash to the fingerprints `record_file`
    records, and its token store open (the constant-cost checks) holding the same; else a plan would be built on
    edited or swapped-in rows and only a later `validate` would tell."""
    found = samples_fingerprints(table, identity)
    for key in ("dataset", "metadata"):
        if found[key] != recorded.get(key):
            raise InputError(f"{f}: its rows do not hash to the {key} fingerprint {record_file} records (the "
                             "samples table was edited or swapped in): rescan the source")
    if tokens:
        header = token_store.open_store(tokens).header
        if header["fingerprints"] != recorded:
            raise InputError(f"{tokens}: its fingerprints are not those {record_file} records (the "
                             "token store was swapped in from another scan): rescan the source")


def samples_fingerprints(table: pa.Table, identity: dict[str, str | None] | None = None) -> dict[str, str]:
    """`dataset` and `metadata` fingerprints of a samples table made with `identity` (`ScanRecord.identity`)."""
    col = {name: column(table, name) for name in SAMPLES_SCHEMA.names}
    if DATASET_COLUMN in table.column_names:  # a recipe's: which dataset each sample is of is what the plan saw
        codes, names = dataset_codes(table)
        identity = {**(identity or {}), "datasets": canonical_hash({"names": names, "codes": array_digest(codes)})}
    return {
        "dataset": dataset_fingerprint(col["sample_id"], col["token_hash"]),
        "metadata": metadata_fingerprint(col["sample_id"], col["length"], col["label_count"],
                                         col["first_label_supervised"], identity),
    }


def dataset_codes(table: pa.Table) -> tuple[np.ndarray, list[str]]:
    """A recipe samples table's `dataset` column as (int32 code per sample, names in order of first appearance)."""
    encoded = table.column(DATASET_COLUMN).combine_chunks().dictionary_encode()
    return column(pa.table({"c": encoded.indices}), "c"), encoded.dictionary.to_pylist()

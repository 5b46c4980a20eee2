"""The tables a compile writes into a plan directory (plan, eval, metrics, before, samples) and the one function
that writes them with the manifest (`write_plan_files`)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pyarrow as pa

from plancc.core.plan_arrays import Batches, permute_batches
from plancc.store import plan_body
from plancc.store.manifest import Manifest
from plancc.store.parquet import (
    arrow_array,
    file_metadata,
    optional_array,
    string_array,
    write_json,
    write_parquet,
)
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
    PLAN_SCHEMA,
    SAMPLES_FILE,
    data_kind_of,
    metrics_schema,
    samples_schema,
)


def metrics_table(rows: list[dict[str, Any]], kind: str = "sft") -> pa.Table:
    """Rows of {epoch, stage, metric...} as the metrics table (of a plan of `kind`: `schemas.data_kind_of`)."""
    schema = metrics_schema(kind)
    arrays = [string_array([row[f.name] for row in rows]) if pa.types.is_string(f.type)
              else optional_array([row.get(f.name) for row in rows], f.type) for f in schema]
    return pa.Table.from_arrays(arrays, schema=schema)


def plan_table(cols: dict[str, Any], schema: pa.Schema = PLAN_SCHEMA) -> pa.Table:
    """Arrow plan table from `pipeline.plan_columns` arrays: the CSR bounds become the nested `sample_ids` lists."""
    rows = pa.ListArray.from_arrays(arrow_array(cols["row_bounds"], pa.int32()), arrow_array(cols["sample_ids"], pa.int64()))
    nested = pa.ListArray.from_arrays(arrow_array(cols["batch_bounds"], pa.int32()), rows)
    arrays = [nested if f.name == "sample_ids" else arrow_array(cols[f.name], f.type) for f in schema]
    return pa.Table.from_arrays(arrays, schema=schema)


NESTED = ("sample_ids", "row_bounds", "batch_bounds")  # the CSR of `sample_ids`; every other column is per row


class PlanRows:
    """Every epoch's plan rows in the plan file's order, (epoch, rank, index), made a row group at a time from each
    epoch's columns (`pipeline.plan_columns`, in index order): a sorted copy of the whole plan table was the
    largest allocation at the end of a compile (1.6 GiB at 100M samples)."""

    def __init__(self, epochs: list[dict[str, Any]], schema: pa.Schema = PLAN_SCHEMA):
        self.epochs = sorted(epochs, key=lambda cols: int(cols["epoch"][0]) if len(cols["epoch"]) else 0)
        self.schema = schema
        orders = [np.argsort(cols["rank"], kind="stable") for cols in self.epochs]  # index order within a rank
        self.part = np.concatenate([np.full(o.shape[0], k, dtype=np.int64) for k, o in enumerate(orders)])
        self.local = np.concatenate(orders)
        self.epoch = np.concatenate([cols["epoch"][o] for cols, o in zip(self.epochs, orders, strict=True)])
        self.rank = np.concatenate([cols["rank"][o] for cols, o in zip(self.epochs, orders, strict=True)])

    def rows(self, a: int, b: int) -> pa.Table:
        """Rows a..b-1 of the sorted plan as one contiguous table."""
        part, local = self.part[a:b], self.local[a:b]
        tables = [plan_table(_taken(self.epochs[k], local[part == k]), self.schema) for k in np.unique(part)]
        return tables[0] if len(tables) == 1 else pa.concat_tables(tables).combine_chunks()


def _taken(cols: dict[str, Any], batches: np.ndarray) -> dict[str, Any]:
    """An epoch's plan columns (`plan_table`'s input) of the microbatches `batches` only, in that order."""
    nested = permute_batches(Batches(cols["sample_ids"], cols["row_bounds"], cols["batch_bounds"]), batches)
    return {**{name: values[batches] for name, values in cols.items() if name not in NESTED},
            "sample_ids": nested.samples, "row_bounds": nested.row_bounds, "batch_bounds": nested.batch_bounds}


def eval_table(cols: dict[str, Any]) -> pa.Table:
    """Arrow eval plan table from `evaluation.eval_columns` arrays."""
    return plan_table(cols, EVAL_SCHEMA)


def before_table(epochs: list[int], label_counts: list[np.ndarray]) -> pa.Table:
    """The before stage's label count per microbatch of each epoch, in (epoch, index) order."""
    epoch = np.concatenate([np.full(len(c), e, dtype=np.int32) for e, c in zip(epochs, label_counts, strict=True)])
    index = np.concatenate([np.arange(len(c), dtype=np.int64) for c in label_counts])
    counts = np.concatenate(label_counts).astype(np.int64)
    return pa.Table.from_arrays([arrow_array(epoch, pa.int32()), arrow_array(index, pa.int64()),
                                 arrow_array(counts, pa.int64())], schema=BEFORE_SCHEMA)


def write_plan_files(directory: Path, manifest: Manifest, rows: PlanRows, samples: pa.Table, metrics: pa.Table,
                     before: pa.Table, evaluation: pa.Table | None = None) -> None:
    """Write the plan directory's files into `directory` (a temporary one from `atomic_directory`): the plan
    table's `rows`, the samples, metrics, before and eval tables, and the manifest.

    The plan file's metadata is the whole manifest (plus its kind): `manifest.json` is its human-readable mirror,
    so that nothing a reader relies on lives only in an unchecked JSON file. Every sibling file carries the
    fingerprints and settings.
    """
    record = manifest.to_json()
    plan_meta = {META_KEY: orjson.dumps({**record, "kind": "plan"}, option=orjson.OPT_SORT_KEYS)}
    fingerprints, settings = record["fingerprints"], record["settings"]
    schema = samples_schema(DATASET_COLUMN in samples.column_names, data_kind_of(samples.column_names))
    with ThreadPoolExecutor(1) as pool:  # the two large files compress on both cores (Arrow's writer frees the GIL)
        samples_written = pool.submit(write_parquet, samples.select(schema.names).cast(schema),
                                      directory / SAMPLES_FILE, file_metadata("samples", fingerprints, settings))
        plan_body.write_row_groups(rows.schema, rows.epoch, rows.rank, rows.rows, directory / PLAN_FILE, plan_meta)
        samples_written.result()
    write_parquet(metrics, directory / METRICS_FILE, file_metadata("metrics", fingerprints, settings))
    write_parquet(before, directory / BEFORE_FILE, file_metadata("before", fingerprints, settings))
    if evaluation is not None:
        write_parquet(evaluation, directory / EVAL_FILE, file_metadata("eval", fingerprints, settings))
    write_json(record, directory / MANIFEST_FILE)

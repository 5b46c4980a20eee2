"""The files of a plan or scan directory: their names, Arrow schemas and metadata keys (what the store
writes and what the scan, runtime and review read back by these names)."""

from __future__ import annotations

import pyarrow as pa

from plancc.core.metric_columns import METRIC_COLUMNS
from plancc.errors import PlanccError

SCHEMA_VERSION = 1

PLAN_FILE = "plan.parquet"
SAMPLES_FILE = "samples.parquet"
METRICS_FILE = "metrics.parquet"
BEFORE_FILE = "before.parquet"  # the `before` stage's label count per microbatch: what inspect plots against `after`
EVAL_FILE = "eval.parquet"  # the eval plan (`plancc.planner.evaluation`), in plans compiled with held-out samples
MANIFEST_FILE = "manifest.json"
TOKENS_DIR = "tokens"  # the token store (plancc.store.token_store), in scan and plan directories
TOKENIZED_FILE = "tokenized.parquet"  # what older plans shipped instead; read only when given as data=
SCAN_MANIFEST_FILE = "scan.json"

ARROW_SCHEMA_KEY = b"ARROW:schema"  # pyarrow's serialized Arrow schema (store_schema=True)
META_KEY = b"plancc"  # JSON: {"schema": int, "fingerprints": {...}, "settings": {...}, "kind": str}
ROWS_KEY = b"plancc.rows"  # the plan file's footer: xxh3-128 of its bytes before the footer (`plancc.store.plan_body`)

SAMPLES_SCHEMA = pa.schema(
    [
        pa.field("sample_id", pa.int64(), nullable=False),
        pa.field("length", pa.int32(), nullable=False),
        pa.field("label_count", pa.int32(), nullable=False),
        pa.field("first_label_supervised", pa.bool_(), nullable=False),
        pa.field("token_hash", pa.uint64(), nullable=False),
    ]
)

DATASET_COLUMN = "dataset"  # a recipe's samples table: the name of each sample's dataset (`plancc.config.recipe`)
RECIPE_SAMPLES_SCHEMA = SAMPLES_SCHEMA.append(pa.field(DATASET_COLUMN, pa.string(), nullable=False))


def samples_schema(recipe: bool) -> pa.Schema:
    """The samples table's schema: a recipe's has the `dataset` column."""
    return RECIPE_SAMPLES_SCHEMA if recipe else SAMPLES_SCHEMA


PLAN_SCHEMA = pa.schema(
    [
        pa.field("epoch", pa.int32(), nullable=False),
        pa.field("index", pa.int64(), nullable=False),
        pa.field("update", pa.int64(), nullable=False),
        pa.field("rank", pa.int32(), nullable=False),
        pa.field("micro_step", pa.int32(), nullable=False),
        pa.field("sample_ids", pa.list_(pa.list_(pa.int64())), nullable=False),
        pa.field("tokens", pa.int64(), nullable=False),
        pa.field("label_count", pa.int64(), nullable=False),
        pa.field("cost", pa.int64(), nullable=False),
        pa.field("num_items", pa.int64(), nullable=False),
        pa.field("complete_update", pa.bool_(), nullable=False),
    ]
)

BEFORE_SCHEMA = pa.schema(
    [
        pa.field("epoch", pa.int32(), nullable=False),
        pa.field("index", pa.int64(), nullable=False),
        pa.field("label_count", pa.int64(), nullable=False),
    ]
)

EVAL_SCHEMA = pa.schema(
    [
        pa.field("index", pa.int64(), nullable=False),
        pa.field("rank", pa.int32(), nullable=False),
        pa.field("sample_ids", pa.list_(pa.list_(pa.int64())), nullable=False),
        pa.field("tokens", pa.int64(), nullable=False),
        pa.field("label_count", pa.int64(), nullable=False),
        pa.field("cost", pa.int64(), nullable=False),
    ]
)

PLAN_ROW_GROUP = 65_536


class StoreError(PlanccError):
    """A plan or scan file is missing, corrupt, foreign or of another schema version; the message names it."""


def metrics_schema() -> pa.Schema:
    """The metrics table's Arrow schema: epoch, stage, then every metric column (int64 or float64, nullable)."""
    types = {"int": pa.int64(), "float": pa.float64()}
    return pa.schema(
        [pa.field("epoch", pa.int32(), nullable=False), pa.field("stage", pa.string(), nullable=False)]
        + [pa.field(name, types[kind]) for name, kind in METRIC_COLUMNS]
    )

"""The files of a plan or scan directory: their names, Arrow schemas and metadata keys (what the store
writes and what the scan, runtime and review read back by these names)."""

from __future__ import annotations

import pyarrow as pa

from plancc.core.metric_columns import KIND_METRIC_COLUMNS, METRIC_COLUMNS
from plancc.core.pairs import DESIRABLE_COLUMN, PAIR_ID_COLUMN, PAIR_ROLE_COLUMN, PAIR_ROLES  # noqa: F401 (re-exported)
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

# preference data (docs/preference.md): each completion is a sample; paired data names its pair and role, unpaired
# (KTO) data its label. An SFT samples table has none of these columns.
KIND_FIELDS = {
    "sft": (),
    "preference": (pa.field(PAIR_ID_COLUMN, pa.int64(), nullable=False),
                   pa.field(PAIR_ROLE_COLUMN, pa.string(), nullable=False)),
    "unpaired_preference": (pa.field(DESIRABLE_COLUMN, pa.bool_(), nullable=False),),
}


def data_kind_of(names: list[str] | set[str]) -> str:
    """What a samples table with columns `names` holds: `sft`, `preference` (pairs) or `unpaired_preference`."""
    return next((kind for kind, extra in KIND_FIELDS.items() if extra and {f.name for f in extra} <= set(names)),
                "sft")


def samples_schema(recipe: bool, kind: str = "sft") -> pa.Schema:
    """The samples table's schema: preference data adds its pair (or label) columns, a recipe's the `dataset`
    column."""
    schema = SAMPLES_SCHEMA
    for extra in KIND_FIELDS[kind]:
        schema = schema.append(extra)
    return schema.append(RECIPE_SAMPLES_SCHEMA.field(DATASET_COLUMN)) if recipe else schema


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

# preference plans (docs/preference.md): per microbatch, totals of its whole update on all ranks
KIND_PLAN_FIELDS = {
    "sft": (),
    "preference": (pa.field("num_pairs", pa.int64(), nullable=False),
                   pa.field("num_chosen_items", pa.int64(), nullable=False)),
    "unpaired_preference": (pa.field("num_desirable", pa.int64(), nullable=False),
                            pa.field("num_undesirable", pa.int64(), nullable=False)),
}


def plan_schema(kind: str = "sft") -> pa.Schema:
    """The plan table's schema for a plan of `kind` (`data_kind_of`): preference plans add their update totals."""
    schema = PLAN_SCHEMA
    for extra in KIND_PLAN_FIELDS[kind]:
        schema = schema.append(extra)
    return schema


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


def metrics_schema(kind: str = "sft") -> pa.Schema:
    """The metrics table's Arrow schema: epoch, stage, then every metric column (int64 or float64, nullable), and
    those of preference data for its `kind` of plan."""
    types = {"int": pa.int64(), "float": pa.float64()}
    return pa.schema(
        [pa.field("epoch", pa.int32(), nullable=False), pa.field("stage", pa.string(), nullable=False)]
        + [pa.field(name, types[t]) for name, t in (*METRIC_COLUMNS, *KIND_METRIC_COLUMNS[kind])]
    )

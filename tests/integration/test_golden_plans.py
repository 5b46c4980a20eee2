"""Plans are pinned: every layout x shift (and the settings that change the layout: real batches, padding multiple,
drop-last, rank cost, no balance, world sizes) compiled from fixed generated samples tables gives the stored
fingerprints (dataset, metadata, config, plan per epoch), metrics and before checksums and plan-table digest.

A refactor must leave these byte-identical. A change that alters plans on purpose (a better balancer) regenerates
them and says so in its commit:

    PLANCC_UPDATE_GOLDEN=1 python -m pytest -q tests/integration/test_golden_plans.py
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import plancc
from tests.support import REPO

GOLDEN = REPO / "tests" / "golden" / "plans.json"
UPDATE = os.environ.get("PLANCC_UPDATE_GOLDEN") == "1"

BASE = {"sequence_len": 256, "micro_batch_size": 2, "world_size": 2, "grad_accum": 2, "epochs": 2, "seed": 5}
CASES: dict[str, dict] = {
    f"{mode}-{shift}": {"mode": mode, "shift": shift} for mode in ("packed", "padded", "flattened")
    for shift in ("sample", "row", "none")
}
CASES |= {
    "packed-real-batches": {"mode": "packed", "real_batches": True},
    "padded-pad8": {"mode": "padded", "pad_multiple": 8},
    "packed-drop-last": {"mode": "packed", "drop_last": True, "world_size": 3},
    "packed-attention-cost": {"mode": "packed", "cost": "attention", "world_size": 4, "grad_accum": 1},
    "flattened-attention-cost": {"mode": "flattened", "cost": "attention", "world_size": 4, "grad_accum": 1},
    "packed-no-balance": {"mode": "packed", "balance": False},
    "padded-w1": {"mode": "padded", "world_size": 1, "grad_accum": 3, "micro_batch_size": 3},
    "packed-window8": {"mode": "packed", "balance_window": 8, "balance_passes": 2, "micro_batch_size": 1},
}
TABLES = {"skewed": (0, 700, 0.6), "short": (1, 400, 0.2)}  # name: (seed, samples, share of masked-prompt length)


def samples_table(seed: int, n: int, prompt_share: float) -> pa.Table:
    """A samples table of SFT-like shape: lognormal lengths, a masked prompt share, a few first labels supervised."""
    rng = np.random.default_rng(seed)
    length = np.clip(rng.lognormal(4.2, 0.8, n).astype(np.int64), 4, 256)
    masked = (length * rng.uniform(0, 2 * prompt_share, n).clip(0, 0.95)).astype(np.int64)
    return pa.table({
        "sample_id": pa.array(np.arange(n) * 3 + 1, pa.int64()),  # ids need not be dense
        "length": pa.array(length, pa.int32()),
        "label_count": pa.array(np.maximum(length - masked, 2), pa.int32()),
        "first_label_supervised": pa.array(rng.random(n) < 0.15),
        "token_hash": pa.array(rng.integers(0, 2**63, n).astype(np.uint64)),
    })


def table_digest(path: Path) -> str:
    """Digest of a Parquet file's rows (every column, in order): the bytes' meaning, not pyarrow's encoding."""
    return hashlib.blake2b(orjson.dumps(pq.read_table(path).to_pydict()), digest_size=16).hexdigest()


def plan_record(plan_dir: Path) -> dict:
    fps = plancc.open_plan(plan_dir).fingerprints
    manifest = json.loads((plan_dir / "manifest.json").read_text())
    return {
        **{k: fps[k] for k in ("dataset", "metadata", "config", "plan")},
        "metrics": manifest["checksums"]["metrics"],
        "before": manifest["checksums"]["before"],
        "plan_table": table_digest(plan_dir / "plan.parquet"),
    }


@pytest.fixture(scope="module")
def records(tmp_path_factory) -> dict[str, dict]:
    d = tmp_path_factory.mktemp("golden")
    out = {}
    for tname, args in TABLES.items():
        source = d / f"{tname}.parquet"
        pq.write_table(samples_table(*args), source)
        for cname, overrides in CASES.items():
            plan_dir = d / f"{tname}-{cname}"
            plancc.compile(str(source), plan_dir, cache_dir=d / "cache", **{**BASE, **overrides})
            out[f"{tname}/{cname}"] = plan_record(plan_dir)
    if UPDATE:
        GOLDEN.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    return out


def test_golden_file_covers_every_case(records):
    golden = json.loads(GOLDEN.read_text())
    assert sorted(golden) == sorted(records)


@pytest.mark.parametrize("key", [f"{t}/{c}" for t in TABLES for c in CASES])
def test_plan_is_byte_identical_to_golden(records, key):
    golden = json.loads(GOLDEN.read_text())
    assert records[key] == golden[key], (
        f"{key}: the plan changed; if on purpose, regenerate with PLANCC_UPDATE_GOLDEN=1 (tests/integration/test_golden_plans.py)"
    )

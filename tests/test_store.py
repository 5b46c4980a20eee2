"""The plan directory contract (SPEC 6, 9): documented schemas, fingerprints in every file, atomic writes,
refused concurrent writers, corrupt and foreign files. Validation and tampering: test_validate.py."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from plancc import atomic, store, token_store
from plancc.build import write_plan_dir
from plancc.config import PlanSettings
from plancc.pipeline import compile_plan
from plancc.store import sample_arrays
from tests.plan_helpers import random_dataset, samples_table

SCHEMAS = Path(__file__).parent.parent / "schemas"
SETTINGS = PlanSettings(micro_batch_size=2, sequence_len=64, world_size=2, grad_accum=2, epochs=2)


def _write(path: Path, settings: PlanSettings = SETTINGS, n: int = 200, overwrite: bool = False) -> Path:
    ids, labels = random_dataset(np.random.default_rng(1), n, 64)
    table = samples_table(ids, labels)
    s = sample_arrays(table)
    write_plan_dir(path, table, s, settings, compile_plan(s, settings), {}, None, overwrite=overwrite)
    return path


def _described(name: str) -> list[tuple[str, str, bool]]:
    doc = json.loads((SCHEMAS / f"{name}.arrow.json").read_text())
    return [(c["name"], c["type"], c["nullable"]) for c in doc["columns"] if not c.get("optional")]


def _actual(schema: pa.Schema) -> list[tuple[str, str, bool]]:
    """(name, type, nullable); list item names differ between Arrow ('item') and Parquet ('element')."""
    return [(f.name, re.sub(r"(item|element): ", "", str(f.type)), f.nullable) for f in schema]


@pytest.mark.parametrize(
    ("name", "schema"),
    [("plan", store.PLAN_SCHEMA), ("samples", store.SAMPLES_SCHEMA), ("metrics", store.metrics_schema()),
     ("before", store.BEFORE_SCHEMA)],
)
def test_documented_schemas_match_the_code(name, schema):
    assert _described(name) == _actual(schema)


def test_token_store_matches_its_documented_schema(tmp_path):
    doc = json.loads((SCHEMAS / "tokens.schema.json").read_text())
    assert {a["file"]: a["dtype"] for a in doc["x-arrays"]} == {f"{k}.npy": v.str for k, v in token_store.ARRAYS.items()}
    ids, labels = random_dataset(np.random.default_rng(3), 30, 40)
    offsets = np.concatenate([[0], np.cumsum([len(x) for x in ids])])
    token_store.write_store(tmp_path / "tokens", np.concatenate(ids), np.concatenate(labels), offsets,
                            fingerprints=store.samples_fingerprints(samples_table(ids, labels)), chunk_tokens=100)
    jsonschema.validate(json.loads((tmp_path / "tokens" / token_store.HEADER_FILE).read_text()), doc)
    m = token_store.open_store(tmp_path / "tokens")
    assert m.num_chunks > 1 and token_store.verify_all(m) is None
    assert token_store.to_table(tmp_path / "tokens").column("labels").to_pylist() == [list(x) for x in labels]


def test_written_plan_matches_documented_schemas_and_carries_fingerprints(tmp_path):
    plan_dir = _write(tmp_path / "plan")
    manifest = json.loads((plan_dir / store.MANIFEST_FILE).read_text())
    jsonschema.validate(manifest, json.loads((SCHEMAS / "manifest.schema.json").read_text()))
    for file, name in [(store.PLAN_FILE, "plan"), (store.SAMPLES_FILE, "samples"), (store.METRICS_FILE, "metrics"),
                       (store.BEFORE_FILE, "before")]:
        schema = pq.read_schema(plan_dir / file)
        assert _actual(schema) == _described(name)
        meta = store.read_file_meta(plan_dir / file)
        assert meta["fingerprints"] == manifest["fingerprints"]
        assert meta["settings"] == manifest["settings"]
    assert sorted(manifest["fingerprints"]["plan"]) == ["0", "1"]


def test_failed_write_keeps_the_old_plan_and_leaves_no_temporaries(tmp_path):
    plan_dir = _write(tmp_path / "plan")
    before = {p.name: p.read_bytes() for p in plan_dir.iterdir()}
    with pytest.raises(RuntimeError), store.atomic_directory(plan_dir, overwrite=True) as tmp:
        (tmp / store.PLAN_FILE).write_bytes(b"half a plan")
        raise RuntimeError("crash in the middle of writing")
    assert {p.name: p.read_bytes() for p in plan_dir.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan"]  # no temporary, no lock file


def test_successful_rewrite_replaces_the_whole_directory(tmp_path):
    plan_dir = _write(tmp_path / "plan")
    (plan_dir / store.TOKENIZED_FILE).write_text("what an older plancc wrote")  # a user's file is refused instead
    _write(plan_dir, PlanSettings(micro_batch_size=1, sequence_len=64), overwrite=True)
    assert not (plan_dir / store.TOKENIZED_FILE).exists()
    assert json.loads((plan_dir / store.MANIFEST_FILE).read_text())["settings"]["micro_batch_size"] == 1


def test_second_writer_of_the_same_directory_is_refused(tmp_path):
    with (
        store.atomic_directory(tmp_path / "plan"),
        pytest.raises(atomic.OutputBusy, match="another plancc process"),
        store.atomic_directory(tmp_path / "plan"),
    ):
        pass


def test_corrupt_and_foreign_files_are_clear_errors(tmp_path):
    plan_dir = _write(tmp_path / "plan")
    data = (plan_dir / store.PLAN_FILE).read_bytes()
    (plan_dir / store.PLAN_FILE).write_bytes(data[: len(data) // 2])
    with pytest.raises(store.StoreError, match=r"plan\.parquet"):
        store.PlanDir(plan_dir).read_epoch(0)
    foreign = tmp_path / "foreign.parquet"
    pq.write_table(pa.table({"x": [1, 2]}), foreign)
    with pytest.raises(store.StoreError, match="not written by plancc"):
        store.read_file_meta(foreign)
    with pytest.raises(store.StoreError, match="missing column 'sample_id'"):
        store.read_samples(foreign)


def test_per_rank_read_skips_row_groups(tmp_path):
    """Rows are stored by (epoch, rank): one rank's epoch touches few row groups."""
    settings = PlanSettings(micro_batch_size=1, sequence_len=8, world_size=4, grad_accum=1, balance=False)
    ids, labels = random_dataset(np.random.default_rng(2), 4000, 4)
    table = samples_table(ids, labels)
    s = sample_arrays(table)
    plan_dir = tmp_path / "plan"
    write_plan_dir(plan_dir, table, s, settings, compile_plan(s, settings), {}, None)
    stored = pq.read_table(plan_dir / store.PLAN_FILE, columns=["rank"]).column("rank")
    assert pc.all(pc.greater_equal(pc.pairwise_diff(stored.combine_chunks())[1:], 0)).as_py()


@pytest.mark.parametrize("writer", [pa.ipc.new_file, pa.ipc.new_stream])
def test_arrow_files_and_streams_read_alike(tmp_path, writer):
    """`.arrow` is either IPC format: the file one (pyarrow's default) or the stream one `datasets` writes."""
    table = pa.table({"input_ids": [[1, 2], [3]], "labels": [[-100, 2], [3]]})
    path = tmp_path / "data.arrow"
    with pa.OSFile(str(path), "wb") as sink, writer(sink, table.schema) as w:
        w.write_table(table)
    assert store.read_arrow(path).equals(table)

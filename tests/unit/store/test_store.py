"""The plan directory contract (docs/spec.md §6, 9): documented schemas, fingerprints in every file, atomic writes,
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

from plancc.build.run import write_plan_dir
from plancc.config.settings import PlanSettings
from plancc.planner.pipeline import compile_plan
from plancc.store import atomic, outputs, parquet, schemas, token_store, token_writer
from plancc.store.parquet import sample_arrays
from plancc.store.plan_store import PlanFiles
from plancc.store.samples import samples_fingerprints
from plancc.store.scan_record import ScanRecord
from tests.support import REPO
from tests.support.plans import random_dataset, samples_table

SCHEMAS = REPO / "schemas"
SETTINGS = PlanSettings(micro_batch_size=2, sequence_len=64, world_size=2, grad_accum=2, epochs=2)


def _write(path: Path, settings: PlanSettings = SETTINGS, n: int = 200, overwrite: bool = False) -> Path:
    ids, labels = random_dataset(np.random.default_rng(1), n, 64)
    table = samples_table(ids, labels)
    s = sample_arrays(table)
    write_plan_dir(path, table, s, settings, compile_plan(s, settings), ScanRecord(), None, overwrite=overwrite)
    return path


def _described(name: str) -> list[tuple[str, str, bool]]:
    doc = json.loads((SCHEMAS / f"{name}.arrow.json").read_text())
    return [(c["name"], c["type"], c["nullable"]) for c in doc["columns"] if not c.get("optional")]


def _actual(schema: pa.Schema) -> list[tuple[str, str, bool]]:
    """(name, type, nullable); list item names differ between Arrow ('item') and Parquet ('element')."""
    return [(f.name, re.sub(r"(item|element): ", "", str(f.type)), f.nullable) for f in schema]


@pytest.mark.parametrize(
    ("name", "schema"),
    [("plan", schemas.PLAN_SCHEMA), ("samples", schemas.SAMPLES_SCHEMA), ("metrics", schemas.metrics_schema()),
     ("before", schemas.BEFORE_SCHEMA)],
)
def test_documented_schemas_match_the_code(name, schema):
    assert _described(name) == _actual(schema)


def test_token_store_matches_its_documented_schema(tmp_path):
    doc = json.loads((SCHEMAS / "tokens.schema.json").read_text())
    assert {a["file"]: a["dtype"] for a in doc["x-arrays"]} == {f"{k}.npy": v.str for k, v in token_store.ARRAYS.items()}
    ids, labels = random_dataset(np.random.default_rng(3), 30, 40)
    offsets = np.concatenate([[0], np.cumsum([len(x) for x in ids])])
    token_writer.write_store(tmp_path / "tokens", np.concatenate(ids), np.concatenate(labels), offsets,
                             fingerprints=samples_fingerprints(samples_table(ids, labels)), chunk_tokens=100)
    jsonschema.validate(json.loads((tmp_path / "tokens" / token_store.HEADER_FILE).read_text()), doc)
    m = token_store.open_store(tmp_path / "tokens")
    assert m.num_chunks > 1 and token_store.verify_all(m) is None
    assert token_store.to_table(tmp_path / "tokens").column("labels").to_pylist() == [list(x) for x in labels]


def test_written_plan_matches_documented_schemas_and_carries_fingerprints(tmp_path):
    plan_dir = _write(tmp_path / "plan")
    manifest = json.loads((plan_dir / schemas.MANIFEST_FILE).read_text())
    jsonschema.validate(manifest, json.loads((SCHEMAS / "manifest.schema.json").read_text()))
    for file, name in [(schemas.PLAN_FILE, "plan"), (schemas.SAMPLES_FILE, "samples"), (schemas.METRICS_FILE, "metrics"),
                       (schemas.BEFORE_FILE, "before")]:
        schema = pq.read_schema(plan_dir / file)
        assert _actual(schema) == _described(name)
        meta = parquet.read_file_meta(plan_dir / file)
        assert meta["fingerprints"] == manifest["fingerprints"]
        assert meta["settings"] == manifest["settings"]
    assert sorted(manifest["fingerprints"]["plan"]) == ["0", "1"]


def test_failed_write_keeps_the_old_plan_and_leaves_no_temporaries(tmp_path):
    plan_dir = _write(tmp_path / "plan")
    before = {p.name: p.read_bytes() for p in plan_dir.iterdir()}
    with pytest.raises(RuntimeError), outputs.atomic_directory(plan_dir, overwrite=True) as tmp:
        (tmp / schemas.PLAN_FILE).write_bytes(b"half a plan")
        raise RuntimeError("crash in the middle of writing")
    assert {p.name: p.read_bytes() for p in plan_dir.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan"]  # no temporary, no lock file


def test_successful_rewrite_replaces_the_whole_directory(tmp_path):
    plan_dir = _write(tmp_path / "plan")
    (plan_dir / schemas.TOKENIZED_FILE).write_text("what an older plancc wrote")  # a user's file is refused instead
    _write(plan_dir, PlanSettings(micro_batch_size=1, sequence_len=64), overwrite=True)
    assert not (plan_dir / schemas.TOKENIZED_FILE).exists()
    assert json.loads((plan_dir / schemas.MANIFEST_FILE).read_text())["settings"]["micro_batch_size"] == 1


def test_second_writer_of_the_same_directory_is_refused(tmp_path):
    with (
        outputs.atomic_directory(tmp_path / "plan"),
        pytest.raises(atomic.OutputBusy, match="another plancc process"),
        outputs.atomic_directory(tmp_path / "plan"),
    ):
        pass


def test_corrupt_and_foreign_files_are_clear_errors(tmp_path):
    plan_dir = _write(tmp_path / "plan")
    data = (plan_dir / schemas.PLAN_FILE).read_bytes()
    (plan_dir / schemas.PLAN_FILE).write_bytes(data[: len(data) // 2])
    with pytest.raises(schemas.StoreError, match=r"plan\.parquet"):
        PlanFiles(plan_dir).read_epoch(0)
    foreign = tmp_path / "foreign.parquet"
    pq.write_table(pa.table({"x": [1, 2]}), foreign)
    with pytest.raises(schemas.StoreError, match="not written by plancc"):
        parquet.read_file_meta(foreign)
    with pytest.raises(schemas.StoreError, match="missing column 'sample_id'"):
        parquet.read_samples(foreign)


def test_per_rank_read_skips_row_groups(tmp_path):
    """Rows are stored by (epoch, rank): one rank's epoch touches few row groups."""
    settings = PlanSettings(micro_batch_size=1, sequence_len=8, world_size=4, grad_accum=1, balance=False)
    ids, labels = random_dataset(np.random.default_rng(2), 4000, 4)
    table = samples_table(ids, labels)
    s = sample_arrays(table)
    plan_dir = tmp_path / "plan"
    write_plan_dir(plan_dir, table, s, settings, compile_plan(s, settings), ScanRecord(), None)
    stored = pq.read_table(plan_dir / schemas.PLAN_FILE, columns=["rank"]).column("rank")
    assert pc.all(pc.greater_equal(pc.pairwise_diff(stored.combine_chunks())[1:], 0)).as_py()


@pytest.mark.parametrize("writer", [pa.ipc.new_file, pa.ipc.new_stream])
def test_arrow_files_and_streams_read_alike(tmp_path, writer):
    """`.arrow` is either IPC format: the file one (pyarrow's default) or the stream one `datasets` writes."""
    table = pa.table({"input_ids": [[1, 2], [3]], "labels": [[-100, 2], [3]]})
    path = tmp_path / "data.arrow"
    with pa.OSFile(str(path), "wb") as sink, writer(sink, table.schema) as w:
        w.write_table(table)
    assert parquet.read_arrow(path).equals(table)


# ---------------------------------------------------------------- files opened once, refused by type


def _jsonl(path: Path, n: int, word: str) -> Path:
    path.write_text("".join(json.dumps({"prompt": f"{word} {i}: " + "why? " * (i % 5),
                                        "completion": f"{word} " * (1 + i % 7)}) + "\n" for i in range(n)))
    return path


def _compile(source: Path, out: Path, *extra: str) -> None:
    from typer.testing import CliRunner

    from plancc.cli import app

    r = CliRunner().invoke(app, ["compile", str(source), "-o", str(out), "--tokenizer", "builtin", "--sequence-len",
                                 "128", "--epochs", "2", "--cache-dir", str(out.parent / "cache"), "-q", *extra])
    assert r.exit_code == 0, r.output


def _everything(plan, tokens) -> list[tuple[int, list[list[int]], bytes]]:
    """Every microbatch of every epoch with its tokens, as a running job reads them (chunks verified first)."""
    from plancc.runtime import PlanSampler

    sampler, seen = PlanSampler(plan, rank=0, world_size=1), []
    for epoch in plan.epochs:
        sampler.set_epoch(epoch)
        for mb in sampler:
            rows = np.asarray([i for i in mb], dtype=np.int64)
            tokens.check(rows)
            seen.append((epoch, list(mb), b"".join(tokens.input_ids[tokens.offsets[r]:tokens.offsets[r + 1]].tobytes()
                                                    for r in rows)))
    return seen


def test_a_plan_recompiled_under_an_open_run_changes_nothing_for_it(tmp_path):
    """`compile --overwrite` replaces the directory by rename while a job holds the plan: the job keeps reading the
    plan and tokens it opened (no error, the old data); a process opening afterwards gets the new plan, whole."""
    from plancc.runtime import load_tokens, verified_plan

    plan_dir = tmp_path / "plan"
    _compile(_jsonl(tmp_path / "a.jsonl", 60, "alpha"), plan_dir)
    job = verified_plan(plan_dir)
    tokens = load_tokens(job)
    before = [(e, ids) for e, ids, _ in _everything(job, tokens)]
    old_tokens = np.array(tokens.input_ids)
    _compile(_jsonl(tmp_path / "b.jsonl", 90, "beta gamma"), plan_dir, "--overwrite")
    again = _everything(job, tokens)  # every epoch re-read and re-verified, every chunk hashed through held files
    assert [(e, ids) for e, ids, _ in again] == before
    assert np.array_equal(np.array(tokens.input_ids), old_tokens)
    assert load_tokens(job, verify="hash") is not None  # the held store still proves against the held plan
    fresh = verified_plan(plan_dir)
    assert fresh.fingerprints != job.fingerprints and fresh.manifest.samples == 90
    assert len(load_tokens(fresh)) == 90


@pytest.mark.parametrize("name", [schemas.PLAN_FILE, schemas.SAMPLES_FILE, schemas.MANIFEST_FILE,
                                  f"{schemas.TOKENS_DIR}/{token_store.HEADER_FILE}"])
@pytest.mark.slow
@pytest.mark.parametrize("kind", ["fifo", "device", "directory"])
def test_a_file_that_is_not_a_regular_file_is_refused_by_type_without_reading(tmp_path, name, kind):
    import os
    import subprocess
    import sys

    from plancc.runtime import PlanMismatchError, load_tokens, verified_plan

    plan_dir = tmp_path / "plan"
    _compile(_jsonl(tmp_path / "a.jsonl", 30, "alpha"), plan_dir)
    target = plan_dir / name
    target.unlink()
    {"fifo": os.mkfifo, "device": lambda p: os.symlink("/dev/zero", p), "directory": os.mkdir}[kind](target)
    shown = {"fifo": "a FIFO", "device": "a character device", "directory": "a directory"}[kind]
    r = subprocess.run([sys.executable, "-m", "plancc", "validate", str(plan_dir)], capture_output=True, text=True,
                       timeout=120)
    lines = (r.stdout + r.stderr).strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and f"{target} is {shown}" in lines[0], r.stdout + r.stderr
    with pytest.raises(PlanMismatchError, match=f"{re.escape(str(target))} is {shown}"):
        load_tokens(verified_plan(plan_dir))

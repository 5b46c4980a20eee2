"""The manifest is typed at the store boundary: one reader (`Manifest.from_json`), one writer (`to_json`), each
fact once; a manifest of an earlier plancc (which copied the scan's counts, tokenizer, template and warnings to
the top level) still reads; a malformed one is one line naming the key."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
from pathlib import Path

import orjson
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

import plancc
from benchmarks.synthetic import build_plan
from plancc.cli import app
from plancc.errors import InputError, PlanMismatchError
from plancc.runtime import verified_plan
from plancc.store.manifest import LEGACY_KEYS, Manifest, ManifestError
from plancc.store.plan_store import PlanIntegrityError
from plancc.store.samples_source import open_samples, samples_kind
from plancc.store.schemas import MANIFEST_FILE, META_KEY, PLAN_FILE, SAMPLES_FILE
from tests.support.sources import write_rows

runner = CliRunner()


@pytest.fixture(scope="module")
def plan_dir(tmp_path_factory) -> Path:
    return build_plan(tmp_path_factory.mktemp("m"), n=40, mode="packed", micro_batch_size=2, sequence_len=32,
                      epochs=2, world_size=2, val_set_size=4)


def _meta(plan_dir: Path) -> dict:
    return orjson.loads(pq.read_metadata(plan_dir / PLAN_FILE).metadata[META_KEY])


def _rewrite_meta(plan_dir: Path, change) -> None:
    """plan.parquet and its mirror with `change(meta)` applied to the metadata (what an edit or an older writer
    leaves): the rows are kept."""
    path = plan_dir / PLAN_FILE
    table = pq.read_table(path)
    meta = _meta(plan_dir)
    change(meta)
    raw = orjson.dumps(meta, option=orjson.OPT_SORT_KEYS)
    pq.write_table(table.replace_schema_metadata({META_KEY: raw}), path)
    (plan_dir / MANIFEST_FILE).write_text(json.dumps({k: v for k, v in meta.items() if k != "kind"}))


def test_the_writer_writes_what_the_reader_reads(plan_dir):
    manifest = plancc.open_plan(plan_dir).manifest
    on_disk = {k: v for k, v in _meta(plan_dir).items() if k != "kind"}
    assert manifest.to_json() == on_disk == json.loads((plan_dir / MANIFEST_FILE).read_text())
    built = dataclasses.replace(manifest, _json=None)  # what a compile builds: the same JSON from the fields alone
    assert built.to_json() == on_disk
    assert Manifest.from_json(built.to_json(), "again").to_json() == on_disk


def test_each_fact_is_held_once(plan_dir):
    manifest = plancc.open_plan(plan_dir).manifest
    assert not set(LEGACY_KEYS) & set(manifest.to_json())
    assert manifest.eval is not None and manifest.eval.samples == 4 and manifest.samples == 40
    assert [e.epoch for e in manifest.epochs] == [0, 1] and manifest.settings.val_set_size == 4
    assert manifest.warnings == manifest.scan.warnings and manifest.rows_read == manifest.samples  # a bare table


def test_a_manifest_with_the_older_top_level_copies_still_reads(plan_dir, tmp_path):
    older = Path(shutil.copytree(plan_dir, tmp_path / "p"))
    _rewrite_meta(older, lambda m: m.update(rows_read=40, dropped_samples=0, truncated_samples=0, tokenizer=None,
                                             chat_template=None, warnings=[]))
    plan = verified_plan(older)
    assert plan.manifest.dropped_samples == 0 and plan.epoch(1, rank=1).total_batches
    assert plancc.api.validate(older).ok


@pytest.mark.parametrize(("change", "named"), [
    (lambda m: m["epochs"][0].pop("batches"), "epochs[0] is"),
    (lambda m: m.update(eval={"samples": "4"}), "eval is"),
    (lambda m: m.update(samples=True), "samples is True"),
    (lambda m: m["scan"].update(rows_read="many"), "'rows_read'"),
    (lambda m: m.pop("checksums"), "lacks ['checksums']"),
])
def test_a_malformed_manifest_is_one_line_naming_the_key(plan_dir, tmp_path, change, named):
    bad = Path(shutil.copytree(plan_dir, tmp_path / "p"))
    _rewrite_meta(bad, change)
    with pytest.raises(PlanIntegrityError, match=re.escape(named)):
        plancc.open_plan(bad)
    with pytest.raises(PlanMismatchError, match=re.escape(named)):
        verified_plan(bad)
    res = runner.invoke(app, ["validate", str(bad)])
    assert res.exit_code == 1 and named in res.output and "Traceback" not in res.output, res.output
    with pytest.raises(ManifestError):
        Manifest.from_json({k: v for k, v in _meta(bad).items() if k != "kind"}, "x")


def test_open_samples_says_what_a_path_holds(plan_dir, tmp_path):
    stored = open_samples(plan_dir)
    assert stored.kind == "plan" == samples_kind(plan_dir) and stored.plan is not None
    assert stored.table.num_rows == 40 and stored.tokens == plan_dir / "tokens"
    assert samples_kind(plan_dir / SAMPLES_FILE) == "table" and open_samples(plan_dir / SAMPLES_FILE).kind == "table"
    assert samples_kind(tmp_path) is None and open_samples(tmp_path) is None
    assert samples_kind(write_rows(tmp_path / "r.jsonl", [{"text": "a"}])) is None


def test_a_plan_source_is_checked_through_its_plan_file_not_its_mirror(plan_dir, tmp_path):
    """A plan directory compiled again is read through `Plan`: its samples against the plan file's fingerprints.
    `manifest.json` (the mirror) rewritten to match edited rows changes nothing."""
    edited = Path(shutil.copytree(plan_dir, tmp_path / "p"))
    table = pq.read_table(edited / SAMPLES_FILE)
    counts = table.column("label_count").to_pylist()
    counts[0] -= 1
    pq.write_table(table.set_column(table.schema.get_field_index("label_count"), "label_count",
                                    __import__("pyarrow").array(counts, table.schema.field("label_count").type))
                   .replace_schema_metadata(table.schema.metadata), edited / SAMPLES_FILE)
    with pytest.raises(InputError, match="do not hash to the plan's metadata fingerprint"):
        open_samples(edited)

"""`plancc inspect metrics|plan`: tables, JSON, filters, truncation, the before/after plot and bad input."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from typer.testing import CliRunner

from plancc.build.run import write_plan_dir
from plancc.cli import app
from plancc.cli.tables import format_ids
from plancc.config.settings import PlanSettings
from plancc.planner.pipeline import compile_plan
from plancc.review.inspect import before_counts, plan_view
from plancc.store import parquet, schemas
from plancc.store.parquet import sample_arrays
from plancc.store.scan_record import ScanRecord

runner = CliRunner()


def samples(n: int = 500, seed: int = 1) -> pa.Table:
    rng = np.random.default_rng(seed)
    length = rng.integers(16, 300, n)
    return pa.table({
        "sample_id": pa.array(np.arange(n) * 3 + 10, pa.int64()),
        "length": pa.array(length, pa.int32()),
        "label_count": pa.array((length * rng.uniform(0.1, 0.9, n)).astype(np.int64) + 1, pa.int32()),
        "first_label_supervised": pa.array(rng.random(n) < 0.2),
        "token_hash": pa.array(rng.integers(0, 2**63, n).astype(np.uint64)),
    })


def make_plan(path: Path, **overrides) -> Path:
    table = samples()
    settings = PlanSettings(**{"sequence_len": 400, "world_size": 2, "grad_accum": 3, "epochs": 2, **overrides})
    s = sample_arrays(table)
    write_plan_dir(path, table, s, settings, compile_plan(s, settings), ScanRecord(), None)
    return path


@pytest.fixture(scope="module")
def plan(tmp_path_factory) -> Path:
    return make_plan(tmp_path_factory.mktemp("inspect") / "plan")


def cli(*args):
    r = runner.invoke(app, [str(a) for a in args])
    assert "Traceback" not in r.output, r.output
    return r


# ---------------------------------------------------------------- metrics


def test_metrics_table(plan):
    r = cli("inspect", "metrics", plan)
    assert r.exit_code == 0, r.output
    for word in ("epoch 0", "epoch 1", "before", "after", "label_cv", "update_label_cv", "packing_efficiency"):
        assert word in r.stdout


def test_metrics_json_matches_the_table_on_disk(plan):
    r = cli("inspect", "metrics", plan, "--json")
    rows = json.loads(r.stdout)["metrics"]
    stored = parquet.read_table(plan / schemas.METRICS_FILE, schemas.metrics_schema()).to_pylist()
    assert len(rows) == len(stored)
    assert [(x["epoch"], x["stage"]) for x in rows] == [(x["epoch"], x["stage"]) for x in stored]
    assert rows[0]["stage"] == "before" and rows[-1]["stage"] == "after"
    assert all(0 <= x["padding_ratio"] <= 1 for x in rows)
    one = json.loads(cli("inspect", "metrics", plan, "--json", "--epoch", "1").stdout)["metrics"]
    assert {x["epoch"] for x in one} == {1}


def test_before_counts_match_stored_before_metrics(plan):
    stored = {(x["epoch"], x["stage"]): x for x in
              parquet.read_table(plan / schemas.METRICS_FILE, schemas.metrics_schema()).to_pylist()}
    for epoch in (0, 1):
        ba = before_counts(plan, epoch)
        assert ba.before is not None and "as compiled" in ba.note
        before, after = stored[(epoch, "before")], stored[(epoch, "after")]
        assert ba.before.label_counts.size == before["batches"]
        assert int(ba.before.label_counts.sum()) == before["total_label_count"]
        assert np.isclose(ba.before.label_counts.std(), before["std_label_count"])
        assert ba.before.update_totals.size == before["complete_updates"]
        assert ba.after.label_counts.size == after["batches"]
        assert np.isclose(ba.after.update_totals.std(), after["std_global_update_labels"])


def test_before_counts_of_a_plan_without_a_complete_update(tmp_path):
    """An epoch shorter than one update (warned as degenerate, still a plan) has no update totals, not a crash."""
    small = make_plan(tmp_path / "small", world_size=8, grad_accum=64, epochs=1)
    ba = before_counts(small, 0)
    assert ba.after.label_counts.size > 0 and ba.after.update_totals.size == 0
    assert ba.before is not None and ba.before.update_totals.size == 0


def test_plot_is_written_and_not_blank(plan, tmp_path):
    import matplotlib.image

    out = tmp_path / "sub" / "metrics.png"
    r = cli("inspect", "metrics", plan, "--plot", out)
    assert r.exit_code == 0, r.output
    assert out.exists() and out.stat().st_size > 5_000
    img = matplotlib.image.imread(out)
    assert img.ndim == 3 and img.shape[0] > 300 and img.shape[1] > 600
    assert float(img[..., :3].std()) > 0.01
    assert not list(out.parent.glob(".*tmp*"))


def test_plot_json_and_one_epoch(plan, tmp_path):
    out = tmp_path / "e1.png"
    r = cli("inspect", "metrics", plan, "--epoch", "1", "--plot", out, "--json")
    result = json.loads(r.stdout)
    assert result["plot"]["file"] == str(out) and len(result["plot"]["notes"]) == 1
    assert out.stat().st_size > 5_000


def test_plot_refuses_other_suffix(plan, tmp_path):
    r = cli("inspect", "metrics", plan, "--plot", tmp_path / "x.jpg")
    assert r.exit_code == 2 and "png" in r.output


# ---------------------------------------------------------------- plan layout


def test_plan_view_all_of_one_epoch_covers_every_sample_once(plan):
    view = plan_view(plan, epoch=0, limit=0)
    assert view.matching == len(view.rows) > 0
    ids = [i for r in view.rows for row in r["sample_ids"] for i in row]
    assert sorted(ids) == sorted(samples().column("sample_id").to_pylist())
    assert [r["index"] for r in view.rows] == list(range(view.matching))
    assert view.tokens == sum(r["tokens"] for r in view.rows)
    assert all(r["samples"] == sum(len(x) for x in r["sample_ids"]) for r in view.rows)


def test_plan_view_filters_and_global_order(plan):
    view = plan_view(plan, epoch=1, rank=1, limit=0)
    assert all(r["epoch"] == 1 and r["rank"] == 1 for r in view.rows)
    assert [r["index"] for r in view.rows] == sorted(r["index"] for r in view.rows)
    upd = plan_view(plan, epoch=0, update=2, limit=0)
    assert len(upd.rows) == 6  # world_size 2 x grad_accum 3
    assert [(r["micro_step"], r["rank"]) for r in upd.rows] == [(m, k) for m in range(3) for k in range(2)]
    assert len({r["num_items"] for r in upd.rows}) == 1
    assert upd.rows[0]["num_items"] == sum(r["label_count"] for r in upd.rows)


def test_plan_view_limit_decodes_the_right_rows(plan):
    full = plan_view(plan, rank=0, limit=0)
    part = plan_view(plan, rank=0, limit=7)
    assert part.matching == full.matching and len(part.rows) == 7
    assert part.rows == full.rows[:7]
    assert part.tokens == full.tokens


def test_plan_cli_table_json_and_truncation(plan):
    r = cli("inspect", "plan", plan, "--epoch", "0", "--rank", "1", "--limit", "3")
    assert r.exit_code == 0, r.output
    assert "showing 3" in r.stdout and "more (narrow" in r.stdout and "sample ids" in r.stdout
    data = json.loads(cli("inspect", "plan", plan, "--update", "0", "--json").stdout)
    assert data["matching_microbatches"] == 12 and data["shown"] == 12  # 2 epochs x 6
    assert {m["epoch"] for m in data["microbatches"]} == {0, 1}


def test_format_ids():
    assert format_ids([[1, 2], [3]], 0) == "1,2 | 3"
    assert format_ids([[1, 2], [3]], 2) == "1,2 …"
    assert format_ids([[1, 2, 3]], 2) == "1,2 …"
    assert format_ids([[1, 2], [3]], 3) == "1,2 | 3"


# ---------------------------------------------------------------- bad input


def test_bad_inputs_exit_2(plan, tmp_path):
    cases = [
        (("inspect", "metrics", tmp_path / "missing"), "does not exist"),
        (("inspect", "plan", tmp_path), "not a plan directory"),
        (("inspect", "metrics", plan, "--epoch", "9"), "no such epoch"),
        (("inspect", "plan", plan, "--rank", "2"), "2 ranks (world size) (0..1)"),
        (("inspect", "plan", plan, "--epoch", "5"), "--epoch 5"),
        (("inspect", "plan", plan, "--limit", "-1"), "--limit"),
    ]
    for args, message in cases:
        r = cli(*args)
        assert r.exit_code == 2, (args, r.output)
        assert message in r.output, (args, r.output)
    (tmp_path / "plan.parquet").write_bytes(b"garbage")
    r = cli("inspect", "metrics", tmp_path)
    assert r.exit_code == 2 and "not a readable Parquet file" in r.output


@pytest.mark.parametrize("args", [("inspect",), ("inspect", "metrics"), ("inspect", "plan")])
def test_help_has_example(args):
    r = cli(*args, "--help")
    assert r.exit_code == 0 and "Example" in r.output


def test_a_plan_without_a_stored_before_stage_shows_after_only(plan, tmp_path):
    """Plans of plancc versions before `before.parquet` existed: inspect never recomputes compile, it says so."""
    import shutil

    import pyarrow.parquet as pq

    old = Path(shutil.copytree(plan, tmp_path / "old"))
    (old / schemas.BEFORE_FILE).unlink()
    table = pq.read_table(old / schemas.PLAN_FILE)
    meta = json.loads(table.schema.metadata[schemas.META_KEY])
    del meta["checksums"]["before"]
    pq.write_table(table.replace_schema_metadata({schemas.META_KEY: json.dumps(meta).encode()}), old / schemas.PLAN_FILE)
    ba = before_counts(old, 0)
    assert ba.before is None and "not stored" in ba.note
    assert ba.after.label_counts.size == before_counts(plan, 0).after.label_counts.size

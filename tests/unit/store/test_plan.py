"""One plan type: the API, the runtime and the review commands hand around the same `plancc.Plan`, whose `epochs`
is the sorted list of epoch numbers and whose `settings` are the typed `PlanSettings` wherever it is read."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import plancc
from benchmarks.synthetic import build_plan
from plancc.config.settings import PlanSettings
from plancc.errors import PlanMismatchError
from plancc.review import diff, inspect, validate
from plancc.runtime import PlanCollator, PlanEvalSampler, PlanSampler, load_tokens, verified_plan
from tests.support import REPO

ROOT = REPO / "plancc"


@pytest.fixture(scope="module")
def plan_dir(tmp_path_factory) -> Path:
    return build_plan(tmp_path_factory.mktemp("plan"), n=40, mode="packed", micro_batch_size=2, sequence_len=32,
                      epochs=3, world_size=2, val_set_size=4)


def _is_epoch_list(epochs) -> bool:
    return type(epochs) is list and all(type(e) is int for e in epochs) and epochs == sorted(set(epochs))


def test_the_api_and_the_runtime_hand_out_the_same_type(plan_dir):
    opened = plancc.open_plan(plan_dir)
    assert type(opened) is plancc.Plan and type(verified_plan(plan_dir)) is plancc.Plan
    sampler = PlanSampler(opened, rank=0, world_size=2)
    assert sampler.plan is opened  # verified in place, not wrapped in another type
    assert PlanEvalSampler(opened, rank=0, world_size=1).plan is opened
    assert verified_plan(opened) is opened and PlanCollator.from_plan(opened).shift == opened.settings.shift
    assert len(load_tokens(opened)) == opened.manifest.samples
    for plan in (opened, sampler.plan, verified_plan(plan_dir)):
        assert plan.epochs == [0, 1, 2] and _is_epoch_list(plan.epochs)
        assert isinstance(plan.settings, PlanSettings)


def test_the_review_commands_read_through_the_plan(plan_dir):
    opened = plancc.open_plan(plan_dir)
    assert inspect.as_plan(opened) is opened and inspect.read_metrics(opened) == opened.metrics()
    assert diff.metrics_by_stage(opened)[(2, "after")] == opened.metrics(2)[-1]
    report = diff.diff_plans(plan_dir, plan_dir)
    assert report["identical"] and [c["epoch"] for c in report["churn"]] == opened.epochs
    problems, has_eval = validate.validate_plan(str(plan_dir))
    assert problems == [] and has_eval == opened.manifest.has_eval
    assert opened.files.row_count() == sum(opened.epoch(e).total_batches for e in opened.epochs)


def test_an_epoch_outside_the_plan_is_named_with_the_epoch_list_everywhere(plan_dir):
    opened = plancc.open_plan(plan_dir)
    sampler = PlanSampler(opened, rank=0, world_size=2)
    for call in (lambda: opened.epoch(3), lambda: opened.epoch(-1, rank=0), lambda: sampler.set_epoch(3)):
        with pytest.raises(PlanMismatchError, match=r"the plan has epochs \[0, 1, 2\]"):
            call()
    with pytest.raises(plancc.errors.PlanccError, match=r"--epoch 3: the plan has epochs \[0, 1, 2\]"):
        inspect.before_counts(opened, 3)


def _calls(name: str) -> list[str]:
    """`module:line` of every call of `name` (a bare name or an attribute) in plancc/."""
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call):
                f = node.func
                if (f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None) == name:
                    found.append(f"{path.relative_to(ROOT.parent)}:{node.lineno}")
    return found


def _manifest_readers() -> list[str]:
    """Where a module outside the store names the manifest file (`MANIFEST_FILE` or the literal file name)."""
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        if "store" in path.relative_to(ROOT).parts:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            named = (isinstance(node, ast.Name) and node.id == "MANIFEST_FILE") or (
                isinstance(node, ast.Attribute) and node.attr == "MANIFEST_FILE") or (
                isinstance(node, ast.Constant) and node.value == "manifest.json")
            if named:
                found.append(f"{path.relative_to(ROOT.parent)}:{node.lineno}")
    return found


def test_only_the_plan_opens_the_reader_core_and_no_reader_reads_the_manifest_around_it():
    """`PlanFiles` is the core `Plan` is built on: only `Plan` constructs one (a second reader would read
    settings and epochs its own way; review reaches it as `plan.files`), one module reads and writes the manifest
    (`Manifest.from_json` / `to_json`), and nothing outside the store names `manifest.json` (the plan file is the
    root; the manifest is only its mirror)."""
    assert [c.split(":")[0] for c in _calls("PlanFiles")] == ["plancc/store/plan.py"]
    readers = sorted(str(path.relative_to(ROOT.parent)) for path in ROOT.rglob("*.py")
                     if "Manifest.from_json(" in path.read_text(encoding="utf-8") and path.name != "manifest.py")
    assert readers == ["plancc/store/plan_store.py"]
    assert _manifest_readers() == []


# ---------------------------------------------------------------- the public surface, and reads that verify

PUBLIC = {"path", "manifest", "settings", "fingerprints", "epochs", "scan_record", "warnings", "epoch", "eval",
          "samples_table", "metrics", "tokens", "verify", "files"}


def test_the_plan_has_a_dozen_public_members_and_the_old_names_warn(plan_dir):
    opened = plancc.open_plan(plan_dir)
    members = {n for n in dir(opened) if not n.startswith("_")}
    assert members == PUBLIC
    with pytest.warns(DeprecationWarning, match="scan_record"):
        assert opened.scan == opened.scan_record.to_json()
    with pytest.warns(DeprecationWarning, match="plan.manifest"):
        assert opened.meta["samples"] == opened.manifest.samples
    with pytest.warns(DeprecationWarning, match="attributes"):
        assert opened.manifest["samples"] == opened.manifest.samples == 40
    with pytest.warns(DeprecationWarning, match="plan.files.read_epoch"):
        assert opened.read_epoch(0).num_rows == opened.epoch(0).total_batches
    with pytest.raises(AttributeError):
        opened.no_such_member  # noqa: B018


def _rewrite_plan(plan_dir: Path, edit) -> None:
    """plan.parquet with `edit(rows)` applied and its metadata kept: what a hand edit of the rows leaves."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from plancc.store.schemas import PLAN_FILE, PLAN_SCHEMA

    path = plan_dir / PLAN_FILE
    table = pq.read_table(path)
    rows = table.to_pylist()
    edit(rows)
    pq.write_table(pa.Table.from_pylist(rows, schema=PLAN_SCHEMA.with_metadata(table.schema.metadata)), path)


def test_plan_epoch_verifies_what_it_returns(plan_dir, tmp_path):
    """`plan.epoch` (the read the API docstring shows) refuses an epoch whose rows were edited, as the runtime
    does; an unverified filtered read returned them (and still would, through `plan.files`)."""
    import shutil

    edited = Path(shutil.copytree(plan_dir, tmp_path / "p"))
    last = plancc.open_plan(edited).epochs[-1]

    def swap(rows):  # two microbatches of the last epoch exchange their samples: the layout still holds
        mine = [r for r in rows if r["epoch"] == last and r["rank"] == 0]
        mine[0]["sample_ids"], mine[1]["sample_ids"] = mine[1]["sample_ids"], mine[0]["sample_ids"]

    _rewrite_plan(edited, swap)
    opened = plancc.open_plan(edited)
    assert opened.epoch(0).total_batches  # the other epochs still read
    with pytest.raises(PlanMismatchError, match=rf"epoch {last}: .*do not hash to the epoch's plan fingerprint"):
        opened.epoch(last, rank=0)
    with pytest.raises(PlanMismatchError, match="plan fingerprint"):
        verified_plan(edited)
    assert opened.files.read_epoch(last).num_rows  # the raw read underneath does not judge


def test_an_elastic_read_names_the_replay_layout(plan_dir):
    opened = plancc.open_plan(plan_dir)
    full = opened.epoch(1)
    one = opened.epoch(1, 0, world_size=1, grad_accum=opened.settings.world_size * opened.settings.grad_accum)
    assert one.index.tolist() == full.index.tolist() and (one.rank == 0).all()
    assert one.update.tolist() == full.update.tolist()  # W'G' = WG: the same updates
    with pytest.raises(PlanMismatchError, match="grad_accum"):
        opened.epoch(1, 0, world_size=3)

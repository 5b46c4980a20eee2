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

ROOT = Path(__file__).resolve().parents[1] / "plancc"


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
    assert len(load_tokens(opened)) == opened.meta["samples"]
    for plan in (opened, sampler.plan, verified_plan(plan_dir)):
        assert plan.epochs == [0, 1, 2] and _is_epoch_list(plan.epochs)
        assert isinstance(plan.settings, PlanSettings)


def test_the_review_commands_read_through_the_plan(plan_dir):
    opened = plancc.open_plan(plan_dir)
    assert inspect.as_plan(opened) is opened and inspect.read_metrics(opened) == opened.metrics()
    assert diff.metrics_by_stage(opened)[(2, "after")] == opened.metrics(2)[-1]
    report = diff.diff_plans(plan_dir, plan_dir)
    assert report["identical"] and [c["epoch"] for c in report["churn"]] == opened.epochs
    problems, meta = validate.validate_plan(str(plan_dir))
    assert problems == [] and meta == opened.meta
    assert opened.row_count() == sum(opened.total_batches(e) for e in opened.epochs)


def test_an_epoch_outside_the_plan_is_named_with_the_epoch_list_everywhere(plan_dir):
    opened = plancc.open_plan(plan_dir)
    sampler = PlanSampler(opened, rank=0, world_size=2)
    for call in (lambda: opened.epoch(3), lambda: opened.check_epoch(-1), lambda: sampler.set_epoch(3)):
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
    """`PlanDir` is the core `Plan` is built on: nothing constructs one (a second reader would read settings
    and epochs its own way), and nothing outside the store names `manifest.json` (the plan file is the root; the
    manifest is only its mirror)."""
    assert _calls("PlanDir") == []  # `Plan` is built on it by inheritance
    assert _manifest_readers() == []
    assert not _calls("_check_epoch")

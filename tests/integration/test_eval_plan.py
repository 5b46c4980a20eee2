"""The eval plan (`--val-set-size`): a seeded held-out draw that training never sees, planned once in the training
layout and split over the ranks so each eval sample is seen exactly once; its file is bound by its own fingerprint,
and validate, inspect, diff and the runtime read it."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import jsonschema
import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from plancc.build.run import write_plan_dir
from plancc.cli import app
from plancc.config.fields import Record, setting_of
from plancc.config.settings import PlanSettings
from plancc.errors import SettingsError
from plancc.planner.evaluation import eval_columns
from plancc.planner.holdout import hold_out
from plancc.planner.pipeline import compile_plan, compile_run
from plancc.review.validate import validate_plan
from plancc.runtime import PlanEvalSampler, PlanMismatchError, verified_plan
from plancc.store import parquet, schemas
from plancc.store.plan import Plan
from plancc.store.plan_store import PlanFiles
from plancc.store.scan_record import ScanRecord
from tests.support import REPO
from tests.support.plans import random_dataset, samples_table, swap_eval_for_training
from tests.unit.store.test_store import _actual, _described

runner = CliRunner()
ROOT = REPO
SCHEMAS = ROOT / "schemas"
SIZES = st.one_of(st.floats(0.02, 0.6), st.integers(1, 30))


def _samples(seed: int, n: int):
    ids, labels = random_dataset(np.random.default_rng(seed), n, 40)
    table = samples_table(ids, labels)
    return table, parquet.sample_arrays(table)


def _write(path: Path, seed: int = 1, n: int = 120, **kw) -> Path:
    table, s = _samples(seed, n)
    ps = PlanSettings(sequence_len=64, world_size=2, grad_accum=2, epochs=2, **kw)
    run = compile_run(s, ps)
    write_plan_dir(path, table, run.train, ps, run.epochs, ScanRecord(), None, evaluation=run.evaluation)
    return path


# ---------------------------------------------------------------- the held-out draw


@settings(max_examples=60, deadline=None)
@given(n=st.integers(2, 300), size=SIZES, seed=st.integers(0, 2**63 - 1), shuffle=st.integers(0, 2**32 - 1))
def test_hold_out_draws_the_asked_count_of_distinct_ids_whatever_their_order(n, size, seed, shuffle):
    ids = np.random.default_rng(shuffle).choice(10 * n, n, replace=False).astype(np.int64)
    want = size if isinstance(size, int) else round(size * n)
    if not 1 <= want < n:
        with pytest.raises(SettingsError, match="--val-set-size"):
            hold_out(ids, size, seed)
        return
    held = hold_out(ids, size, seed)
    assert held.shape[0] == want and np.unique(held).shape[0] == want and np.isin(held, ids).all()
    np.testing.assert_array_equal(hold_out(np.random.default_rng(shuffle + 1).permutation(ids), size, seed), held)
    if want + 1 < n:  # a larger size only adds samples
        assert np.isin(held, hold_out(ids, want + 1, seed)).all()


@settings(max_examples=40, deadline=None)
@given(sizes=st.lists(st.integers(1, 80), min_size=1, max_size=4), size=st.floats(0.05, 0.5),
       seed=st.integers(0, 1000))
def test_hold_out_is_proportional_per_dataset(sizes, size, seed):
    labels = np.repeat(np.arange(len(sizes)), sizes)
    ids = np.arange(labels.shape[0], dtype=np.int64)
    k = round(size * ids.shape[0])
    if not 1 <= k < ids.shape[0]:
        return
    held = hold_out(ids, size, seed, labels)
    per = np.bincount(labels[held], minlength=len(sizes))
    assert per.sum() == k
    assert (np.abs(per - np.asarray(sizes) * k / ids.shape[0]) < 1).all()


def test_val_set_size_setting_is_a_fraction_or_a_count():
    assert PlanSettings(val_set_size=200.0).val_set_size == 200
    assert isinstance(PlanSettings(val_set_size=200.0).val_set_size, int)
    assert PlanSettings(val_set_size=0.05).val_set_size == 0.05
    for bad in (-1, 1.5, True, "0.1", float("nan"), float("inf")):
        with pytest.raises(SettingsError, match="--val-set-size must be a fraction in \\(0, 1\\) or a whole count"):
            PlanSettings(val_set_size=bad)
    # unset, it is not in the settings: a plan without an eval plan keeps its bytes and config fingerprint (the
    # golden plans prove it byte for byte)
    documented = json.loads((SCHEMAS / "manifest.schema.json").read_text())["properties"]["settings"]["properties"]
    added = {f.name for f in dataclasses.fields(PlanSettings) if setting_of(f).record == Record.UNLESS_DEFAULT}
    assert set(PlanSettings(val_set_size=0).to_dict()) == set(documented) - added
    assert PlanSettings(val_set_size=3).to_dict()["val_set_size"] == 3


# ---------------------------------------------------------------- the compiled run


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32), size=SIZES, mode=st.sampled_from(["packed", "padded", "flattened"]),
       world=st.integers(1, 4), drop_last=st.booleans())
def test_held_out_samples_are_never_trained_on_and_evaluated_exactly_once(seed, size, mode, world, drop_last):
    _, s = _samples(seed % 7, 90)
    ps = PlanSettings(mode=mode, sequence_len=64, micro_batch_size=2, world_size=world, grad_accum=2, epochs=2,
                      seed=seed, drop_last=drop_last, val_set_size=size)
    try:
        run = compile_run(s, ps)
    except SettingsError as exc:  # --drop-last leaving nothing of a small training set is its own error
        assert "--drop-last" in str(exc)
        return
    held = hold_out(s.sample_id, size, seed)
    cols = eval_columns(run.evaluation, ps)
    np.testing.assert_array_equal(np.sort(cols["sample_ids"]), held)  # each once
    for p in run.epochs:
        trained = run.train.sample_id[p.batches.samples]
        assert not np.isin(trained, held).any()
        if not drop_last:
            np.testing.assert_array_equal(np.sort(trained), np.setdiff1d(s.sample_id, held))
    np.testing.assert_array_equal(cols["rank"], np.arange(cols["index"].shape[0]) % world)
    rows = cols["row_bounds"]
    lengths = s.length[np.searchsorted(s.sample_id, cols["sample_ids"])]
    row_tokens = np.add.reduceat(lengths, rows[:-1]) if lengths.size else lengths
    assert (row_tokens <= ps.row_capacity).all()
    assert int(cols["label_count"].sum()) == int(s.targets(ps.shift)[np.isin(s.sample_id, held)].sum())


def test_training_metrics_count_only_the_training_samples(tmp_path):
    plan = Plan(_write(tmp_path / "p", val_set_size=0.25))
    after = [r for r in plan.metrics() if r["stage"] == "after"]
    assert all(r["samples"] == 90 and r["dropped_samples"] == 0 for r in after)
    assert plan.manifest.samples == 120 and plan.manifest.eval.samples == 30


def test_an_eval_plan_is_bound_by_its_fingerprint_and_documented(tmp_path):
    path = _write(tmp_path / "p", val_set_size=0.25)
    plan = Plan(path)
    assert plan.manifest.has_eval and plan.files.eval_problems(plan.files.read_eval()) == []
    manifest = json.loads((path / schemas.MANIFEST_FILE).read_text())
    jsonschema.validate(manifest, json.loads((SCHEMAS / "manifest.schema.json").read_text()))
    assert _described("eval") == _actual(schemas.EVAL_SCHEMA)  # schemas/eval.arrow.json documents the file
    assert validate_plan(str(path))[0] == []
    res = runner.invoke(app, ["validate", str(path)])
    assert res.exit_code == 0 and "eval plan (held-out set once each, none trained on, none a training sample's " \
                                   "tokens)" in res.output, res.output


def test_too_large_or_too_small_val_set_size_is_one_line_exit_2(tmp_path):
    table, _ = _samples(1, 50)
    source = tmp_path / "samples.parquet"
    pq.write_table(table, source)
    for size, want in (("60", "leaving nothing to train on"), ("0.001", "holds out no sample of the 50")):
        res = runner.invoke(app, ["compile", str(source), "-o", str(tmp_path / "out"), "--val-set-size", size,
                                  "--sequence-len", "64", "--quiet"])
        assert res.exit_code == 2 and want in res.output and "Traceback" not in res.output, res.output
        assert not (tmp_path / "out").exists()


def test_val_set_size_from_a_config_file_and_the_api(tmp_path):
    import plancc

    table, _ = _samples(2, 50)
    source = tmp_path / "samples.parquet"
    pq.write_table(table, source)
    (tmp_path / "c.toml").write_text("val-set-size = 12\nsequence_len = 64\n")
    res = runner.invoke(app, ["compile", str(source), "-o", str(tmp_path / "cli"), "--config",
                              str(tmp_path / "c.toml")])
    assert res.exit_code == 0, res.output
    assert "eval       12 samples held out (--val-set-size 12)" in res.output
    plan = plancc.compile(str(source), tmp_path / "api", sequence_len=64, val_set_size=0.24)
    for path in (tmp_path / "cli", tmp_path / "api"):
        assert Plan(path).manifest.eval.samples == 12
    assert plan.manifest.to_json()["settings"]["val_set_size"] == 0.24
    # eval.parquet is plancc's own: --overwrite replaces a plan holding one (and keeps refusing foreign files)
    again = plancc.compile(str(source), tmp_path / "api", sequence_len=64, val_set_size=12, overwrite=True)
    assert again.manifest.eval.samples == 12


# ---------------------------------------------------------------- validate, runtime, inspect, diff


def _rewrite_eval(path: Path, edit) -> None:
    """Rewrite eval.parquet with `edit(rows)` applied, keeping its plancc metadata (a consistent forgery)."""
    f = path / schemas.EVAL_FILE
    meta = pq.ParquetFile(f).metadata.metadata[schemas.META_KEY]
    rows = parquet.read_table(f, schemas.EVAL_SCHEMA).to_pylist()
    edit(rows)
    cols = {name: [r[name] for r in rows] for name in schemas.EVAL_SCHEMA.names}
    parquet.write_parquet(pa.table(cols, schema=schemas.EVAL_SCHEMA), f, {schemas.META_KEY: meta})


@pytest.fixture(scope="module")
def sound(tmp_path_factory) -> Path:
    return _write(tmp_path_factory.mktemp("sound") / "p", val_set_size=0.25, mode="padded", micro_batch_size=2)


def test_validate_and_the_runtime_refuse_an_eval_sample_exchanged_for_a_training_one(sound, tmp_path):
    plan = shutil.copytree(sound, tmp_path / "p")
    trained = int(Plan(plan).epoch(0).sample_ids[0])

    def swap(rows):
        rows[0]["sample_ids"] = [[trained], *rows[0]["sample_ids"][1:]]

    _rewrite_eval(plan, swap)
    problems, _ = validate_plan(str(plan))
    assert any("do not hash to the plan's eval fingerprint" in p for p in problems), problems
    assert any("the held-out draw" in p and "lacks 1" in p for p in problems), problems
    with pytest.raises(PlanMismatchError, match="eval fingerprint"):
        verified_plan(plan).eval()


def test_validate_reports_a_missing_eval_file_and_held_out_samples_in_training(sound, tmp_path):
    plan = shutil.copytree(sound, tmp_path / "p")
    (plan / schemas.EVAL_FILE).unlink()
    assert any(f"{schemas.EVAL_FILE} does not exist" in p for p in validate_plan(str(plan))[0])
    # an eval plan next to a training plan of every sample (what a planner that forgot to hold out would write)
    table, s = _samples(1, 120)
    ps = PlanSettings(sequence_len=64, world_size=2, grad_accum=2, epochs=2, val_set_size=0.25)
    leaky = tmp_path / "leaky"
    write_plan_dir(leaky, table, s, ps, compile_plan(s, ps), ScanRecord(), None, evaluation=compile_run(s, ps).evaluation)
    problems = validate_plan(str(leaky))[0]
    assert any("30 held-out eval samples are in the training plan" in p for p in problems), problems


def test_inspect_metrics_reports_eval_sizes(sound):
    res = runner.invoke(app, ["inspect", "metrics", str(sound), "--json"])
    assert res.exit_code == 0, res.output
    ev = orjson.loads(res.output)["eval"]
    table = PlanFiles(sound).read_eval()
    assert ev["samples"] == 30 and ev["val_set_size"] == 0.25
    assert ev["label_count"] == int(parquet.column(table, "label_count").sum())
    assert ev["tokens"] == int(parquet.column(table, "tokens").sum()) and ev["batches"] == table.num_rows
    text = runner.invoke(app, ["inspect", "metrics", str(sound)]).output
    assert "eval plan" in text and "label_count" in text


def test_diff_reports_eval_plan_changes(sound, tmp_path):
    bigger = _write(tmp_path / "big", val_set_size=40, mode="padded", micro_batch_size=2)
    res = runner.invoke(app, ["diff", str(sound), str(bigger), "--format", "json"])
    report = orjson.loads(res.output)
    jsonschema.validate(report, json.loads((SCHEMAS / "diff.schema.json").read_text()))
    ev = report["eval"]
    assert report["changes"]["eval"] and ev["status"] == "both"
    assert (ev["added_samples"], ev["removed_samples"]) == (10, 0)  # the larger draw holds the smaller one
    assert {"metric": "samples", "old": 30, "new": 40, "delta": 10} in ev["sizes"]
    assert "eval plan: held-out samples +10 -0; samples 30 -> 40" in runner.invoke(app, ["diff", str(sound),
                                                                                        str(bigger)]).output
    none = _write(tmp_path / "none", mode="padded", micro_batch_size=2)
    same = runner.invoke(app, ["diff", str(none), str(none), "--format", "json"])
    assert orjson.loads(same.output)["eval"]["status"] == "none"
    gone = orjson.loads(runner.invoke(app, ["diff", str(sound), str(none), "--format", "json"]).output)["eval"]
    assert gone["status"] == "old_only" and gone["removed_samples"] == 30


def test_settings_other_than_val_set_size_do_not_change_the_held_out_set(tmp_path):
    a = _write(tmp_path / "a", val_set_size=0.25, mode="packed")
    b = _write(tmp_path / "b", val_set_size=0.25, mode="flattened", micro_batch_size=3)
    ids = [np.sort(Plan(p).eval().sample_ids) for p in (a, b)]
    np.testing.assert_array_equal(*ids)


# ---------------------------------------------------------------- recipes: eval datasets and per-dataset hold-out


def _eval_ids(plan_dir: Path) -> np.ndarray:
    """Every sample id of the eval plan, as often as it is in it."""
    return Plan(plan_dir).eval().sample_ids


def _trained(plan_dir: Path, epoch: int) -> np.ndarray:
    return Plan(plan_dir).epoch(epoch).sample_ids


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sizes=st.lists(st.integers(3, 40), min_size=1, max_size=3), evals=st.integers(0, 6),
       size=st.sampled_from([0, 0.2, 0.5, 2]), repeat=st.sampled_from([0.5, 1.0, 2.5]), seed=st.integers(0, 2**31),
       epoch_count=st.integers(1, 3))
def test_a_recipe_evaluates_its_eval_datasets_and_held_out_share_and_trains_on_the_rest_at_exact_counts(
        sizes, evals, size, repeat, seed, epoch_count):
    """(1) an eval dataset's samples and (2) `--val-set-size`'s per-dataset draw are the eval plan, each once, never
    in a training epoch; every training dataset's epoch count is its mixture count over the samples it keeps."""
    from plancc.planner import holdout, mixture

    groups = [*sizes, evals] if evals else sizes
    s = _samples(seed, sum(groups))[1]
    index = np.repeat(np.arange(len(groups)), groups)
    mix = tuple((f"d{i}", "train", "repeat", repeat) for i in range(len(sizes)))
    mix += (("ev", "eval", "repeat", 1.0),) if evals else ()
    if size and size >= 1 and size >= sum(sizes):
        size = 1
    cfg = PlanSettings(sequence_len=64, micro_batch_size=2, world_size=2, epochs=epoch_count, seed=seed,
                       mixture=mix, val_set_size=size)
    run = compile_run(s, cfg, index=index)
    drawn = hold_out(s.sample_id[index < len(sizes)], size, seed, datasets=index[index < len(sizes)]) if size else []
    expected = np.union1d(s.sample_id[index == len(sizes)], drawn)
    if not expected.size:
        assert run.evaluation is None
        return
    ev = run.evaluation
    assert np.array_equal(np.sort(ev.samples.sample_id[ev.batches.samples]), expected)  # each once
    kept = np.bincount(index[~np.isin(s.sample_id, expected)], minlength=len(groups))[:len(sizes)]
    want = mixture.epoch_counts(kept, cfg.mixture[:len(sizes)], None)
    for p in run.epochs:
        ids = p.samples.sample_id[p.batches.samples]
        assert not np.isin(ids, expected).any()
        got = np.bincount(index[np.searchsorted(s.sample_id, ids)], minlength=len(groups))[:len(sizes)]
        assert got.tolist() == want.tolist()
    assert np.array_equal(holdout.eval_ids(s.sample_id, cfg, index), expected)  # what validate redraws


def test_a_draw_that_takes_a_whole_recipe_dataset_is_refused_naming_it():
    s = _samples(3, 41)[1]
    index = np.repeat([0, 1], [40, 1])
    mix = (("big", "train", "repeat", 1.0), ("tiny", "train", "weight", 1.0))
    with pytest.raises(SettingsError, match="holds out every sample of dataset 'tiny'"):
        compile_run(s, PlanSettings(sequence_len=64, mixture=mix, val_set_size=0.9), index=index)


@pytest.fixture(scope="module")
def recipe_eval(tmp_path_factory) -> Path:
    """A compiled recipe: two training datasets (one repeated 2x) with --val-set-size 6, plus an eval dataset."""
    from tests.support.sources import write_rows

    tmp = tmp_path_factory.mktemp("recipe_eval")
    paths = [write_rows(tmp / f"{tag}.jsonl", [{"prompt": f"{tag} q {i}: " + "why? " * (i % 5),
                                                "completion": f"{tag} " * (1 + i % 7)} for i in range(n)])
             for tag, n in (("big", 30), ("small", 12), ("held", 5))]
    config = tmp / "recipe.toml"
    config.write_text(f'tokenizer = "builtin"\nsequence_len = 512\nworld_size = 2\nepochs = 2\nval_set_size = 6\n'
                      f'[[datasets]]\npath = "{paths[0]}"\n[[datasets]]\npath = "{paths[1]}"\nrepeat = 2\n'
                      f'[[eval_datasets]]\npath = "{paths[2]}"\nname = "heldout"\n')
    res = CliRunner().invoke(app, ["compile", "-o", str(tmp / "p"), "--config", str(config), "--cache-dir",
                                   str(tmp / "cache")])
    assert res.exit_code == 0, res.output
    assert "eval       11 samples held out (eval datasets, --val-set-size 6)" in res.output
    return tmp / "p"


def test_a_compiled_recipe_evaluates_its_eval_dataset_and_its_held_out_share_once(recipe_eval):
    from plancc.runtime import PlanEvalSampler

    ev = _eval_ids(recipe_eval)
    samples = parquet.read_samples(recipe_eval / schemas.SAMPLES_FILE)
    dataset_eval = parquet.column(samples, "sample_id")[np.asarray(samples.column("dataset").to_pylist()) == "heldout"]
    assert dataset_eval.tolist() == list(range(42, 47))
    assert np.unique(ev).size == ev.size == 11 and np.isin(dataset_eval, ev).all()
    drawn = np.setdiff1d(ev, dataset_eval)
    assert (drawn < 30).sum() == 4 and ((drawn >= 30) & (drawn < 42)).sum() == 2  # 6 in proportion 30:12
    for e in (0, 1):
        trained = _trained(recipe_eval, e)
        assert not np.isin(trained, ev).any()
        counts = np.bincount(trained, minlength=47)
        kept = np.setdiff1d(np.arange(42), drawn)
        assert set(counts[kept[kept < 30]]) == {1} and set(counts[kept[kept >= 30]]) == {2}  # exact counts
    seen = [i for r in range(2) for mb in PlanEvalSampler(recipe_eval, rank=r, world_size=2) for i in mb]
    assert sorted(seen) == sorted(ev.tolist())
    assert validate_plan(str(recipe_eval))[0] == []
    res = CliRunner().invoke(app, ["inspect", "metrics", str(recipe_eval), "--json"])
    assert res.exit_code == 0 and json.loads(res.output)["eval"]["samples"] == 11


def test_validate_refuses_a_recipe_eval_plan_with_an_eval_dataset_sample_exchanged(recipe_eval, tmp_path):
    plan = shutil.copytree(recipe_eval, tmp_path / "p")
    trained = int(_trained(plan, 0)[0])

    def swap(rows):
        for r in rows:
            r["sample_ids"] = [[trained if i == 46 else i for i in row] for row in r["sample_ids"]]

    _rewrite_eval(plan, swap)
    problems, _ = validate_plan(str(plan))
    assert any("holds 1 samples the eval set" in p and "lacks 1 it does" in p and f"sample_id {trained})" in p
               for p in problems), problems


def test_diff_of_recipes_reports_an_eval_plan_change(recipe_eval, tmp_path):
    tmp = recipe_eval.parent
    res = CliRunner().invoke(app, ["compile", "-o", str(tmp_path / "p8"), "--config", str(tmp / "recipe.toml"),
                                   "--cache-dir", str(tmp / "cache"), "--val-set-size", "8", "--quiet"])
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(app, ["diff", str(recipe_eval), str(tmp_path / "p8"), "--json"])
    report = json.loads(res.output)
    assert report["changes"]["eval"] and report["changes"]["plan"] and not report["identical"]
    sizes = {row["metric"]: (row["old"], row["new"]) for row in report["eval"]["sizes"]}
    assert sizes["samples"] == (11, 13)  # a larger size only adds samples (per dataset: 4+2, then 6+2)
    assert (report["eval"]["added_samples"], report["eval"]["removed_samples"]) == (2, 0)
    assert {d["status"] for d in report["datasets"]} == {"unchanged"}


def test_an_eval_plan_swapped_for_training_rows_and_refingerprinted_is_refused(sound, tmp_path):
    """The eval rows replaced by epoch 0's first training microbatches, the eval fingerprint and summary recomputed
    into every file: the runtime's eval read draws the held-out set again and refuses, naming the first sample that
    is not held out (every other check passes, so nothing else could)."""
    plan = shutil.copytree(sound, tmp_path / "p")
    swap_eval_for_training(plan)
    opened = verified_plan(plan)  # training is unaffected: every training file is as compiled
    assert opened.epoch(0).total_batches
    with pytest.raises(PlanMismatchError, match=r"eval\.parquet: holds \d+ samples the eval set .* does not"):
        opened.eval()
    with pytest.raises(PlanMismatchError, match="the held-out draw"):
        list(PlanEvalSampler(plan, rank=0, world_size=1))
    problems, _ = validate_plan(str(plan))
    assert any("holds" in p and "samples the eval set" in p for p in problems), problems

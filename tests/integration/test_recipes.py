"""Recipes: several datasets with repeats or weights, scanned one by one into one samples table and token store,
planned as an exact per-epoch mixture, and reported, validated, shown and diffed per dataset."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

import plancc
from plancc.cli import app
from plancc.config import recipe
from plancc.config.settings import MixEntry
from plancc.errors import PlanccError, SettingsError
from plancc.planner import mixture
from plancc.review.validate import check_epoch, validate_plan
from plancc.store import parquet, schemas, token_store
from plancc.store.plan import Plan
from plancc.store.plan_store import PlanFiles
from plancc.store.samples import dataset_codes
from tests.support import REPO
from tests.support.sources import alpaca_rows, write_rows

BASE = {"tokenizer": "builtin", "sequence_len": 512, "micro_batch_size": 2, "world_size": 2, "seed": 5}


def _pc(n: int, tag: str) -> list[dict]:
    return [{"prompt": f"{tag} question {i}: " + "why? " * (i % 6), "completion": f"{tag} " * (1 + i % 9)}
            for i in range(n)]


def _data(tmp_path: Path, sizes=(30, 12)) -> list[Path]:
    return [write_rows(tmp_path / f"{tag}.jsonl", _pc(n, tag)) for tag, n in zip(("big", "small"), sizes,
                                                                                    strict=False)]


def _mix(*entries: tuple[str, float]) -> tuple[MixEntry, ...]:
    return tuple(MixEntry(f"d{i}", "train", kind, value) for i, (kind, value) in enumerate(entries))


def _index(sizes: list[int]) -> np.ndarray:
    return np.repeat(np.arange(len(sizes)), sizes)


# ---------------------------------------------------------------- the mixture's counts

kinds = st.tuples(st.sampled_from(["repeat", "weight"]),
                  st.sampled_from([0.25, 0.5, 0.7, 1.0, 1.5, 2.0, 3.0]))


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.integers(1, 40), min_size=1, max_size=4), data=st.data(), seed=st.integers(0, 2**32),
       epoch=st.integers(0, 6))
def test_each_dataset_contributes_its_exact_count_and_no_sample_twice_unless_asked(sizes, data, seed, epoch):
    mix = _mix(*data.draw(st.lists(kinds, min_size=len(sizes), max_size=len(sizes))))
    index = _index(sizes)
    pos = mixture.epoch_positions(index, mix, None, seed, epoch)
    assert np.array_equal(pos, mixture.epoch_positions(index, mix, None, seed, epoch))  # seeded: the same again
    weighted = [i for i, m in enumerate(mix) if m.kind == "weight"]
    total = max([sizes[i] for i in weighted], default=0)
    wsum = sum(mix[i].value for i in weighted)
    assert sum(int(np.sum(index[pos] == i)) for i in weighted) == total  # the weighted share sums exactly
    for d, m in enumerate(mix):
        got = int(np.sum(index[pos] == d))
        target = m.value * sizes[d] if m.kind == "repeat" else m.value / wsum * total
        assert abs(got - target) <= 1 if m.kind == "weight" else got == int(np.floor(target + 0.5))
        per_sample = np.bincount(pos[index[pos] == d] - index.tolist().index(d), minlength=sizes[d])
        assert per_sample.max() - per_sample.min() <= 1  # spread evenly: full passes + a window
        assert per_sample.max() == -(-got // sizes[d])  # never twice unless the count asks for it


@settings(max_examples=40, deadline=None)
@given(n=st.integers(2, 60), k=st.integers(2, 5), seed=st.integers(0, 2**32))
def test_a_fraction_takes_different_parts_each_epoch_and_every_sample_once_over_the_cycle(n, k, seed):
    """repeat 1/k: k epochs together hold every sample exactly once when n is a multiple of k."""
    n = n * k
    mix = _mix(("repeat", 1 / k))
    epochs = [mixture.epoch_positions(np.zeros(n, dtype=np.int64), mix, None, seed, e) for e in range(k)]
    assert all(e.size == n // k and np.unique(e).size == e.size for e in epochs)
    assert np.array_equal(np.sort(np.concatenate(epochs)), np.arange(n))


@settings(max_examples=25, deadline=None)
@given(sizes=st.lists(st.integers(4, 60), min_size=2, max_size=3), data=st.data(), seed=st.integers(0, 2**20),
       mode=st.sampled_from(["packed", "padded", "flattened"]))
def test_packing_and_balancing_keep_every_datasets_count(sizes, data, seed, mode):
    """The mixture is a multiset per epoch; every stage after it (pack, balance) moves samples, never adds or removes
    one: the plan holds each dataset's exact count, each sample its mixture count."""
    from benchmarks.synthetic import sft_mix
    from plancc.config.settings import PlanSettings
    from plancc.planner.pipeline import compile_plan

    mix = _mix(*data.draw(st.lists(kinds, min_size=len(sizes), max_size=len(sizes))))
    index = _index(sizes)
    s = sft_mix(int(index.size), seed=seed, sequence_len=1024)
    settings_ = PlanSettings(mode=mode, micro_batch_size=2, sequence_len=1024, world_size=2, grad_accum=2, seed=seed,
                             epochs=2, mixture=mix)
    for p in compile_plan(s, settings_, index=index):
        drawn = mixture.epoch_positions(index, mix, None, seed, p.epoch)
        assert np.array_equal(np.sort(p.positions[p.batches.samples]), drawn)


@settings(max_examples=30, deadline=None)
@given(n=st.integers(2, 50), fraction=st.sampled_from([0.2, 0.3, 0.5, 0.7, 0.9, 1.3, 2.6]),
       seed=st.integers(0, 2**32), order=st.permutations(range(7)))
def test_an_epochs_draw_does_not_depend_on_which_epochs_were_drawn_before(n, fraction, seed, order):
    """The stream keeps its last permutation to draw epochs in order cheaply; any order gives the same draws."""
    mix = _mix(("repeat", fraction))
    index = np.zeros(n, dtype=np.int64)
    in_order = [mixture.epoch_positions(index, mix, None, seed, e) for e in range(7)]
    for e in order:
        assert np.array_equal(mixture.epoch_positions(index, mix, None, seed, e), in_order[e])


def test_largest_remainder_rounds_to_floor_or_ceiling_and_sums_exactly():
    counts = mixture.largest_remainder(np.array([1 / 3, 1 / 3, 1 / 3]) * 10, 10)
    assert counts.sum() == 10 and sorted(counts.tolist()) == [3, 3, 4]


def test_samples_per_epoch_sizes_the_weighted_datasets_and_eval_datasets_are_never_in_an_epoch():
    mix = (MixEntry("a", "train", "weight", 3.0), MixEntry("b", "train", "weight", 1.0),
           MixEntry("e", "eval", "repeat", 1.0))
    index = _index([10, 50, 7])
    pos = mixture.epoch_positions(index, mix, 100, 0, 0)
    assert np.bincount(index[pos], minlength=3).tolist() == [75, 25, 0]
    assert mixture.eval_positions(index, mix).tolist() == list(range(60, 67))


# ---------------------------------------------------------------- parsing


def test_mix_syntax_names_and_errors():
    assert recipe.parse_mix(["chat=2x,alpaca=0.5X", "code=3"]) == {"chat": ("repeat", 2.0), "alpaca": ("repeat", 0.5),
                                                                   "code": ("weight", 3.0)}
    for bad in ("chat", "chat=x", "chat=-1", "=2x", "chat=0"):
        with pytest.raises(SettingsError, match="NAME=Nx"):
            recipe.parse_mix(bad)
    assert recipe.default_name("data/chat.v2.jsonl.gz") == "chat" and recipe.default_name("scans/alpaca/") == "alpaca"
    with pytest.raises(SettingsError, match=r"'chat' is used twice \(a/chat.jsonl and b/chat.jsonl\)"):
        recipe.build(["a/chat.jsonl", "b/chat.jsonl"])
    with pytest.raises(SettingsError, match=r"no dataset named 'chta'.*did you mean 'chat'"):
        recipe.build(["a/chat.jsonl"], mix={"chta": ("repeat", 2.0)})
    with pytest.raises(SettingsError, match="repeat or weight, not both"):
        recipe.build([{"path": "a.jsonl", "repeat": 2, "weight": 1}])
    with pytest.raises(SettingsError, match=r"unknown key 'wieght'.*did you mean 'weight'"):
        recipe.build([{"path": "a.jsonl", "wieght": 1}])


def test_one_tokenizer_and_sequence_len_for_the_recipe_a_contradiction_names_both_datasets(tmp_path):
    a, b = _data(tmp_path)
    entries = [{"path": str(a), "sequence_len": 512}, {"path": str(b), "sequence_len": 256}]
    with pytest.raises(SettingsError, match="dataset 'small' sets sequence_len 256 but dataset 'big' sets "
                                            "sequence_len 512"):
        plancc.compile(entries, tmp_path / "p", cache_dir=tmp_path / "c", tokenizer="builtin")
    with pytest.raises(SettingsError, match="dataset 'big' sets sequence_len 512 but the recipe's settings 1024"):
        plancc.compile([*entries[:1], str(b)], tmp_path / "p", cache_dir=tmp_path / "c", tokenizer="builtin",
                       sequence_len=1024)
    # scan directories made with different sequence_len: both datasets named
    plancc.api.scan(str(b), tmp_path / "scan", cache_dir=tmp_path / "c", tokenizer="builtin", sequence_len=256)
    plancc.api.scan(str(a), tmp_path / "other", cache_dir=tmp_path / "c", tokenizer="builtin", sequence_len=512)
    with pytest.raises(SettingsError, match="datasets 'other' and 'scan' have sequence_len 512 and 256"):
        plancc.compile([str(tmp_path / "other"), str(tmp_path / "scan")], tmp_path / "p", cache_dir=tmp_path / "c")
    with pytest.raises(SettingsError, match=r"^--sequence-len 512 contradicts dataset 'scan' \("):
        plancc.compile([str(a), str(tmp_path / "scan")], tmp_path / "p", cache_dir=tmp_path / "c",
                       tokenizer="builtin", sequence_len=512)
    assert not (tmp_path / "p").exists()
    # unless given, a raw dataset is scanned with the stored scan's sequence_len
    plan = plancc.compile([str(a), str(tmp_path / "scan")], tmp_path / "p", cache_dir=tmp_path / "c",
                          tokenizer="builtin")
    assert plan.settings.sequence_len == 256 and plan.scan_record.options.sequence_len == 256


# ---------------------------------------------------------------- compile, validate, read


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    """A two-dataset recipe (big once, small twice and a half) plus an eval set, compiled through the API."""
    tmp = tmp_path_factory.mktemp("recipe")
    a, b = _data(tmp)
    ev = write_rows(tmp / "held.jsonl", _pc(5, "held"))
    plan = plancc.compile([str(a), {"path": str(b), "repeat": 2.5}], tmp / "plan", cache_dir=tmp / "cache", epochs=3,
                          **BASE)
    return tmp, plan, (a, b, ev)


def test_a_recipe_compiles_to_one_sample_id_space_and_token_store_and_validates(mixed):
    import jsonschema

    tmp, plan, (a, b, _) = mixed
    assert validate_plan(str(plan.path))[0] == []
    schema = json.loads((REPO / "schemas" / "manifest.schema.json").read_text())
    jsonschema.validate(json.loads((plan.path / schemas.MANIFEST_FILE).read_text()), schema)
    samples = parquet.read_samples(plan.path / schemas.SAMPLES_FILE)
    assert parquet.column(samples, "sample_id").tolist() == list(range(42))
    assert samples.column("dataset").to_pylist() == ["big"] * 30 + ["small"] * 12
    datasets = plan.manifest.recipe["datasets"]
    assert [(d["name"], d["first_id"], d["rows"], d.get("repeat")) for d in datasets] == [
        ("big", 0, 30, 1.0), ("small", 30, 12, 2.5)]
    # each dataset's rows, by sample id, are its own scan's rows (the runtime reads one store, O(1) per sample)
    tokens = token_store.open_store(plan.path / schemas.TOKENS_DIR)
    for d, src in zip(datasets, (a, b), strict=True):
        own = plancc.api.scan(str(src), tmp / f"scan-{d['name']}", cache_dir=tmp / "cache", **{
            k: BASE[k] for k in ("tokenizer", "sequence_len")})
        assert own["fingerprints"] == d["fingerprints"]
        alone = token_store.open_store(tmp / f"scan-{d['name']}" / schemas.TOKENS_DIR)
        for row in (0, d["rows"] - 1):
            i = d["first_id"] + row
            got = tokens.input_ids[int(tokens.offsets[i]):int(tokens.offsets[i + 1])]
            assert np.array_equal(got, alone.input_ids[int(alone.offsets[row]):int(alone.offsets[row + 1])])
    for e in plan.epochs:  # small: 2.5 x 12 = 30 items, each sample 2 or 3 times; big: each once
        ids = np.concatenate([np.concatenate(plan.epoch(e)[i]) for i in range(len(plan.epoch(e)))])
        counts = np.bincount(ids, minlength=42)
        assert counts[:30].tolist() == [1] * 30 and counts[30:].sum() == 30 and set(counts[30:]) == {2, 3}


def test_the_runtime_reads_a_recipe_plan(mixed):
    """The runtime maps the joined store as one (verified at open), and the collator feeds the loss exactly the
    plan's label counts, a sample that is twice in an epoch included."""
    from plancc.runtime import (
        PlanCollator,
        PlanDataLoader,
        PlanDataset,
        PlanSampler,
        load_tokens,
        verified_plan,
    )

    _, plan, _ = mixed
    rt = verified_plan(plan.path)
    tokens = load_tokens(rt, verify="hash")
    samples = parquet.read_samples(plan.path / schemas.SAMPLES_FILE)
    assert np.array_equal(tokens.lengths[parquet.column(samples, "sample_id")], parquet.column(samples, "length"))
    rows = PlanFiles(plan.path).read_epoch(0)
    for rank in range(2):
        loader = PlanDataLoader(PlanDataset(tokens, PlanCollator.from_plan(rt)), PlanSampler(rt, rank=rank,
                                                                                            world_size=2))
        fed = sum(int((batch["shift_labels"] != -100).sum()) for batch in loader)
        assert fed == int(np.sum(parquet.column(rows, "label_count")[parquet.column(rows, "rank") == rank]))


def test_validate_checks_each_sample_against_its_mixture_count(mixed):
    _, plan, _ = mixed
    d = Plan(plan.path)
    samples = d.samples_table()
    s = parquet.sample_arrays(samples)
    codes, names = dataset_codes(samples)
    index = mixture.dataset_index(codes, names, d.settings.mixture)
    table = d.files.read_epoch(1)
    epoch_samples = s.take(mixture.plan_positions(index, d.settings, 1))
    assert check_epoch(1, table, epoch_samples, d.settings)[0] == []
    # against "every sample once" (the one-source invariant) the same rows are wrong
    problems = check_epoch(1, table, s, d.settings)[0]
    assert any("its mixture count is 1" in p for p in problems)
    # against another epoch's mixture draw they are wrong too (a different 0.5 of small)
    other = s.take(mixture.plan_positions(index, d.settings, 0))
    assert any("mixture" in p or "missing" in p for p in check_epoch(1, table, other, d.settings)[0])


def test_per_dataset_metrics_and_inspect_by_dataset(mixed):
    _, plan, _ = mixed
    rows = plan.manifest.recipe["metrics"]
    after0 = {r["dataset"]: r for r in rows if r["epoch"] == 0 and r["stage"] == "after"}
    assert after0["big"]["samples"] == 30 and after0["small"]["samples"] == 30
    assert after0["big"]["sample_share"] == pytest.approx(0.5)
    assert sum(r["label_tokens"] for r in after0.values()) == plan.metrics(0)[-1]["total_label_count"]
    res = CliRunner().invoke(app, ["inspect", "metrics", str(plan.path), "--by", "dataset", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["metrics"] == rows
    text = CliRunner().invoke(app, ["inspect", "metrics", str(plan.path), "--by", "dataset", "--epoch", "2"])
    assert text.exit_code == 0 and "epoch 2 by dataset" in text.output and "small" in text.output


def test_show_names_the_dataset_and_its_row(mixed):
    _, plan, _ = mixed
    res = CliRunner().invoke(app, ["show", str(plan.path), "--sample", "33", "--no-color"])
    assert res.exit_code == 0, res.output
    assert "sample 33 (dataset small, row 3)" in res.output and "small question 3" in res.output


def test_eval_datasets_are_scanned_into_the_samples_table_but_never_trained_on(tmp_path, mixed):
    tmp, _, (a, b, ev) = mixed
    config = tmp_path / "recipe.toml"
    config.write_text(f'tokenizer = "builtin"\nsequence_len = 512\nworld_size = 2\nepochs = 2\n'
                      f'[[datasets]]\npath = "{a}"\n[[datasets]]\npath = "{b}"\nweight = 1\n'
                      f'[[eval_datasets]]\npath = "{ev}"\nname = "heldout"\n')
    res = CliRunner().invoke(app, ["compile", "-o", str(tmp_path / "p"), "--config", str(config), "--cache-dir",
                                   str(tmp / "cache"), "--quiet"])
    assert res.exit_code == 0, res.output
    samples = parquet.read_samples(tmp_path / "p" / schemas.SAMPLES_FILE)
    eval_ids = parquet.column(samples, "sample_id")[np.asarray(samples.column("dataset").to_pylist()) == "heldout"]
    assert eval_ids.tolist() == list(range(42, 47))
    plan = plancc.open_plan(tmp_path / "p")
    for e in plan.epochs:
        ids = {i for k in range(len(plan.epoch(e))) for row in plan.epoch(e)[k] for i in row}
        assert not ids & set(eval_ids.tolist())
    assert [d["role"] for d in plan.manifest.recipe["datasets"]] == ["train", "train", "eval"]
    assert validate_plan(str(tmp_path / "p"))[0] == []


def test_changing_one_dataset_rescans_only_that_one(tmp_path):
    a, b = _data(tmp_path)
    cache = tmp_path / "cache"
    plancc.compile([str(a), str(b)], tmp_path / "p1", cache_dir=cache, **BASE)
    scans = {p.name: p.stat().st_mtime_ns for p in (cache / "scans").iterdir()}
    write_rows(b, _pc(13, "small"))  # one more row in `small`
    plan = plancc.compile([str(a), str(b)], tmp_path / "p2", cache_dir=cache, **BASE)
    after = {p.name: p.stat().st_mtime_ns for p in (cache / "scans").iterdir()}
    assert len(after) == len(scans) + 1  # one new scan: small's
    assert all(after[k] == v for k, v in scans.items())  # big's entry untouched
    assert plan.manifest.recipe["datasets"][1]["retained"] == 13


def test_max_dropped_is_checked_per_dataset_and_the_error_names_it(tmp_path):
    a, _ = _data(tmp_path)
    long_rows = write_rows(tmp_path / "long.jsonl", [{"prompt": "x " * 400, "completion": "y"}] * 3 + _pc(7, "ok"))
    res = CliRunner().invoke(app, ["compile", str(a), str(long_rows), "-o", str(tmp_path / "p"), "--tokenizer",
                                   "builtin", "--sequence-len", "256", "--cache-dir", str(tmp_path / "c")])
    assert res.exit_code == 2
    assert "dataset 'long':" in res.output and "more than --max-dropped" in res.output
    assert "Traceback" not in res.output and not (tmp_path / "p").exists()


def test_cli_several_sources_with_mix_equals_the_api(tmp_path):
    a, b = _data(tmp_path)
    args = ["--tokenizer", "builtin", "--sequence-len", "512", "--world-size", "2", "--micro-batch-size", "2",
            "--seed", "5", "--cache-dir", str(tmp_path / "c")]
    res = CliRunner().invoke(app, ["compile", str(a), str(b), "-o", str(tmp_path / "cli"), "--mix", "small=2x",
                                   "--mix", "big=0.5x", *args])
    assert res.exit_code == 0, res.output
    assert "dataset    small (train, repeat 2x): 12 kept" in res.output
    api = plancc.compile([{"path": str(a), "repeat": 0.5}, {"path": str(b), "repeat": 2}], tmp_path / "api",
                         cache_dir=tmp_path / "c", **BASE)
    assert plancc.open_plan(tmp_path / "cli").fingerprints == api.fingerprints
    bad = CliRunner().invoke(app, ["compile", str(a), str(b), "-o", str(tmp_path / "x"), "--mix", "small=lots",
                                   *args])
    assert bad.exit_code == 2 and "NAME=Nx" in bad.output


def test_weights_share_each_epoch(tmp_path):
    a, b = _data(tmp_path)
    plan = plancc.compile([str(a), str(b)], tmp_path / "p", cache_dir=tmp_path / "c", mix="big=1,small=3",
                          samples_per_epoch=40, **BASE)
    before = {r["dataset"]: r["samples"] for r in plan.manifest.recipe["metrics"] if r["stage"] == "before"}
    assert before == {"big": 10, "small": 30}
    assert validate_plan(str(plan.path))[0] == []


def test_a_one_source_plan_is_unchanged(tmp_path):
    """No recipe settings in the manifest, no dataset column: the config fingerprint of one source is as before."""
    a, _ = _data(tmp_path)
    plan = plancc.compile(str(a), tmp_path / "p", cache_dir=tmp_path / "c", **BASE)
    assert "mixture" not in plan.manifest.to_json()["settings"] and plan.manifest.recipe is None
    assert parquet.read_samples(plan.path / schemas.SAMPLES_FILE).column_names == schemas.SAMPLES_SCHEMA.names


def test_diff_reports_per_dataset_changes_and_fails_on_them(tmp_path):
    a, b = _data(tmp_path)
    c = write_rows(tmp_path / "extra.jsonl", alpaca_rows(8))
    one = plancc.compile([str(a), str(b)], tmp_path / "one", cache_dir=tmp_path / "c", **BASE)
    write_rows(a, _pc(30, "BIG"))
    two = plancc.compile([str(a), {"path": str(b), "repeat": 2}, str(c)], tmp_path / "two", cache_dir=tmp_path / "c",
                         **BASE)
    res = CliRunner().invoke(app, ["diff", str(one.path), str(two.path), "--format", "json", "--fail-on", "dataset"])
    assert res.exit_code == 1, res.output
    report = json.loads(res.stdout)
    assert {d["name"]: d["status"] for d in report["datasets"]} == {"big": "content_changed", "small": "reweighted",
                                                                    "extra": "added"}
    assert report["changes"]["datasets"] is True
    text = CliRunner().invoke(app, ["diff", str(one.path), str(two.path)])
    assert "  - big rows: 30 edited (30 -> 30 samples)\n  - dataset extra added (8 samples)\n" \
        "  - small: repeat 1 -> 2 (mix)\n" in text.output
    same = CliRunner().invoke(app, ["diff", str(one.path), str(one.path), "--fail-on", "dataset"])
    assert same.exit_code == 0


def test_recipe_samples_schema_matches_its_documentation():
    doc = json.loads((REPO / "schemas" / "samples.arrow.json").read_text())
    assert [(c["name"], c["type"], c["nullable"]) for c in doc["columns"]] == [
        (f.name, str(f.type).replace("bool", "bool"), f.nullable) for f in schemas.RECIPE_SAMPLES_SCHEMA]


def test_errors_for_missing_or_doubled_sources(tmp_path):
    a, _ = _data(tmp_path)
    config = tmp_path / "r.toml"
    config.write_text(f'[[datasets]]\npath = "{a}"\n')
    with pytest.raises(SettingsError, match="lists datasets and sources were given too"):
        plancc.compile(str(a), tmp_path / "p", config=config)
    with pytest.raises(PlanccError, match="no source"):
        plancc.compile(None, tmp_path / "p")
    res = subprocess.run([sys.executable, "-m", "plancc", "compile", "-o", str(tmp_path / "p")], capture_output=True,
                         text=True, env={**os.environ})
    assert res.returncode == 2 and "no source" in res.stderr and "Traceback" not in res.stderr


def test_the_example_recipe_compiles_from_its_config_alone_from_any_folder(tmp_path):
    """`examples/recipe.toml` lists its datasets beside it: no SOURCE, any working folder; its data is regenerated
    byte for byte by `examples/make_example_data.py`."""
    import importlib.util

    root = REPO
    res = subprocess.run([sys.executable, "-m", "plancc", "compile", "-o", "p", "--config",
                          str(root / "examples" / "recipe.toml"), "--quiet", "--cache-dir", str(tmp_path / "c")],
                         cwd=tmp_path, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    plan = plancc.open_plan(tmp_path / "p")
    assert [(d["name"], d["retained"], d.get("repeat")) for d in plan.manifest.recipe["datasets"]] == [
        ("chat", 800, 2.0), ("alpaca", 300, 0.5)]
    assert validate_plan(str(tmp_path / "p"))[0] == []
    spec = importlib.util.spec_from_file_location("make_example_data", root / "examples" / "make_example_data.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    rng = module.random.Random(20261201)
    rows = [json.dumps(module.instruction(rng), ensure_ascii=False) + "\n" for _ in range(300)]
    assert "".join(rows) == (root / "examples" / "data" / "instructions.jsonl").read_text()


def test_a_recipe_plan_as_one_source_or_a_rescan_is_refused_and_as_a_dataset_it_joins(mixed, tmp_path):
    tmp, plan, (a, _, _) = mixed
    res = CliRunner().invoke(app, ["compile", str(plan.path), "-o", str(tmp_path / "p"), "--cache-dir",
                                   str(tmp / "cache")])
    assert res.exit_code == 2 and "holds a recipe's samples" in res.output
    res = CliRunner().invoke(app, ["validate", str(plan.path), "--dataset", str(a)])
    assert res.exit_code == 2 and "is a recipe of several datasets" in res.output
    nested = plancc.compile([str(plan.path), str(a)], tmp_path / "n", cache_dir=tmp / "cache", **{
        k: v for k, v in BASE.items() if k != "sequence_len"})
    assert [(d["name"], d["first_id"]) for d in nested.manifest.recipe["datasets"]] == [("plan", 0), ("big", 42)]
    assert validate_plan(str(nested.path))[0] == []


def test_yaml_config_lists_datasets_too(tmp_path):
    from plancc.config.resolve import read_config

    (tmp_path / "a.jsonl").write_text("")
    path = tmp_path / "r.yaml"
    path.write_text("tokenizer: builtin\ndatasets:\n  - path: a.jsonl\n    weight: 2\n  - hub/name\n"
                    "eval_datasets:\n  - {path: a.jsonl, name: held}\n")
    config = read_config(path)
    train, evals = config.train, config.evals
    assert train == [{"path": str(tmp_path / "a.jsonl"), "weight": 2}, "hub/name"]  # a Hub id stays as written
    specs = recipe.build(train, evals)
    assert [(s.name, s.role, (s.mix.kind, s.mix.value)) for s in specs] == [("a", "train", ("weight", 2.0)),
                                                              ("name", "train", ("repeat", 1.0)),
                                                              ("held", "eval", ("repeat", 1.0))]


def test_compiling_a_recipe_of_samples_tables_imports_no_pandas(tmp_path):
    """pyarrow imports pandas (a second of every compile) on some conversions; a recipe of samples tables avoids
    them, as one samples table does."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from benchmarks.synthetic import sft_mix

    paths = []
    for name, n in (("a", 300), ("b", 100)):
        s = sft_mix(n, seed=n)
        paths.append(str(tmp_path / f"{name}.parquet"))
        pq.write_table(pa.table({"sample_id": s.sample_id, "length": s.length.astype("int32"),
                                 "label_count": s.label_count.astype("int32"),
                                 "first_label_supervised": s.first_label_supervised,
                                 "token_hash": s.sample_id.astype("uint64")}), paths[-1])
    code = ("import sys, plancc; plancc.compile(sys.argv[1:3], sys.argv[3], mix='b=2x');"
            "print('pandas' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code, *paths, str(tmp_path / "p")], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "False"

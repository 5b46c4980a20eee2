"""Recipes of preference data (docs/preference.md, "Several preference datasets"): several pair datasets (and eval
entries) joined with pair ids offset per dataset like sample ids, every mixture operation acting on whole pairs
(weights, repeats, epochs, eval datasets, `--val-set-size`), each update's stored pair count what the collator
feeds the loss, `validate` redrawing the mixture over pairs; SFT, pairs and KTO rows never mix in one recipe.

The data is the repository's own: pairs built from `examples/data/instructions.jsonl` (`instruction_pairs`), split
into two training datasets and an eval set; at `sequence_len` 512 the scan drops some pairs, so pair ids have gaps.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

import plancc
import plancc.api
from plancc.cli import app
from plancc.core import layout
from plancc.review.validate import validate_plan
from plancc.runtime import PlanCollator, PlanSampler, load_tokens, verified_plan
from plancc.store import parquet, schemas
from tests.support.preference import instruction_pairs
from tests.support.sources import write_rows

SCAN = {"tokenizer": "builtin", "sequence_len": 512, "max_dropped": 0.5}
SIZES = {"a": 40, "b": 24, "held": 12}  # pairs of each dataset, before the scan's drops


@pytest.fixture(scope="module")
def scans(tmp_path_factory) -> dict[str, Path]:
    """Each dataset scanned once (the recipes below read the scans: no second tokenization)."""
    tmp = tmp_path_factory.mktemp("pairs")
    rows, out, start = instruction_pairs(sum(SIZES.values()), seed=3), {}, 0
    for name, n in SIZES.items():
        source = write_rows(tmp / f"{name}.jsonl", rows[start:start + n])
        plancc.api.scan(str(source), tmp / name, cache_dir=tmp / "cache", **SCAN)
        out[name], start = tmp / name, start + n
    return out


def _config(path: Path, scans: dict[str, Path], train: list[tuple[str, str, float]], evals: bool,
            top: dict[str, object]) -> Path:
    lines = [f"{k} = {v!r}".replace("'", '"') for k, v in top.items()]
    for name, kind, value in train:
        lines += ["[[datasets]]", f'path = "{scans[name]}"', f"{kind} = {value}"]
    if evals:
        lines += ["[[eval_datasets]]", f'path = "{scans["held"]}"']
    path.write_text("\n".join(lines) + "\n")
    return path


def _pairs(samples: pa.Table) -> dict[int, tuple[int, int, str]]:
    """Each pair id: (chosen sample id, rejected sample id, dataset); every id exactly one of each."""
    ids, pid = parquet.column(samples, "sample_id"), parquet.column(samples, schemas.PAIR_ID_COLUMN)
    roles, names = samples.column(schemas.PAIR_ROLE_COLUMN).to_pylist(), samples.column("dataset").to_pylist()
    out: dict[int, dict[str, int]] = {}
    for sid, p, role, name in zip(ids.tolist(), pid.tolist(), roles, names, strict=True):
        entry = out.setdefault(p, {"dataset": name})
        assert role not in entry and entry["dataset"] == name, f"pair {p}: two {role} completions or two datasets"
        entry[role] = sid
    assert all(len(e) == 3 for e in out.values())
    return {p: (e["chosen"], e["rejected"], e["dataset"]) for p, e in out.items()}


def _epoch_pairs(rows: pa.Table, pairs: dict[int, tuple[int, int, str]]) -> Counter:
    """How often each pair is in the epoch's rows; each one whole, chosen then rejected, in one microbatch."""
    of = {c: p for p, (c, _, _) in pairs.items()}
    seen: Counter = Counter()
    for microbatch in rows.column("sample_ids").to_pylist():
        flat = [i for row in microbatch for i in row]
        assert len(flat) % 2 == 0
        for c, r in zip(flat[0::2], flat[1::2], strict=True):
            assert c in of and pairs[of[c]][1] == r, f"samples {c}, {r} are not one pair, chosen first"
            seen[of[c]] += 1
    return seen


def _collated_pairs(plan_dir: Path) -> None:
    """Every microbatch as the collator builds it on its rank: its pairs sum over its update to the stored global
    pair count, which the batch carries as `num_pairs_in_batch`."""
    p = verified_plan(plan_dir)
    tokens, collator = load_tokens(p), PlanCollator.from_plan(p)
    W = p.settings.world_size
    for epoch in p.epochs:
        per_update: Counter = Counter()
        carried: dict[int, set[int]] = {}
        for rank in range(W):
            sampler = PlanSampler(p, rank=rank, world_size=W)
            sampler.set_epoch(epoch)
            for mb in sampler:
                batch = collator(mb, tokens)
                update = batch["plan"]["update"]
                per_update[update] += int(batch["chosen_index"].shape[0])
                assert batch["rejected_index"].shape == batch["chosen_index"].shape
                carried.setdefault(update, set()).add(int(batch["num_pairs_in_batch"]))
        rows = p.files.read_epoch(epoch)
        stored = dict(zip(parquet.column(rows, "update").tolist(), parquet.column(rows, "num_pairs").tolist(),
                          strict=True))
        assert {u: {n} for u, n in per_update.items()} == carried
        assert {u: stored[u] for u in per_update} == dict(per_update)


mixes = st.tuples(st.sampled_from(["repeat", "weight"]), st.sampled_from([0.5, 0.7, 1, 1.5, 2.5]))


@settings(max_examples=6, deadline=None)  # whole compiles: the planner's draw over many more, test_pair_mixture.py
@given(a=mixes, b=mixes, epochs=st.integers(1, 3), evals=st.booleans(), val=st.sampled_from([0, 0.1, 3]),
       mode=st.sampled_from(["packed", "padded"]), world=st.integers(1, 2), accum=st.integers(1, 2),
       seed=st.integers(0, 99))
def test_every_mixture_operation_moves_whole_pairs(scans, tmp_path_factory, a, b, epochs, evals, val, mode, world,
                                                   accum, seed):
    tmp = tmp_path_factory.mktemp("mix")
    top = {"seed": seed, "epochs": epochs, "mode": mode, "world_size": world, "grad_accum": accum,
           "micro_batch_size": 2, **({"val_set_size": val} if val else {})}
    config = _config(tmp / "r.toml", scans, [("a", *a), ("b", *b)], evals, top)
    plan = plancc.compile(None, tmp / "plan", config=config, cache_dir=tmp / "cache")
    assert validate_plan(str(plan.path))[0] == []
    samples = parquet.read_samples(plan.path / schemas.SAMPLES_FILE)
    pairs = _pairs(samples)  # pair ids unique across the recipe, each pair in one dataset
    ids, pid = parquet.column(samples, "sample_id"), parquet.column(samples, schemas.PAIR_ID_COLUMN)
    rejected = np.asarray(samples.column(schemas.PAIR_ROLE_COLUMN).to_pylist()) == "rejected"
    assert np.array_equal(ids, 2 * pid + rejected)  # offset as the sample ids are: a pair's row stays its id's half
    datasets = {d["name"]: d for d in plan.manifest.recipe["datasets"]}
    held = set()
    if plan.manifest.has_eval:  # held out whole: both completions, each once, never trained on
        eval_ids = [i for mb in plan.files.read_eval().column("sample_ids").to_pylist() for row in mb for i in row]
        of = {c: p for p, (c, _, _) in pairs.items()}
        held = {of[c] for c in eval_ids[0::2]}
        assert sorted(eval_ids) == sorted(i for p in held for i in pairs[p][:2])
        assert {p for p, (_, _, d) in pairs.items() if d == "held"} <= held if evals else True
    trained = {name: [p for p, (_, _, d) in pairs.items() if d == name and p not in held] for name in ("a", "b")}
    weights = {n: m[1] for n, m in (("a", a), ("b", b)) if m[0] == "weight"}
    for e in plan.epochs:
        seen = _epoch_pairs(plan.files.read_epoch(e), pairs)
        assert not set(seen) & held
        for name, mix in (("a", a), ("b", b)):
            n, got = len(trained[name]), sum(seen[p] for p in trained[name])
            if mix[0] == "repeat":
                assert got == int(np.floor(mix[1] * n + 0.5))
            else:  # its share of the largest weighted dataset's pairs, within rounding
                total = max(len(trained[w]) for w in weights)
                assert abs(got - weights[name] / sum(weights.values()) * total) <= 1
            counts = [seen[p] for p in trained[name]]
            assert max(counts) - min(counts) <= 1 and max(counts) == -(-got // n)  # spread evenly, whole pairs
            if mix == ("repeat", 1):
                assert set(counts) == {1}  # every retained pair exactly once
        after = {r["dataset"]: r for r in plan.manifest.recipe["metrics"] if r["epoch"] == e and r["stage"] == "after"}
        assert {n: after[n]["samples"] for n in ("a", "b")} == {n: 2 * sum(seen[p] for p in trained[n])
                                                              for n in ("a", "b")}
        assert {n: after[n]["pairs"] for n in ("a", "b")} == {n: sum(seen[p] for p in trained[n]) for n in ("a", "b")}
    assert {n: datasets[n]["pairs"] for n in datasets} == {n: sum(d == n for _, _, d in pairs.values())
                                                           for n in datasets}
    _collated_pairs(plan.path)


def _user_recipe(scans: dict[str, Path], tmp: Path) -> Path:
    return _config(tmp / "dpo.toml", scans, [("a", "weight", 0.7), ("b", "weight", 0.3)], True,
                   {"epochs": 2, "world_size": 2, "grad_accum": 2, "micro_batch_size": 2, "seed": 4})


def test_identical_inputs_give_identical_plan_bytes_and_the_mixture_is_of_pairs(scans, tmp_path):
    config = _user_recipe(scans, tmp_path)
    one = plancc.compile(None, tmp_path / "one", config=config, cache_dir=tmp_path / "c1")
    two = plancc.compile(None, tmp_path / "two", config=config, cache_dir=tmp_path / "c2")
    for name in (schemas.PLAN_FILE, schemas.SAMPLES_FILE, schemas.METRICS_FILE, schemas.EVAL_FILE):
        assert (one.path / name).read_bytes() == (two.path / name).read_bytes(), name
    assert one.fingerprints == two.fingerprints
    datasets = one.manifest.recipe["datasets"]
    assert [d["first_pair"] for d in datasets] == [d["first_id"] // 2 for d in datasets]
    assert one.manifest.data_kind == "preference" and one.manifest.eval.counts["pairs"] == datasets[2]["pairs"]
    # weights share pairs: 0.7 / 0.3 of the larger dataset's pairs an epoch
    before = {r["dataset"]: r["samples"] // 2 for r in one.manifest.recipe["metrics"]
              if r["epoch"] == 0 and r["stage"] == "before" and r["dataset"] != "held"}
    largest = max(datasets[0]["pairs"], datasets[1]["pairs"])
    assert sum(before.values()) == largest and abs(before["a"] - 0.7 * largest) <= 1


def test_validate_accepts_the_recipe_plan_and_refuses_a_pair_the_mixture_did_not_draw(scans, tmp_path):
    config = _config(tmp_path / "r.toml", scans, [("a", "repeat", 1), ("b", "repeat", 0.5)], False,
                     {"epochs": 1, "micro_batch_size": 1, "mode": "padded", "seed": 2})
    plan = plancc.compile(None, tmp_path / "plan", config=config, cache_dir=tmp_path / "cache")
    res = CliRunner().invoke(app, ["validate", str(plan.path)])
    assert res.exit_code == 0, res.output
    samples = parquet.read_samples(plan.path / schemas.SAMPLES_FILE)
    pairs = _pairs(samples)
    table = pq.read_table(plan.path / schemas.PLAN_FILE)
    seen = _epoch_pairs(table, pairs)
    drawn = next(p for p in seen if pairs[p][2] == "b")
    other = next(p for p, (_, _, d) in pairs.items() if d == "b" and p not in seen)  # half of b is not drawn
    ids = table.column("sample_ids").to_pylist()
    swap = {pairs[drawn][0]: pairs[other][0], pairs[drawn][1]: pairs[other][1]}
    ids = [[[swap.get(i, i) for i in row] for row in mb] for mb in ids]
    pq.write_table(table.set_column(table.column_names.index("sample_ids"), "sample_ids",
                                    pa.array(ids, table.schema.field("sample_ids").type)), plan.path / schemas.PLAN_FILE)
    problems, _ = validate_plan(str(plan.path))
    assert f"plan.parquet epoch 0: 2 sample ids are not in the epoch's mixture draw of samples.parquet (first: " \
        f"{pairs[other][0]})" in problems, problems
    res = CliRunner().invoke(app, ["validate", str(plan.path)])
    assert res.exit_code == 1 and "Traceback" not in res.output


def test_the_user_tour_compiles_inspects_validates_and_diffs_in_pairs(scans, tmp_path):
    config = _user_recipe(scans, tmp_path)
    res = CliRunner().invoke(app, ["compile", "--config", str(config), "-o", str(tmp_path / "p"), "--cache-dir",
                                   str(tmp_path / "c")])
    assert res.exit_code == 0, res.output
    plan = plancc.open_plan(tmp_path / "p")
    a, b, held = plan.manifest.recipe["datasets"]
    assert f"dataset    a (train, weight 0.7): {a['pairs']} pairs kept" in res.output
    assert f"held (eval, not trained on): {held['pairs']} pairs kept" in res.output
    assert f"eval       {held['pairs']} pairs ({2 * held['pairs']} samples) held out (eval datasets)" in res.output
    assert CliRunner().invoke(app, ["validate", str(tmp_path / "p")]).exit_code == 0
    by = CliRunner().invoke(app, ["inspect", "metrics", str(tmp_path / "p"), "--by", "dataset", "--epoch", "0"])
    after = {r["dataset"]: r for r in plan.manifest.recipe["metrics"] if r["epoch"] == 0 and r["stage"] == "after"}
    assert by.exit_code == 0 and "pairs" in by.output.splitlines()[2], by.output
    assert f"epoch 0: {after['a']['pairs']:,} pairs" in res.output
    sample = b["first_id"] + 1
    shown = CliRunner().invoke(app, ["show", str(tmp_path / "p"), "--sample", str(sample), "--no-color"])
    assert shown.exit_code == 0 and f"pair {(sample - 1) // 2}" in shown.output and "dataset b" in shown.output
    # a pair of dataset a edited: diff names one edited row, the pair's row in its source file
    samples = parquet.read_samples(tmp_path / "p" / schemas.SAMPLES_FILE)
    row = min(p for p, (_, _, d) in _pairs(samples).items() if d == "a")  # a's first kept pair (first_pair 0)
    rows = instruction_pairs(sum(SIZES.values()), seed=3)[:SIZES["a"]]
    rows[row] = {**rows[row], "chosen": rows[row]["chosen"] + " Edited."}
    (tmp_path / "edit").mkdir()
    edited = write_rows(tmp_path / "edit" / "a.jsonl", rows)
    changed = _config(tmp_path / "edited.toml", {**scans, "a": edited}, [("a", "weight", 0.7), ("b", "weight", 0.3)],
                      True, {"epochs": 2, "world_size": 2, "grad_accum": 2, "micro_batch_size": 2, "seed": 4,
                             **SCAN})
    plancc.compile(None, tmp_path / "q", config=changed, cache_dir=tmp_path / "c")
    report = plancc.api.diff(str(tmp_path / "p"), str(tmp_path / "q"))
    rows_a = next(d for d in report["datasets"] if d["name"] == "a")["rows"]
    assert (rows_a["edited"], rows_a["added"], rows_a["removed"]) == (1, 0, 0)
    assert rows_a["examples"]["edited"][0]["row"] == row


@pytest.mark.parametrize("other", ["sft", "unpaired"])
def test_mixing_kinds_in_one_recipe_is_one_error_naming_both(scans, tmp_path, other):
    rows = instruction_pairs(8, seed=5)
    if other == "sft":
        other_rows = [{"prompt": r["prompt"], "completion": r["chosen"]} for r in rows]
        said = "dataset 'a' holds preference pairs (preference) but dataset 'other' holds SFT data (sft)"
    else:
        other_rows = [{"prompt": r["prompt"], "completion": r[k], "label": k == "chosen"}
                      for r in rows for k in ("chosen", "rejected")]
        said = ("dataset 'a' holds preference pairs (preference) but dataset 'other' holds unpaired (KTO) data "
                "(unpaired_preference)")
    source = write_rows(tmp_path / "other.jsonl", other_rows)
    res = CliRunner().invoke(app, ["compile", str(scans["a"]), str(source), "-o", str(tmp_path / "p"),
                                   "--cache-dir", str(tmp_path / "c"), "--tokenizer", "builtin", "-q"])
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert res.exit_code == 2 and len(lines) == 1 and said in lines[0] and "Traceback" not in res.output, res.output
    assert not (tmp_path / "p").exists()


def test_each_updates_pair_count_is_what_the_collator_feeds_the_loss(scans, tmp_path):
    """The stored `num_pairs` of each microbatch is its update's pairs on all ranks, counted from the rows alone,
    and what the collator's batches hold and carry (`num_pairs_in_batch`)."""
    config = _user_recipe(scans, tmp_path)
    plan = plancc.compile(None, tmp_path / "p", config=config, cache_dir=tmp_path / "c")
    rows = plan.files.read_epoch(0)
    own = np.array([sum(len(r) for r in mb) // 2 for mb in rows.column("sample_ids").to_pylist()])
    order = np.argsort(parquet.column(rows, "index"), kind="stable")
    want = layout.num_items(own[order], plan.settings.world_size, plan.settings.grad_accum)
    assert np.array_equal(parquet.column(rows, "num_pairs")[order], want)
    _collated_pairs(plan.path)


def test_a_recipe_of_unpaired_kto_datasets_keeps_each_label(tmp_path):
    rows = instruction_pairs(30, seed=6)
    feedback = [{"prompt": r["prompt"], "completion": r[k], "label": k == "chosen"} for r in rows
                for k in ("chosen", "rejected")]
    sources = [write_rows(tmp_path / f"{name}.jsonl", part) for name, part in
               (("good", feedback[:36]), ("more", feedback[36:]))]
    plan = plancc.compile([str(sources[0]), {"path": str(sources[1]), "repeat": 1.5}], tmp_path / "p",
                          cache_dir=tmp_path / "c", val_set_size=4, **SCAN)
    assert plan.manifest.data_kind == "unpaired_preference" and validate_plan(str(plan.path))[0] == []
    samples = parquet.read_samples(plan.path / schemas.SAMPLES_FILE)
    labels = dict(zip(parquet.column(samples, "sample_id").tolist(),
                      parquet.column(samples, schemas.DESIRABLE_COLUMN).tolist(), strict=True))
    first = plan.manifest.recipe["datasets"][1]["first_id"]
    assert all(labels[first + i] == (i % 2 == 0) for i in range(0, 24) if first + i in labels)  # its own rows' labels
    rows0 = plan.files.read_epoch(0)
    desirable = [sum(labels[i] for row in mb for i in row) for mb in rows0.column("sample_ids").to_pylist()]
    order = np.argsort(parquet.column(rows0, "index"), kind="stable")
    want = layout.num_items(np.asarray(desirable)[order], plan.settings.world_size, plan.settings.grad_accum)
    assert np.array_equal(parquet.column(rows0, "num_desirable")[order], want)

"""Preference plans (docs/preference.md): a pair is planned as one unit and never split, over every layout, world
size, accumulation, shift and drop-last; each update's stored pair and chosen-target counts are recounted from its
rows; balancing evens out pairs per update; a written plan validates and a split pair is named; a samples table
whose pairs do not pair up is one clear error; SFT tables and plans are unchanged."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st

from benchmarks.preference_data import pair_mix
from plancc.config.settings import PlanSettings
from plancc.core import layout
from plancc.core.plan_arrays import SampleArrays
from plancc.errors import InputError
from plancc.planner.metrics import entry_targets
from plancc.planner.pipeline import compile_run, plan_columns
from plancc.store import schemas
from plancc.store.plan import Plan


def random_pairs(rng: np.random.Generator, n: int, max_len: int) -> SampleArrays:
    """`n` pairs of completions (2i chosen, 2i + 1 rejected) of random lengths and label counts."""
    length = rng.integers(2, max_len + 1, 2 * n)
    label = np.minimum(rng.integers(1, max_len + 1, 2 * n), length)
    first = (label == length) & (rng.random(2 * n) < 0.5)
    order = rng.permutation(2 * n)  # the table's order is not the pairs' order
    pid = np.repeat(rng.permutation(10 * n)[:n], 2)
    chosen = np.tile([True, False], n)
    return SampleArrays(np.arange(2 * n, dtype=np.int64), length[order], label[order], first[order], pid[order],
                        chosen[order])


def assert_pairs_whole(b, s: SampleArrays, settings: PlanSettings) -> None:
    """Every pair side by side, chosen first, in one row (or two adjacent rows of one padded microbatch)."""
    c, r = b.samples[0::2], b.samples[1::2]
    assert b.samples.shape[0] % 2 == 0
    assert s.chosen[c].all() and not s.chosen[r].any()
    assert np.array_equal(s.pair_id[c], s.pair_id[r])
    bounds = b.row_bounds[b.batch_bounds] if settings.mode == "padded" else b.row_bounds
    assert (bounds % 2 == 0).all()


@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 60), mode=st.sampled_from(["packed", "padded", "flattened"]),
       real=st.booleans(), mbs=st.integers(1, 3), world=st.integers(1, 3), accum=st.integers(1, 3),
       shift=st.sampled_from(["sample", "row", "none"]), drop_last=st.booleans(), balance=st.booleans(),
       val=st.sampled_from([0, 0.2]))
def test_pairs_are_never_split(seed, n, mode, real, mbs, world, accum, shift, drop_last, balance, val):
    rng = np.random.default_rng(seed)
    s = random_pairs(rng, n, 24)
    if shift == "none":
        s = SampleArrays(s.sample_id, s.length, s.label_count, np.zeros(len(s), bool), s.pair_id, s.chosen)
    settings = PlanSettings(mode=mode, real_batches=real and mode == "packed", micro_batch_size=mbs, sequence_len=24,
                            world_size=world, grad_accum=accum, shift=shift, drop_last=drop_last, balance=balance,
                            seed=seed % 1000, epochs=2, val_set_size=val if n >= 5 else 0)
    try:
        run = compile_run(s, settings)
    except Exception as exc:  # only --drop-last with less than one update may refuse
        assert drop_last and "--drop-last leaves nothing" in str(exc)
        return
    held = 0 if run.evaluation is None else len(run.evaluation.samples)
    if run.evaluation is not None:
        assert_pairs_whole(run.evaluation.batches, run.evaluation.samples, settings)
    for p in run.epochs:
        b, train = p.batches, run.train
        assert_pairs_whole(b, train, settings)
        seen = np.bincount(b.samples, minlength=len(train))
        assert seen.max() <= 1 and (drop_last or seen.sum() == len(s) - held)
        cols = plan_columns(p, train, settings)
        pairs = np.diff(b.row_bounds[b.batch_bounds]) // 2
        assert np.array_equal(cols["num_pairs"], layout.num_items(pairs, world, accum))
        chosen_targets = entry_targets(b, train, shift) * train.chosen[b.samples]
        per_batch = np.add.reduceat(chosen_targets, b.row_bounds[b.batch_bounds][:-1]) if b.num_batches else []
        assert np.array_equal(cols["num_chosen_items"], layout.num_items(np.asarray(per_batch, np.int64), world,
                                                                            accum))
        if mode != "packed":  # micro_batch_size counts pairs (one microbatch may hold the remainder)
            assert np.count_nonzero(pairs != mbs) <= 1 and pairs.min() >= 1 and pairs.max() <= mbs
        else:
            rows = np.diff(b.row_bounds)
            tokens = np.add.reduceat(train.length[b.samples], b.row_bounds[:-1])[rows > 0]
            assert tokens.max() <= settings.row_capacity * 2


def test_balancing_evens_out_pairs_per_update():
    s = pair_mix(4000, seed=1, sequence_len=2048)
    settings = PlanSettings(mode="packed", micro_batch_size=2, sequence_len=2048, world_size=2, grad_accum=4)
    rows = dict(compile_run(s, settings).epochs[0].metrics)
    before, after = rows["before"], rows["after"]
    assert after["update_pair_cv"] < 0.05 < before["update_pair_cv"]
    assert after["update_chosen_label_cv"] < 0.05 < before["update_chosen_label_cv"]
    assert after["pair_cv"] < before["pair_cv"]
    assert after["pairs"] == before["pairs"] == 4000


def test_a_pair_missing_its_other_completion_is_one_clear_error():
    s = random_pairs(np.random.default_rng(0), 5, 20)
    broken = s.take(np.flatnonzero(s.sample_id != 3))
    with pytest.raises(InputError, match=r"pair \d+ has completions \['(chosen|rejected)'\]"):
        compile_run(broken, PlanSettings(sequence_len=20))


def test_sft_tables_keep_their_schema():
    assert schemas.samples_schema(False) == schemas.SAMPLES_SCHEMA
    assert schemas.plan_schema() == schemas.PLAN_SCHEMA
    assert schemas.data_kind_of(schemas.SAMPLES_SCHEMA.names) == "sft"
    pref = schemas.samples_schema(False, "preference")
    assert pref.names[-2:] == ["pair_id", "pair_role"] and schemas.data_kind_of(pref.names) == "preference"


def test_a_written_plan_validates_and_a_split_pair_is_named(tmp_path):
    from benchmarks.preference_data import build_preference_plan, tokenize_pairs
    from plancc.review.validate import validate_plan

    pairs = [{"prompt": f"question {i}? ", "chosen": "yes" * (i % 5 + 1), "rejected": "no" * (i % 3 + 1)}
             for i in range(24)]
    tok = tokenize_pairs(pairs, lambda t: list(t.encode()), 256)
    plan = build_preference_plan(tmp_path, tok, mode="packed", micro_batch_size=1, sequence_len=64, grad_accum=2,
                                 val_set_size=4)
    problems, has_eval = validate_plan(str(plan))
    manifest = Plan(plan).manifest
    assert problems == [] and has_eval and manifest.data_kind == "preference" and manifest.eval.counts == {"pairs": 4}
    table = pq.read_table(plan / schemas.PLAN_FILE)
    ids = table.column("sample_ids").to_pylist()
    row = ids[0][0]
    ids[0][0] = [row[1], row[0], *row[2:]]  # the rejected completion first
    pq.write_table(table.set_column(table.column_names.index("sample_ids"), "sample_ids",
                                    pa.array(ids, table.schema.field("sample_ids").type)),
                   plan / schemas.PLAN_FILE)
    problems, _ = validate_plan(str(plan))
    assert any("not a chosen completion followed by its pair's rejected one" in p for p in problems)

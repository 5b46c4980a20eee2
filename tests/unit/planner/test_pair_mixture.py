"""A recipe of preference datasets, planned: the mixture (repeats, weights, `samples_per_epoch`), the eval datasets
and `--val-set-size`'s draw count and move pairs, never completions (`plancc.core.pairs`), and `validate`'s redraw
of the mixture (`plancc.store.redraw`, code of its own) names the same pairs as the planner's draw."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from plancc.config.settings import MixEntry, PlanSettings
from plancc.core import pairs
from plancc.core.plan_arrays import SampleArrays
from plancc.errors import InputError, SettingsError
from plancc.planner.pipeline import compile_run
from plancc.store import redraw


def recipe_pairs(rng: np.random.Generator, sizes: list[int], max_len: int) -> tuple[SampleArrays, np.ndarray]:
    """Datasets of `sizes` pairs joined as a recipe joins them: sample ids 2 x pair id + role, pair ids offset per
    dataset with gaps (dropped pairs); each completion's dataset (`index`)."""
    pair_ids, index, first = [], [], 0
    for d, n in enumerate(sizes):
        span = n + int(rng.integers(0, 3))  # rows the scan read: some pairs dropped
        pair_ids.append(first + np.sort(rng.choice(span, n, replace=False)))
        index.append(np.full(2 * n, d))
        first += span
    pid = np.repeat(np.concatenate(pair_ids), 2)
    chosen = np.tile([True, False], pid.shape[0] // 2)
    length = rng.integers(2, max_len + 1, pid.shape[0])
    label = np.minimum(rng.integers(1, max_len + 1, pid.shape[0]), length)
    s = SampleArrays(2 * pid + ~chosen, length, label, np.zeros(pid.shape[0], bool), pid, chosen)
    return s, np.concatenate(index)


entries = st.tuples(st.sampled_from(["repeat", "weight"]), st.sampled_from([0.3, 0.5, 1.0, 1.5, 2.5]))


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), sizes=st.lists(st.integers(3, 30), min_size=2, max_size=3), data=st.data(),
       evals=st.booleans(), val=st.sampled_from([0, 0.2, 2]), epochs=st.integers(1, 3),
       mode=st.sampled_from(["packed", "padded", "flattened"]), world=st.integers(1, 2), accum=st.integers(1, 2),
       per_epoch=st.sampled_from([None, 25]))
def test_the_mixture_and_the_held_out_draw_take_whole_pairs(seed, sizes, data, evals, val, epochs, mode, world,
                                                            accum, per_epoch):
    rng = np.random.default_rng(seed)
    s, index = recipe_pairs(rng, sizes, 20)
    mix = [MixEntry(f"d{d}", "train", *data.draw(entries)) for d in range(len(sizes))]
    if evals:
        mix[-1] = MixEntry(mix[-1].name, "eval", "repeat", 1.0)
    settings_ = PlanSettings(mode=mode, micro_batch_size=2, sequence_len=20, world_size=world, grad_accum=accum,
                             epochs=epochs, seed=seed % 997, val_set_size=val, mixture=tuple(mix),
                             samples_per_epoch=per_epoch if any(m.kind == "weight" for m in mix) else None)
    try:
        run = compile_run(s, settings_, index=index)
    except SettingsError as exc:  # a held-out draw that leaves nothing to train on is refused, saying so
        assert "--val-set-size" in str(exc) and "holds out" in str(exc), exc
        return
    held = np.zeros(0, dtype=np.int64) if run.evaluation is None else run.evaluation.samples.sample_id
    held_pairs = np.unique(held // 2)
    assert np.array_equal(np.sort(held), np.sort(np.concatenate([2 * held_pairs, 2 * held_pairs + 1])))  # whole
    assert np.array_equal(held, redraw.pair_eval_ids(s.sample_id, s.pair_id, s.chosen, settings_, index)
                          if held.size else held)
    trained_index = np.where(np.isin(s.sample_id, held), -1, index)
    members = pairs.pair_members(s.sample_id, s.pair_id, s.chosen)
    for p in run.epochs:
        ids = p.samples.sample_id[p.batches.samples]
        assert np.array_equal(ids[0::2] + 1, ids[1::2])  # chosen, then its rejected completion, side by side
        assert not np.isin(ids, held).any()
        # the planner's draw is validate's, over pairs: the same multiset of completions
        drawn = redraw.epoch_positions(pairs.per_pair(trained_index, members), settings_, p.epoch)
        want = np.sort(s.sample_id[pairs.pair_samples(members, drawn)])
        assert np.array_equal(np.sort(ids), want)
        for d, m in enumerate(mix):
            mine = np.unique(s.pair_id[(trained_index == d) & s.chosen])
            got = np.bincount(np.searchsorted(mine, ids[0::2][np.isin(ids[0::2] // 2, mine)] // 2),
                              minlength=mine.size)
            if m.role == "eval" or mine.size == 0:
                assert got.sum() == 0
                continue
            assert got.max() - got.min() <= 1  # pairs spread evenly: full passes and one window
            if m.kind == "repeat":
                assert got.sum() == int(np.floor(m.value * mine.size + 0.5))  # counted in pairs


def test_a_pair_without_its_other_completion_is_named():
    s, _ = recipe_pairs(np.random.default_rng(1), [4], 10)
    with pytest.raises(InputError, match=r"pair \d+ has completions \['chosen'\]"):
        pairs.pair_members(s.sample_id[:-1], s.pair_id[:-1], s.chosen[:-1])


def test_per_pair_and_pair_samples_leave_samples_alone_without_pairs():
    values, positions = np.array([5, 6, 7]), np.array([1, 0, 1])
    assert pairs.per_pair(values, None) is values and pairs.pair_samples(None, positions) is positions
    members = np.array([[1, 0], [2, 3]])
    assert pairs.per_pair(np.array([9, 8, 7, 6]), members).tolist() == [8, 7]
    assert pairs.pair_samples(members, positions).tolist() == [2, 3, 1, 0, 2, 3]

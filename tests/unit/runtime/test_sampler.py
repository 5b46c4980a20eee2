"""Sampler: plan order, coverage, lockstep tail placeholders, exact resume, elastic replay, refusals."""

from __future__ import annotations

import pickle
import subprocess
import sys
from collections import defaultdict

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from benchmarks.synthetic import build_plan, make_tokenized
from plancc.runtime import (
    PlanCollator,
    PlanDataLoader,
    PlanDataset,
    PlanMismatchError,
    PlanSampler,
    checkpoint_state,
    load_tokens,
    restore_checkpoint_state,
)
from plancc.store import schemas
from plancc.store.plan_store import PlanFiles

PACKED = dict(mode="packed", micro_batch_size=2, sequence_len=24)


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    # 37 samples, flattened groups of 2 -> 19 microbatches; W=2, G=2 -> 4 complete updates + a tail of 3
    return build_plan(tmp_path_factory.mktemp("plan"), n=37, mode="flattened", micro_batch_size=2, sequence_len=24,
                      world_size=2, grad_accum=2, epochs=2)


def _loaded_after(module: str, names: tuple[str, ...]) -> list[str]:
    code = (f"import sys, {module}; "
            f"print(','.join(m for m in {names!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    return [m for m in out.strip().split(",") if m]


@pytest.mark.slow
def test_import_loads_no_cli_or_datasets():
    """plancc.runtime imports only torch, pyarrow, numpy (+ plancc.store.plan_store); the HF glue adds transformers only."""
    compile_side = ("typer", "plancc.cli", "plancc.scan.scanner", "plancc.planner.pipeline", "plancc.scan.sources", "plancc.planner.pack")
    assert _loaded_after("plancc.runtime", (*compile_side, "datasets", "transformers", "numba")) == []
    assert _loaded_after("plancc.runtime.hf", compile_side) == []
    assert _loaded_after("plancc.runtime.trl", compile_side) == []


def test_plan_order_coverage_and_lockstep(plan):
    table = PlanFiles(plan).read_epoch(1)
    total = len(table)
    assert total == 19
    seqs = {r: list(PlanSampler(plan, rank=r, world_size=2, epoch=1)) for r in range(2)}
    assert len(seqs[0]) == len(seqs[1]) == 4 * 2 + 2  # tail of 3 microbatches: 2 micro-steps on every rank
    seen = []
    for r, seq in seqs.items():
        for mb in seq:
            if not mb.placeholder:
                assert mb.index % 2 == r
                row = table.slice(mb.index, 1).to_pylist()[0]
                assert list(mb) == [i for rw in row["sample_ids"] for i in rw]
                assert (mb.update, mb.micro_step, mb.label_count, mb.num_items) == (
                    row["update"], row["micro_step"], row["label_count"], row["num_items"])
                seen += list(mb)
    assert sorted(seen) == list(range(37))  # every sample exactly once
    for a, b in zip(seqs[0], seqs[1], strict=True):  # lockstep
        assert (a.update, a.micro_step, a.last_in_update) == (b.update, b.micro_step, b.last_in_update)
    assert [mb.placeholder for mb in seqs[1]] == [False] * 9 + [True]
    ph = seqs[1][-1]
    assert ph.label_count == 0 and ph.num_items == seqs[0][-1].num_items and ph.last_in_update
    assert pickle.loads(pickle.dumps(ph)).num_items == ph.num_items


def test_full_updates_pad_the_tail_with_placeholders(plan):
    """`full_updates=True` (what PlanTrainer uses): the tail update has G micro-steps too, the extra ones empty."""
    plain = list(PlanSampler(plan, rank=0, world_size=1, grad_accum=4))
    full = PlanSampler(plan, rank=0, world_size=1, grad_accum=4, full_updates=True)
    seq = list(full)
    assert len(plain) == 19 and len(seq) == full.epoch_length == 20  # 4 updates of 4 + a tail of 3 (+1 placeholder)
    assert [(list(a), a.index, a.update) for a in seq[:19]] == [(list(b), b.index, b.update) for b in plain]
    assert [mb.last_in_update for mb in seq[16:]] == [False, False, False, True]
    assert seq[-1].placeholder and seq[-1].update == 4 and seq[-1].num_items == plain[-1].num_items
    # a state of the other shape resumes at an update boundary only
    other = PlanSampler(plan, rank=0, world_size=1, grad_accum=4)
    other.load_state_dict(full.state_at(0, 16))
    assert [mb.index for mb in other] == [mb.index for mb in plain[16:]]
    with pytest.raises(PlanMismatchError, match="mid-update"):
        other.load_state_dict(full.state_at(0, 17))


def test_drop_last_has_no_tail(tmp_path):
    p = build_plan(tmp_path, n=37, mode="flattened", micro_batch_size=2, sequence_len=24, world_size=2, grad_accum=2,
                   drop_last=True)
    seq = list(PlanSampler(p, rank=1, world_size=2))
    assert len(seq) == 8 and not any(mb.placeholder for mb in seq)


@pytest.mark.parametrize("shape", [(1, 4), (4, 1), (2, 2)])
def test_elastic_replay_keeps_updates(plan, shape):
    w, g = shape

    def updates(world, accum):
        out = defaultdict(lambda: [set(), set()])
        for r in range(world):
            for mb in PlanSampler(plan, rank=r, world_size=world, grad_accum=accum):
                if not mb.placeholder:
                    out[mb.update][0].add(mb.index)
                    out[mb.update][1].add(mb.num_items)
        return dict(out)

    assert updates(w, g) == updates(2, 2)


def test_world_size_mismatch_is_refused(plan):
    with pytest.raises(PlanMismatchError, match=r"compiled for world_size 2 .*grad_accum=4"):
        PlanSampler(plan, rank=0, world_size=1)
    with pytest.raises(PlanMismatchError, match="same product"):
        PlanSampler(plan, rank=0, world_size=4, grad_accum=2)
    with pytest.raises(PlanMismatchError, match="does not divide"):
        PlanSampler(plan, rank=0, world_size=3)


@pytest.mark.parametrize("k", [0, 1, 2, 3, 5, 9, 10])
def test_resume_yields_the_rest_exactly(plan, k):
    full = [(mb.epoch, mb.position, mb.index, tuple(mb)) for mb in PlanSampler(plan, rank=1, world_size=2)]
    s = PlanSampler(plan, rank=1, world_size=2)
    it = iter(s)
    head = [next(it) for _ in range(k)]
    state = s.state_dict()
    assert state["position"] == k and state["valid"]
    fresh = PlanSampler(plan, rank=1, world_size=2)
    fresh.load_state_dict(state)
    fresh.set_epoch(0)  # a loop calling set_epoch for the resumed epoch keeps the position
    assert len(fresh) == len(full) - k
    rest = [(mb.epoch, mb.position, mb.index, tuple(mb)) for mb in fresh]
    assert [(mb.epoch, mb.position, mb.index, tuple(mb)) for mb in head] + rest == full
    fresh.set_epoch(1)
    assert len(list(fresh)) == len(full)


def test_elastic_resume_at_boundary_and_refused_mid_update(plan):
    s = PlanSampler(plan, rank=0, world_size=2)
    it = iter(s)
    for _ in range(4):  # two complete updates
        next(it)
    state = s.state_dict()
    assert state["at_update_boundary"] and state["update"] == 2
    one = PlanSampler(plan, rank=0, world_size=1, grad_accum=4)
    one.load_state_dict(state)
    rest = list(one)
    full = list(PlanSampler(plan, rank=0, world_size=1, grad_accum=4))
    assert [mb.index for mb in rest] == [mb.index for mb in full[8:]]
    next(it)
    with pytest.raises(PlanMismatchError, match="mid-update"):
        PlanSampler(plan, rank=0, world_size=1, grad_accum=4).load_state_dict(s.state_dict())


def test_invalid_state_and_foreign_plan_refused(plan, tmp_path):
    s = PlanSampler(plan, rank=0, world_size=2)
    it = iter(s)
    next(it)
    ckpt = checkpoint_state(s)  # mid-update without the accumulated gradients
    assert not ckpt["sampler"]["valid"] and "mid-update" in ckpt["sampler"]["invalid_reason"]
    with pytest.raises(PlanMismatchError, match="position is invalid"):
        restore_checkpoint_state(ckpt, PlanSampler(plan, rank=0, world_size=2))
    s.invalidate("loader restarted")
    with pytest.raises(PlanMismatchError, match="loader restarted"):
        PlanSampler(plan, rank=0, world_size=2).load_state_dict(s.state_dict())
    other = build_plan(tmp_path / "other", n=37, seed=5, mode="flattened", micro_batch_size=2, sequence_len=24,
                       world_size=2, grad_accum=2, epochs=2)
    with pytest.raises(PlanMismatchError, match="another plan: its config fingerprint"):
        PlanSampler(other, rank=0, world_size=2).load_state_dict(PlanSampler(plan, rank=0, world_size=2).state_dict())
    with pytest.raises(PlanMismatchError, match="not a plancc sampler state"):
        PlanSampler(plan, rank=0, world_size=2).load_state_dict({"epoch": 0})


# (world_size, grad_accum, full_updates) of the saving run; the resuming run is always (2, 2, False)
_SHAPES = [(2, 2, False), (1, 4, False), (2, 2, True), (4, 1, False)]


@given(shape=st.sampled_from(_SHAPES), data=st.data())
def test_a_position_that_contradicts_its_update_is_refused(plan, shape, data):
    """A state's position is checked against its update and micro-step on the plan's layout: an edited position
    (update and micro-step as saved) would resume at other microbatches, so it is refused; a consistent state of
    the same shape resumes where it says."""
    world, accum, full = shape
    saver = PlanSampler(plan, rank=world - 1, world_size=world, grad_accum=accum, full_updates=full)
    p = data.draw(st.integers(0, saver.epoch_length), label="position")
    q = data.draw(st.integers(0, saver.epoch_length + 3).filter(lambda q: q != p), label="edited position")
    state = {**saver.state_at(1, p), "position": q}
    with pytest.raises(PlanMismatchError, match=rf"position: {q} is (update|past)"):
        PlanSampler(plan, rank=1, world_size=2).load_state_dict(state)
    flipped = {**saver.state_at(1, p), "at_update_boundary": saver.locate(p, 1)[1] != 0}
    with pytest.raises(PlanMismatchError, match="at_update_boundary"):
        PlanSampler(plan, rank=1, world_size=2).load_state_dict(flipped)
    if shape == (2, 2, False):
        resumed = PlanSampler(plan, rank=1, world_size=2)
        resumed.load_state_dict(saver.state_at(1, p))
        assert (resumed.epoch, resumed.position) == (1, p)


def test_a_state_of_an_impossible_shape_is_refused(plan):
    state = PlanSampler(plan, rank=0, world_size=2).state_at(0, 4)
    with pytest.raises(PlanMismatchError, match=r"grad_accum: 2 ranks x 3 micro-steps cannot replay"):
        PlanSampler(plan, rank=0, world_size=2).load_state_dict({**state, "grad_accum": 3})
    with pytest.raises(PlanMismatchError, match=r"rank: 2 is not a rank of 2"):
        PlanSampler(plan, rank=0, world_size=1, grad_accum=4).load_state_dict({**state, "rank": 2})
    with pytest.raises(PlanMismatchError, match=r"plan_grad_accum: 4, the plan's is 2"):
        PlanSampler(plan, rank=0, world_size=2).load_state_dict({**state, "plan_grad_accum": 4})
    with pytest.raises(PlanMismatchError, match=r"epoch: 2 is not an epoch of the plan \(it has \[0, 1\]\)"):
        PlanSampler(plan, rank=0, world_size=2).load_state_dict({**state, "epoch": 2})


def test_dataset_change_is_an_error_unless_allowed(tmp_path):
    tok = make_tokenized(30, seed=3)
    a = build_plan(tmp_path / "a", tok=tok, **PACKED)
    ids = pa.array([[(t % 40) + 1 for t in row] for row in tok.column("input_ids").to_pylist()], pa.list_(pa.int32()))
    labels = [[-100 if lab == -100 else (t % 40) + 1 for t, lab in zip(r_ids, r_lab, strict=True)]
              for r_ids, r_lab in zip(tok.column("input_ids").to_pylist(), tok.column("labels").to_pylist(), strict=True)]
    tok2 = pa.table({"input_ids": ids, "labels": pa.array(labels, pa.list_(pa.int32()))})
    b = build_plan(tmp_path / "b", tok=tok2, **PACKED)  # same lengths and counts, other tokens
    state = PlanSampler(a).state_dict()
    with pytest.raises(PlanMismatchError, match="dataset fingerprint"):
        PlanSampler(b).load_state_dict(state)
    with pytest.warns(UserWarning, match="allow_dataset_change"):
        PlanSampler(b).load_state_dict(state, allow_dataset_change=True)
    with pytest.raises(PlanMismatchError, match="changed content"):
        load_tokens(a, data=tok2)
    with pytest.warns(UserWarning):
        load_tokens(a, data=tok2, allow_dataset_change=True)
    load_tokens(a, data=tok2, verify="counts")  # lengths and counts agree


def test_corrupt_or_foreign_plan_file(plan, tmp_path):
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(plan, bad)
    (bad / schemas.PLAN_FILE).write_bytes(b"not parquet")
    with pytest.raises(schemas.StoreError, match="not a readable Parquet"):
        PlanSampler(bad, rank=0, world_size=2)
    shutil.copyfile(plan / schemas.METRICS_FILE, bad / schemas.PLAN_FILE)
    with pytest.raises(PlanMismatchError, match="not a plan"):
        PlanSampler(bad, rank=0, world_size=2)


@pytest.mark.parametrize("workers", [0, 2])
def test_loader_state_tracks_the_training_loop_not_prefetch(plan, workers):
    tokens = load_tokens(plan)
    sampler = PlanSampler(plan, rank=0, world_size=2)
    loader = PlanDataLoader(PlanDataset(tokens, PlanCollator.from_plan(plan)), sampler, num_workers=workers,
                            prefetch_factor=4 if workers else None)
    positions = []
    for i, batch in enumerate(loader):
        positions.append(batch["plan"]["position"])
        if i == 2:
            assert loader.state_dict()["position"] == 3
            break
    assert positions == [0, 1, 2]
    full = [b["plan"]["index"] for b in PlanDataLoader(PlanDataset(tokens, PlanCollator.from_plan(plan)),
                                                       PlanSampler(plan, rank=0, world_size=2))]
    resumed = PlanSampler(plan, rank=0, world_size=2)
    resumed.load_state_dict(loader.state_dict())
    rest = [b["plan"]["index"] for b in PlanDataLoader(PlanDataset(tokens, PlanCollator.from_plan(plan)), resumed)]
    assert full[3:] == rest
    assert np.all(np.diff([i for i in full if i >= 0]) > 0)

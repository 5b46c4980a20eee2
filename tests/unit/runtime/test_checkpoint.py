"""Checkpoints on disk: a save interrupted at any point leaves the previous step usable and the resumed run exact
(final weights and Adam state bitwise equal); damaged files are skipped with a warning or refused clearly; ranks
whose newest steps differ fall back to the newest common step, or all refuse, on 2-rank gloo without hanging."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from benchmarks.synthetic import build_plan
from plancc.runtime import (
    CheckpointError,
    PlanCollator,
    PlanMismatchError,
    PlanSampler,
    load_checkpoint,
    load_tokens,
    model_inputs,
    save_checkpoint,
    token_loss,
)
from plancc.runtime.checkpoint import FAULT_POINTS, LATEST, agree_on_step, load_tensors, step_dir
from tests.support.training import tiny_model

EPOCHS = 2


class Killed(Exception):
    pass


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    plan = build_plan(tmp_path_factory.mktemp("ckpt"), n=20, data_seed=2, max_len=16, mode="packed",
                      micro_batch_size=2, sequence_len=16, grad_accum=4, epochs=EPOCHS)
    return plan, load_tokens(plan), PlanCollator.from_plan(plan)


def train(setup, ckpt_dir=None, *, resume=False, fault=None, keep=2, save_every=1):
    """Train EPOCHS epochs saving every `save_every` steps; returns (model, optimizer, step resumed from)."""
    plan, tokens, collator = setup
    model = tiny_model(seed=1)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sampler = PlanSampler(plan)
    step = resumed_from = 0
    if resume:
        r = load_checkpoint(ckpt_dir, sampler=sampler, model=model)
        model.load_state_dict(r.state["model"])
        opt.load_state_dict(r.state["optim"])
        step = resumed_from = r.step
    kw = {} if fault is None else {"fault": fault}
    for epoch in range(sampler.epoch, EPOCHS):
        sampler.set_epoch(epoch)
        for mb in sampler:
            batch = collator(mb, tokens)
            token_loss(model(**model_inputs(batch)).logits, batch["shift_labels"],
                       batch["num_items_in_batch"]).backward()
            if mb.last_in_update:
                opt.step()
                opt.zero_grad(set_to_none=True)
                step += 1
                if ckpt_dir is not None and step % save_every == 0:
                    save_checkpoint(ckpt_dir, step, {"model": model.state_dict(), "optim": opt.state_dict()},
                                    sampler=sampler, model=model, keep=keep, **kw)
    return model, opt, resumed_from


def assert_bitwise_equal(a, b):
    ma, oa, _ = a
    mb, ob, _ = b
    for (name, x), y in zip(ma.state_dict().items(), mb.state_dict().values(), strict=True):
        assert torch.equal(x, y), name
    sa, sb = oa.state_dict()["state"], ob.state_dict()["state"]
    assert sa.keys() == sb.keys()
    for k in sa:
        for n in ("step", "exp_avg", "exp_avg_sq"):
            assert torch.equal(sa[k][n], sb[k][n]), (k, n)


@pytest.fixture(scope="module")
def reference(setup):
    return train(setup)


def fault_at(point, step):
    def fault(p, s, rank):
        if (p, s) == (point, step):
            raise Killed(p)
    return fault


@pytest.mark.parametrize("point", FAULT_POINTS)
def test_save_interrupted_at_each_point_resumes_exactly(setup, reference, tmp_path, point):
    with pytest.raises(Killed):
        train(setup, tmp_path, fault=fault_at(point, 3))
    assert not list(tmp_path.rglob("*.tmp-*"))  # an error (not a kill) cleans its temporary file up
    # before `latest` moves, step 2 is the checkpoint; after, step 3 is
    want = 3 if point == "saved" else 2
    assert json.loads((tmp_path / LATEST).read_text())["step"] == want
    resumed = train(setup, tmp_path, resume=True)
    assert resumed[2] == want
    assert_bitwise_equal(resumed, reference)
    final = json.loads((tmp_path / LATEST).read_text())["step"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [LATEST, step_dir(tmp_path, final - 1).name,
                                                          step_dir(tmp_path, final).name]  # keep=2


def test_damaged_files_are_skipped_or_refused_clearly(setup, reference, tmp_path):
    train(setup, tmp_path, keep=3)
    steps = sorted(int(p.name.split("-")[1]) for p in tmp_path.glob("step-*"))
    assert len(steps) == 3
    newest = step_dir(tmp_path, steps[-1]) / "rank0.pt"
    data = newest.read_bytes()
    newest.write_bytes(data[: len(data) // 2])  # truncated
    with pytest.raises(CheckpointError, match="truncated or damaged"):
        load_tensors(newest)
    with pytest.warns(UserWarning, match=r"rank0.pt is truncated or damaged \(\d+ bytes, \d+ saved\)"):
        model, opt, step = train(setup, tmp_path, resume=True, save_every=10**6)
    assert step == steps[-2]
    assert_bitwise_equal((model, opt, step), reference)

    mid = step_dir(tmp_path, steps[-2]) / "rank0.pt"
    flipped = bytearray(mid.read_bytes())
    flipped[len(flipped) // 2] ^= 0xFF  # same size, other bytes
    mid.write_bytes(bytes(flipped))
    (tmp_path / LATEST).write_text("{not json")
    with pytest.warns(UserWarning) as record:
        assert train(setup, tmp_path, resume=True, save_every=10**6)[2] == steps[0]
    text = " ".join(str(w.message) for w in record)
    assert f"{LATEST} is unreadable" in text and "sha256 differs" in text

    (step_dir(tmp_path, steps[0]) / "rank0.json").unlink()
    with pytest.raises(CheckpointError, match=r"no checkpoint in .* to resume from: rank 0: .*rank0.json is missing"), \
            pytest.warns(UserWarning, match=f"{LATEST} is unreadable"):
        train(setup, tmp_path, resume=True)


def test_agree_on_step():
    assert agree_on_step([[4, 2], [4, 2]]) == (4, None)
    step, why = agree_on_step([[70, 68], [68, 66]])
    assert step == 68 and "rank 0: step 70, rank 1: step 68" in why
    step, why = agree_on_step([[70], [68]])
    assert step is None and "rank 0: step 70, rank 1: step 68" in why and "no step is complete on every rank" in why
    assert agree_on_step([[], [2]])[0] is None
    assert agree_on_step([[]])[0] is None


# ---------------------------------------------------------------- 2 ranks (gloo): ranks that disagree


def _resume(ckpt: str, sampler: PlanSampler, model) -> dict:
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            out = {"step": load_checkpoint(ckpt, sampler=sampler, model=model).step}
        except CheckpointError as e:
            out = {"error": str(e)}
    return {**out, "warnings": [str(w.message) for w in caught]}


def _in_group(rank: int, scenario, plan: str, ckpt: str, store: str, out: str) -> None:
    """mp.spawn's target: `scenario(rank, plan, ckpt, out, results)` inside a 2-rank gloo group, then this rank's
    results written to `out/rank<r>.json`."""
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    torch.set_num_threads(1)
    results: dict = {}
    try:
        scenario(rank, plan, ckpt, out, results)
    finally:
        dist.destroy_process_group()
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(results, f)


def _rank_worker(rank: int, plan: str, ckpt: str, out: str, results: dict) -> None:
    """Save steps 2 and 4 on both ranks, then resume three times, damaging files in between (rank 0 does)."""
    sampler = PlanSampler(plan)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 4)
    for step in (2, 4):
        save_checkpoint(ckpt, step, {"model": model.state_dict()}, sampler=sampler, keep=3)
    results["agree"] = _resume(ckpt, sampler, model)
    dist.barrier()
    if rank == 0:  # rank 1's step 4 never finished (a kill between the ranks' saves; `latest` still at 4)
        (step_dir(ckpt, 4) / "rank1.json").unlink()
    dist.barrier()
    results["fallback"] = _resume(ckpt, sampler, model)
    dist.barrier()
    if rank == 0:  # rank 0's step 2 damaged (same size): found only when loading it, after the ranks agreed
        pt = step_dir(ckpt, 2) / "rank0.pt"
        data = bytearray(pt.read_bytes())
        data[-100] ^= 0xFF
        pt.write_bytes(bytes(data))
    dist.barrier()
    results["damaged"] = _resume(ckpt, sampler, model)
    dist.barrier()
    if rank == 0:  # and rank 0's step 2 is gone: no step in common
        (step_dir(ckpt, 2) / "rank0.pt").unlink()
    dist.barrier()
    results["refuse"] = _resume(ckpt, sampler, model)
    dist.barrier()


def _two_ranks(worker, tmp_path: Path, n: int) -> list[dict]:
    """Run `worker` on 2 gloo ranks over a small plan (failing the test if they hang); each rank's results."""
    plan = build_plan(tmp_path / "p", n=n, data_seed=1, max_len=16, mode="packed", micro_batch_size=2,
                      sequence_len=16, world_size=2, grad_accum=2)
    ctx = mp.spawn(_in_group, args=(worker, str(plan), str(tmp_path / "ckpt"), str(tmp_path / "store"),
                                    str(tmp_path)), nprocs=2, join=False)
    deadline = time.monotonic() + 240
    while not ctx.join(timeout=5):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            pytest.fail("the ranks hung")
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]


@pytest.mark.slow  # a 2-rank gloo process group
def test_two_ranks_with_different_steps_fall_back_or_refuse(tmp_path):
    results = _two_ranks(_rank_worker, tmp_path, n=24)
    for r in results:
        assert r["agree"] == {"step": 4, "warnings": []}
        assert r["fallback"]["step"] == 2
        assert any("rank 0: step 4, rank 1: step 2" in w and "every rank resumes from step 2" in w
                   for w in r["fallback"]["warnings"]), r
        assert "step" not in r["damaged"] and "step" not in r["refuse"], r  # both ranks refuse, neither waits
    assert "rank0.pt is damaged (its sha256 differs" in results[0]["damaged"]["error"]
    assert "rank(s) [0] could not resume from step 2" in results[1]["damaged"]["error"]
    for r in results:
        assert "rank 0: step 4, rank 1: step 2" in r["refuse"]["error"]
        assert "no step is complete on every rank" in r["refuse"]["error"]


# ---------------------------------------------------------------- malformed and hostile files


class _RunsCode:
    """Unpickling this would run `touch <marker>`."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _one_step(setup, directory, *, rank=0, world_size=1):
    """A checkpoint of step 1 (the sampler at the first update boundary): no older step to fall back to."""
    plan = setup[0]
    sampler = PlanSampler(plan, rank=rank, world_size=world_size, grad_accum=4 // world_size)
    for mb in sampler:
        if mb.last_in_update:
            break
    torch.manual_seed(0)
    save_checkpoint(directory, 1, {"model": torch.nn.Linear(2, 2).state_dict()}, sampler=sampler)
    return step_dir(directory, 1)


def _edit(path, change, *, reseal=True):
    """Apply `change` to a checkpoint JSON file; `reseal` recomputes its checksum (a careful hand edit)."""
    from plancc.runtime.checkpoint import write_sealed_json

    meta = json.loads(path.read_text())
    change(meta)
    if reseal:
        meta.pop("checksum", None)
        write_sealed_json(path, meta)
    else:
        path.write_text(json.dumps(meta))


def _refused(setup, directory, match):
    with pytest.raises(CheckpointError, match=match):
        load_checkpoint(directory, sampler=PlanSampler(setup[0]))


@pytest.mark.parametrize(("change", "match"), [
    (lambda m: m.pop("tensors"), r"rank0.json: tensors: missing"),
    (lambda m: m["sampler"].pop("fingerprints"), r"rank0.json: sampler.fingerprints: missing"),
    (lambda m: m["sampler"].update(epoch="x"), r"rank0.json: sampler.epoch: 'x' is not an integer"),
    (lambda m: m["sampler"].update(position=-1), r"rank0.json: sampler.position: -1 is not a count"),
    (lambda m: m.update(step="1"), r"rank0.json: step: '1' is not step 1"),
    (lambda m: m["tensors"].update(file="../../../outside.pt"), r"rank0.json: tensors.file: '../../../outside.pt'"),
    (lambda m: m["tensors"].update(file="/etc/passwd"), r"rank0.json: tensors.file: '/etc/passwd' is not rank0.pt"),
    (lambda m: m.update(sampler=[]), r"rank0.json: sampler: \[\] is not dict"),
])
def test_a_malformed_checkpoint_file_is_refused_naming_the_file_and_field(setup, tmp_path, change, match):
    _edit(_one_step(setup, tmp_path) / "rank0.json", change)
    _refused(setup, tmp_path, match)


def test_an_edited_position_is_found_by_the_checksum(setup, tmp_path):
    """Moving the position back (4 -> 1) would replay 3 microbatches: the file no longer matches its checksum."""
    d = _one_step(setup, tmp_path)
    assert json.loads((d / "rank0.json").read_text())["sampler"]["position"] == 4
    _edit(d / "rank0.json", lambda m: m["sampler"].update(position=1), reseal=False)
    _refused(setup, tmp_path, r"rank0.json: checksum: its content does not match it")
    _edit(d / "rank0.json", lambda m: m.pop("checksum"), reseal=False)
    _refused(setup, tmp_path, r"rank0.json: checksum: missing")


@pytest.mark.parametrize("position", [1, 5, 17])
def test_a_resealed_position_edit_is_refused(setup, tmp_path, position):
    """A careful edit (checksum recomputed) of the position alone, update and micro-step as saved, would replay or
    skip microbatches: the position no longer matches them on the plan's layout, and the step is refused."""
    d = _one_step(setup, tmp_path)
    assert {k: json.loads((d / "rank0.json").read_text())["sampler"][k] for k in ("position", "update", "micro_step")} \
        == {"position": 4, "update": 1, "micro_step": 0}
    _edit(d / "rank0.json", lambda m: m["sampler"].update(position=position))
    _refused(setup, tmp_path, rf"rank0.json: sampler.position: {position} is (update|past the end)")


def test_another_ranks_state_is_refused(setup, tmp_path):
    """Rank 3's files of a 4-rank save copied over rank 0's: rank 0 refuses them."""
    for rank in (3, 0):
        d = _one_step(setup, tmp_path, rank=rank, world_size=4)
    (d / "rank0.json").write_bytes((d / "rank3.json").read_bytes())
    (d / "rank0.pt").write_bytes((d / "rank3.pt").read_bytes())
    with pytest.raises(CheckpointError, match=r"rank0.json: rank: 3 is not rank 0"):
        load_checkpoint(tmp_path, sampler=PlanSampler(setup[0], rank=0, world_size=4, grad_accum=1))
    # the sampler too refuses another rank's state of the same shape, wherever it comes from
    state = PlanSampler(setup[0], rank=3, world_size=4, grad_accum=1).state_dict()
    with pytest.raises(PlanMismatchError, match="rank 3's; this is rank 0"):
        PlanSampler(setup[0], rank=0, world_size=4, grad_accum=1).load_state_dict(state)


def test_a_pickle_that_runs_code_is_refused_never_run(setup, tmp_path):
    import hashlib
    import pickle

    d = _one_step(setup, tmp_path)
    marker = tmp_path / "ran"
    evil = pickle.dumps({"state": _RunsCode(marker), "grads": None})
    (d / "rank0.pt").write_bytes(evil)
    _edit(d / "rank0.json", lambda m: m["tensors"].update(bytes=len(evil), sha256=hashlib.sha256(evil).hexdigest()))
    _refused(setup, tmp_path, r"rank0.pt: not a readable tensor checkpoint")
    assert not marker.exists()
    tensors = {"not": torch.zeros(1)}  # loadable tensors, not a checkpoint's
    torch.save(tensors, d / "rank0.pt")
    data = (d / "rank0.pt").read_bytes()
    _edit(d / "rank0.json", lambda m: m["tensors"].update(bytes=len(data), sha256=hashlib.sha256(data).hexdigest()))
    _refused(setup, tmp_path, r"rank0.pt: not a plancc checkpoint's tensors")


def _hostile_worker(rank: int, plan: str, ckpt: str, out: str, results: dict) -> None:
    """One step saved on both ranks; rank 0's files then made malformed, then hostile: every rank must refuse."""
    import hashlib
    import pickle

    sampler = PlanSampler(plan)
    model = torch.nn.Linear(2, 2)
    save_checkpoint(ckpt, 1, {"model": model.state_dict()}, sampler=sampler)
    d = step_dir(ckpt, 1)
    dist.barrier()
    if rank == 0:
        _edit(d / "rank0.json", lambda m: m["sampler"].update(epoch="x"))
    dist.barrier()
    results["malformed"] = _resume(ckpt, sampler, model)
    dist.barrier()
    if rank == 0:
        evil = pickle.dumps({"state": _RunsCode(os.path.join(out, "ran")), "grads": None})
        (d / "rank0.pt").write_bytes(evil)
        _edit(d / "rank0.json", lambda m: (m["sampler"].update(epoch=0), m["tensors"].update(
            bytes=len(evil), sha256=hashlib.sha256(evil).hexdigest())))
    dist.barrier()
    results["pickle"] = _resume(ckpt, sampler, model)
    dist.barrier()


@pytest.mark.slow  # a 2-rank gloo process group
def test_two_ranks_both_refuse_malformed_and_hostile_files(tmp_path):
    r0, r1 = _two_ranks(_hostile_worker, tmp_path, n=16)
    assert "rank0.json: sampler.epoch: 'x' is not an integer" in r0["malformed"]["error"]
    assert "no step is complete on every rank" in r1["malformed"]["error"]
    assert "rank 1: complete here: step 1" in r1["malformed"]["error"]  # what is true on rank 1: its step is whole
    assert "rank0.pt: not a readable tensor checkpoint" in r0["pickle"]["error"]
    assert "rank(s) [0] could not resume from step 1" in r1["pickle"]["error"]
    assert not (tmp_path / "ran").exists()


def _resume_fresh(plan: str, ckpt: str) -> dict:
    """`_resume` with a new sampler, and where that sampler stands afterwards (untouched when refused)."""
    sampler = PlanSampler(plan)
    return {**_resume(ckpt, sampler, None), "at": [sampler.epoch, sampler.position]}


def _position_worker(rank: int, plan: str, ckpt: str, out: str, results: dict) -> None:
    """Steps 1 and 2 saved on both ranks (positions 2 and 4), then rank 1's sampler positions edited and resealed."""
    sampler = PlanSampler(plan)  # 2 ranks x 2 micro-steps: an update is 2 positions on each rank
    it = iter(sampler)
    for step in (1, 2):
        next(it), next(it)
        save_checkpoint(ckpt, step, {"model": torch.nn.Linear(2, 2).state_dict()}, sampler=sampler, keep=3)
    newest = step_dir(ckpt, 2) / "rank1.json"
    saved = newest.read_bytes()
    dist.barrier()
    if rank == 0:  # rank 1's step 2 moved back, update and micro-step as saved
        _edit(newest, lambda m: m["sampler"].update(position=2))
    dist.barrier()
    results["edited"] = _resume_fresh(plan, ckpt)
    dist.barrier()
    if rank == 0:  # and its step 1 moved forward: no step left in common
        _edit(step_dir(ckpt, 1) / "rank1.json", lambda m: m["sampler"].update(position=3))
    dist.barrier()
    results["none_left"] = _resume_fresh(plan, ckpt)
    dist.barrier()
    if rank == 0:  # rank 1's step 2 moved back a whole update, consistently (position 2 is update 1)
        newest.write_bytes(saved)
        _edit(newest, lambda m: m["sampler"].update(position=2, update=1))
    dist.barrier()
    results["out_of_step"] = _resume_fresh(plan, ckpt)
    dist.barrier()


@pytest.mark.slow  # a 2-rank gloo process group
def test_two_ranks_refuse_edited_positions_together(tmp_path):
    """An edited, resealed sampler position never resumes: alone it contradicts its update (the step is skipped
    like a damaged one); moved with its update it puts the ranks out of step, and every rank refuses."""
    results = _two_ranks(_position_worker, tmp_path, n=24)
    for r in results:
        assert r["edited"]["step"] == 1 and r["edited"]["at"] == [0, 2], r
        assert any("rank 0: step 2, rank 1: step 1" in w for w in r["edited"]["warnings"]), r
        assert "no step is complete on every rank" in r["none_left"]["error"], r
        assert "step" not in r["out_of_step"] and r["out_of_step"]["at"] == [0, 0], r  # refused, sampler untouched
        assert ("the ranks' sampler states are out of step (rank 0: epoch 0, position 4, update 2, micro-step 0; "
                "rank 1: epoch 0, position 2, update 1, micro-step 0)") in r["out_of_step"]["error"], r
    r0, r1 = results
    assert any("rank1.json: sampler.position: 2 is update 1, micro-step 0" in w for w in r1["edited"]["warnings"])
    # each rank says what is true on it: rank 0's steps are whole, rank 1's are edited
    assert "rank 0: complete here: step 2, step 1" in r0["none_left"]["error"]
    assert "no complete step" not in r0["none_left"]["error"]
    assert "step-00000001/rank1.json: sampler.position: 3 is update 1, micro-step 1" in r1["none_left"]["error"]

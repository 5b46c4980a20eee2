"""Hugging Face Trainer integration: same gradients as the plain loop, exact resume from a Trainer checkpoint."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from transformers import TrainerCallback, TrainingArguments

from benchmarks.synthetic import build_plan
from plancc.runtime import PlanMismatchError, PlanSampler
from plancc.runtime.checkpoint import write_sealed_json
from plancc.runtime.hf import STATE_FILE, PlanTrainer
from tests.support.training import build_uneven_plan, grads_of, plain_loop_grads, rel_err, tiny_model

pytestmark = pytest.mark.slow  # trains Hugging Face Trainers, some in 2-rank process groups

LR = 0.5


class GradRecorder(TrainerCallback):
    def __init__(self):
        self.grads = []

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        self.grads.append(grads_of(model))


def args_for(out, **kw):
    base = dict(output_dir=str(out), use_cpu=True, per_device_train_batch_size=1, gradient_accumulation_steps=2,
                learning_rate=LR, optim="sgd", lr_scheduler_type="constant", max_grad_norm=0.0, weight_decay=0.0,
                report_to=[], save_strategy="no", logging_steps=1, disable_tqdm=True, seed=0,
                dataloader_num_workers=0, num_train_epochs=1)
    base.update(kw)
    return TrainingArguments(**base)


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    # flattened: every epoch has the same number of microbatches (6 -> 3 updates of G=2)
    return build_plan(tmp_path_factory.mktemp("hf"), n=12, data_seed=4, max_len=16, mode="flattened",
                      micro_batch_size=2, sequence_len=16, grad_accum=2, epochs=2)


def test_trainer_two_steps_equal_plain_loop(plan, tmp_path):
    rec = GradRecorder()
    model = tiny_model(seed=3)
    trainer = PlanTrainer(model=model, args=args_for(tmp_path, max_steps=2), plan=plan, callbacks=[rec])
    trainer.train()
    ref, ref_model = plain_loop_grads(plan, tiny_model(seed=3), LR, 2)
    assert len(rec.grads) == 2
    for got, want in zip(rec.grads, ref, strict=True):
        assert max(rel_err(got[k], want[k]) for k in want) < 1e-5
    for (name, a), b in zip(model.named_parameters(), ref_model.parameters(), strict=True):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-7), name


def test_trainer_resume_from_checkpoint_is_exact(plan, tmp_path):
    full = tiny_model(seed=3)
    PlanTrainer(model=full, args=args_for(tmp_path / "full", num_train_epochs=2), plan=plan).train()

    out = tmp_path / "run"
    first = tiny_model(seed=3)
    PlanTrainer(model=first, args=args_for(out, max_steps=4, save_strategy="steps", save_steps=4,
                                           num_train_epochs=2), plan=plan).train()
    ckpt = out / "checkpoint-4"
    state = json.loads((ckpt / STATE_FILE).read_text())
    assert (state["epoch"], state["update"], state["valid"]) == (1, 1, True)  # mid-epoch 1

    resumed = tiny_model(seed=99)  # weights come from the checkpoint
    PlanTrainer(model=resumed, args=args_for(out, num_train_epochs=2), plan=plan).train(resume_from_checkpoint=str(ckpt))
    for (name, a), b in zip(full.named_parameters(), resumed.parameters(), strict=True):
        assert torch.allclose(a, b, rtol=1e-6, atol=1e-8), name

    # a checkpoint without the plan state, or from another plan, is refused with a clear message
    bare = tmp_path / "bare"
    shutil.copytree(ckpt, bare)
    (bare / STATE_FILE).unlink()
    with pytest.raises(PlanMismatchError, match="not saved by PlanTrainer"):
        PlanTrainer(model=tiny_model(), args=args_for(out, num_train_epochs=2), plan=plan).train(
            resume_from_checkpoint=str(bare))
    # an edited state (its position moved back a microbatch) fails its checksum: never resumed silently
    edited = {**state, "position": state["position"] - 1}
    (bare / STATE_FILE).write_text(json.dumps(edited))
    with pytest.raises(PlanMismatchError, match=r"rank 0: unreadable, edited or damaged"):
        PlanTrainer(model=tiny_model(), args=args_for(out, num_train_epochs=2), plan=plan).train(
            resume_from_checkpoint=str(bare))
    state["fingerprints"]["config"] = "0" * 32
    write_sealed_json(bare / STATE_FILE, {k: v for k, v in state.items() if k != "checksum"})
    with pytest.raises(PlanMismatchError, match="another plan"):
        PlanTrainer(model=tiny_model(), args=args_for(out, num_train_epochs=2), plan=plan).train(
            resume_from_checkpoint=str(bare))


def test_trainer_refuses_wrong_accumulation(plan, tmp_path):
    with pytest.raises(PlanMismatchError, match="gradient_accumulation_steps=2"):
        PlanTrainer(model=tiny_model(), args=args_for(tmp_path, gradient_accumulation_steps=3), plan=plan)


def test_trainer_resume_skips_a_checkpoint_whose_save_did_not_finish(plan, tmp_path):
    full = tiny_model(seed=3)
    PlanTrainer(model=full, args=args_for(tmp_path / "full", num_train_epochs=2), plan=plan).train()
    out = tmp_path / "run"
    PlanTrainer(model=tiny_model(seed=3), args=args_for(out, max_steps=4, save_strategy="steps", save_steps=2,
                                                        save_total_limit=2, num_train_epochs=2), plan=plan).train()
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint-2", "checkpoint-4"]
    # what a kill after the Trainer's own files and before the plan state leaves: checkpoint-4 is unfinished
    (out / "checkpoint-4" / STATE_FILE).unlink()
    with pytest.raises(PlanMismatchError, match=r"lacks a plancc sampler state \(rank 0: no state\)"):
        PlanTrainer(model=tiny_model(), args=args_for(out, num_train_epochs=2), plan=plan).train(
            resume_from_checkpoint=str(out / "checkpoint-4"))
    resumed = tiny_model(seed=99)
    with pytest.warns(UserWarning, match="resuming from checkpoint-2: skipped checkpoint-4"):
        PlanTrainer(model=resumed, args=args_for(out, num_train_epochs=2), plan=plan).train(
            resume_from_checkpoint=True)
    for (name, a), b in zip(full.named_parameters(), resumed.parameters(), strict=True):
        assert torch.allclose(a, b, rtol=1e-6, atol=1e-8), name


# ---------------------------------------------------------------- 2 ranks (gloo, spawned)


def _hf_worker(rank: int, plan: str, root: str, port: int, phase: str) -> None:
    import os
    import warnings

    from safetensors.torch import load_file

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE="2")
    torch.set_num_threads(1)
    kw = dict(max_steps=4, save_strategy="steps", save_steps=2, save_total_limit=1, ddp_backend="gloo",
              gradient_accumulation_steps=1)
    if phase == "train":
        PlanTrainer(model=tiny_model(seed=3), args=args_for(f"{root}/full", **kw), plan=plan).train()
        os.environ["PLANCC_FAULT"] = "tensors_written@step=4,rank=1"  # rank 1 dies in the save of step 4
        PlanTrainer(model=tiny_model(seed=3), args=args_for(f"{root}/run", **kw), plan=plan).train()
        return
    trainer = PlanTrainer(model=tiny_model(seed=99), args=args_for(f"{root}/run", **kw), plan=plan)
    result = {"kept": sorted(os.listdir(f"{root}/run"))}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.train(resume_from_checkpoint=True)
    result["warnings"] = [str(w.message) for w in caught if "skipped" in str(w.message)]
    want, got = (load_file(f"{root}/{d}/checkpoint-4/model.safetensors") for d in ("full", "run"))
    result["equal"] = all(torch.equal(want[k], got[k]) for k in want)
    # rank 1's state names another step than rank 0's: both ranks refuse the checkpoint
    torch.distributed.barrier()
    if rank == 1:
        path = Path(root) / "run" / "checkpoint-4" / "plancc_sampler.rank1.json"
        saved = {k: v for k, v in json.loads(path.read_text()).items() if k != "checksum"}
        write_sealed_json(path, {**saved, "global_step": 2})
    torch.distributed.barrier()
    try:
        trainer.check_checkpoint(f"{root}/run/checkpoint-4")
    except PlanMismatchError as e:
        result["refused"] = str(e)
    with open(f"{root}/rank{rank}.json", "w") as f:
        json.dump(result, f)


def test_two_rank_trainer_killed_mid_save_resumes_exactly_and_refuses_disagreeing_ranks(tmp_path):
    import socket
    import time

    import torch.multiprocessing as mp

    plan = build_plan(tmp_path / "p", n=40, data_seed=4, max_len=16, mode="flattened", micro_batch_size=2,
                      sequence_len=16, world_size=2, grad_accum=1)

    def spawn(phase):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        ctx = mp.spawn(_hf_worker, args=(str(plan), str(tmp_path), port, phase), nprocs=2, join=False)
        deadline = time.monotonic() + 300
        try:
            while not ctx.join(timeout=5):
                assert time.monotonic() < deadline, f"{phase}: the ranks hung"
        except mp.ProcessExitedException as e:
            return e.exit_code
        finally:
            for p in ctx.processes:
                p.kill()
        return 0

    assert spawn("train") == -9  # rank 1 SIGKILLed itself; mp.spawn ended rank 0 (waiting at the barrier)
    assert not (tmp_path / "run" / "checkpoint-4" / "plancc_sampler.rank1.json").exists()
    spawn("resume")
    for rank in (0, 1):
        r = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert r["kept"] == ["checkpoint-2", "checkpoint-4"]  # save_total_limit=1 kept the last complete one
        assert r["warnings"] and "resuming from checkpoint-2: skipped checkpoint-4" in r["warnings"][0]
        assert r["equal"]
        assert "the ranks' sampler states disagree (rank 0: step 4, rank 1: step 2)" in r["refused"]


# ---------------------------------------------------------------- epochs of different lengths, --drop-last on/off


@pytest.fixture(scope="module", params=[False, True], ids=["keep_last", "drop_last"])
def uneven(request, tmp_path_factory):
    """Three epochs of 5, 10 and 6 microbatches (4, 8, 6 with --drop-last), W=1 x G=2: tails and unequal epochs."""
    root = tmp_path_factory.mktemp("uneven")
    plan = build_uneven_plan(root / "p", grad_accum=2, drop_last=request.param)
    rec = GradRecorder()
    model = tiny_model(seed=3)
    trainer = PlanTrainer(model=model, args=args_for(root / "full", num_train_epochs=3), plan=plan, callbacks=[rec])
    trainer.train()
    assert trainer.state.epoch == 3.0  # the plan's epochs, though the Trainer ran them as one stream
    return plan, rec.grads, model, root


def test_trainer_trains_unequal_epochs_like_the_plain_loop(uneven):
    plan, grads, model, _ = uneven
    lengths = PlanSampler(plan).epoch_lengths()
    assert len(set(lengths)) == 3
    ref, ref_model = plain_loop_grads(plan, tiny_model(seed=3), LR)
    assert len(grads) == len(ref) == sum(-(-n // 2) for n in lengths)
    for got, want in zip(grads, ref, strict=True):
        assert max(rel_err(got[k], want[k]) for k in want) < 1e-5
    for (name, a), b in zip(model.named_parameters(), ref_model.parameters(), strict=True):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-7), name


@pytest.mark.parametrize("where", ["epoch_boundary", "across_epoch_boundary"])
def test_trainer_resume_at_and_across_epoch_boundary_is_bit_identical(uneven, where):
    plan, _, full, root = uneven
    first_epoch = PlanSampler(plan).updates_per_epoch(0)
    step = first_epoch + (where == "across_epoch_boundary")
    out = root / where
    PlanTrainer(model=tiny_model(seed=3), plan=plan, args=args_for(
        out, max_steps=step, save_strategy="steps", save_steps=step)).train()
    ckpt = out / f"checkpoint-{step}"
    state = json.loads((ckpt / STATE_FILE).read_text())
    assert (state["epoch"], state["update"], state["valid"]) == (1, step - first_epoch, True)
    resumed = tiny_model(seed=99)  # weights come from the checkpoint
    PlanTrainer(model=resumed, args=args_for(out, num_train_epochs=3), plan=plan).train(
        resume_from_checkpoint=str(ckpt))
    for (name, a), b in zip(full.named_parameters(), resumed.parameters(), strict=True):
        assert torch.equal(a, b), name


def test_trainer_refuses_more_epochs_than_the_plan(uneven, tmp_path):
    plan = uneven[0]
    for kw in (dict(num_train_epochs=4), dict(num_train_epochs=1.5), dict(max_steps=10_000)):
        with pytest.raises(PlanMismatchError, match="epochs"):
            PlanTrainer(model=tiny_model(), args=args_for(tmp_path, **kw), plan=plan).train()

"""Evaluation over a plan's eval plan: the loss is the exact token mean over every held-out target, on one process
and on 2 DDP ranks (gloo, fp32, a tiny Llama), through the plain-loop helper, `PlanTrainer` and `PlanSFTTrainer`,
during training (`eval_strategy`) and after a resume. The reference runs each held-out sample alone through the
model and divides the summed CE by the summed target count; the mean of per-batch means is shown to differ."""

from __future__ import annotations

import json
import shutil
import socket
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from transformers import TrainerCallback

from benchmarks.synthetic import build_plan
from plancc.runtime import (
    PlanCollator,
    PlanEvalSampler,
    PlanMismatchError,
    evaluate_plan,
    load_tokens,
    model_inputs,
    verified_plan,
)
from plancc.runtime.hf import PlanTrainer
from tests.runtime.test_hf import args_for
from tests.support.plans import swap_eval_for_training
from tests.support.training import tiny_model

pytestmark = pytest.mark.slow  # Hugging Face Trainers and 2-rank process groups

RTOL = 1e-6


@pytest.fixture(scope="module")
def plan(tmp_path_factory) -> Path:
    # packed rows of 32 tokens hold 1..several samples of 3..24 tokens: eval microbatches of very unequal targets
    return build_plan(tmp_path_factory.mktemp("eval"), n=80, data_seed=6, max_len=24, mode="packed",
                      sequence_len=32, world_size=2, grad_accum=1, val_set_size=0.3)


def eval_ids(plan) -> np.ndarray:
    return verified_plan(plan).eval().sample_ids


def reference_loss(model, plan) -> float:
    """Each held-out sample on its own (no packing, no plan): sum of CE over all its targets / all targets."""
    tokens = load_tokens(plan)
    total, count = 0.0, 0
    model.eval()
    with torch.no_grad():
        for sid in eval_ids(plan).tolist():
            a, b = int(tokens.offsets[sid]), int(tokens.offsets[sid + 1])
            x = torch.from_numpy(tokens.input_ids[a:b].astype(np.int64))[None]
            y = torch.from_numpy(tokens.targets[a:b].astype(np.int64))
            logits = model(input_ids=x).logits[0].double()
            total += float(F.cross_entropy(logits[:-1], y[1:], ignore_index=-100, reduction="sum"))
            count += int((y[1:] != -100).sum())
    assert count == verified_plan(plan).eval().total_label_count
    return total / count


def naive_loss(model, plan) -> float:
    """The mean over eval microbatches of each one's mean CE: what a per-batch-mean eval loop reports."""
    tokens, collator = load_tokens(plan), PlanCollator.from_plan(plan)
    means = []
    with torch.no_grad():
        for mb in PlanEvalSampler(plan, rank=0, world_size=1):
            batch = collator(mb, tokens)
            logits = model(**model_inputs(batch)).logits
            means.append(float(F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch["shift_labels"].reshape(-1),
                                               ignore_index=-100)))
    return float(np.mean(means))


def rel(a: float, b: float) -> float:
    return abs(a - b) / abs(b)


def test_one_process_eval_loss_is_the_exact_token_mean(plan):
    model = tiny_model(seed=7, layers=2, hidden=32)
    want = reference_loss(model, plan)
    result = evaluate_plan(model, plan, rank=0, world_size=1)
    assert result.targets == verified_plan(plan).eval().total_label_count
    assert rel(result.loss, want) < RTOL
    assert rel(naive_loss(model, plan), want) > 1e-3  # the per-batch mean is a different number


def test_eval_sampler_covers_every_eval_sample_once_for_any_world_size(plan):
    ids = np.sort(eval_ids(plan))
    for world in (1, 2, 3, 5):
        shares = [list(PlanEvalSampler(plan, rank=r, world_size=world)) for r in range(world)]
        assert len({len(s) for s in shares}) == 1  # lockstep: placeholders where a rank runs short
        seen = np.sort(np.concatenate([np.asarray(mb, dtype=np.int64) for s in shares for mb in s]))
        np.testing.assert_array_equal(seen, ids)
        placeholders = [mb for s in shares for mb in s if mb.placeholder]
        assert all(mb.label_count == 0 for mb in placeholders)
        assert all(mb.num_items == verified_plan(plan).eval().total_label_count for s in shares for mb in s)


def test_plan_without_eval_plan_is_refused_saying_how_to_compile_one(tmp_path):
    plain = build_plan(tmp_path, n=20, mode="packed", sequence_len=32)
    with pytest.raises(PlanMismatchError, match="--val-set-size"):
        evaluate_plan(tiny_model(), plain)
    with pytest.raises(PlanMismatchError, match="--val-set-size"):
        PlanTrainer(model=tiny_model(), args=args_for(tmp_path / "o", eval_strategy="steps", eval_steps=1,
                                                      gradient_accumulation_steps=1), plan=plain)


# ---------------------------------------------------------------- PlanTrainer


class EvalRecorder(TrainerCallback):
    """At each evaluation: the logged loss and the reference of the model as it is then."""

    def __init__(self, plan):
        self.plan, self.seen = plan, []

    def on_evaluate(self, args, state, control, model=None, metrics=None, **kwargs):
        was = model.training
        self.seen.append((state.global_step, metrics["eval_loss"], reference_loss(model, self.plan)))
        model.train(was)


def trainer_args(out, **kw):
    return args_for(out, **{"gradient_accumulation_steps": 2, "max_steps": 3, **kw})  # the plan's W=2 x G=1 on 1 x 2


def test_trainer_evaluate_and_eval_strategy_log_the_exact_eval_loss(plan, tmp_path):
    rec = EvalRecorder(plan)
    trainer = PlanTrainer(model=tiny_model(seed=3), args=trainer_args(tmp_path, eval_strategy="steps", eval_steps=1),
                          plan=plan, callbacks=[rec])
    trainer.train()
    assert [step for step, _, _ in rec.seen] == [1, 2, 3]
    assert all(rel(got, want) < RTOL for _, got, want in rec.seen)
    assert [h["eval_loss"] for h in trainer.state.log_history if "eval_loss" in h] == [g for _, g, _ in rec.seen]
    assert len({g for _, g, _ in rec.seen}) == 3  # training moved the model between evaluations
    metrics = trainer.evaluate()
    assert rel(metrics["eval_loss"], reference_loss(trainer.model, plan)) < RTOL
    assert metrics["eval_targets"] == verified_plan(plan).eval().total_label_count


def test_an_eval_plan_swapped_for_training_rows_is_refused_by_evaluate_plan_and_the_trainer(plan, tmp_path):
    """The red team's forgery (`swap_eval_for_training`: training rows as the eval plan, every hash recomputed):
    `evaluate_plan` and `PlanTrainer.evaluate()` refuse instead of reporting a loss over training samples."""
    forged = Path(shutil.copytree(plan, tmp_path / "p"))
    swap_eval_for_training(forged)
    with pytest.raises(PlanMismatchError, match=r"eval\.parquet: holds \d+ samples the eval set"):
        evaluate_plan(tiny_model(), forged)
    trainer = PlanTrainer(model=tiny_model(), args=trainer_args(tmp_path / "o"), plan=forged)
    with pytest.raises(PlanMismatchError, match=r"eval\.parquet: holds \d+ samples the eval set"):
        trainer.evaluate()


def test_trainer_evaluates_at_the_end_of_each_plan_epoch(tmp_path):
    plan = build_plan(tmp_path / "p", n=60, data_seed=6, max_len=24, mode="packed", sequence_len=32, world_size=2,
                      grad_accum=1, epochs=2, val_set_size=10)
    rec = EvalRecorder(plan)
    trainer = PlanTrainer(model=tiny_model(seed=3), plan=plan, callbacks=[rec],
                          args=args_for(tmp_path / "o", gradient_accumulation_steps=2, num_train_epochs=2,
                                        eval_strategy="epoch"))
    trainer.train()
    ends = [trainer._update_bounds()[1], trainer._update_bounds()[2]]
    assert [step for step, _, _ in rec.seen] == ends  # once per plan epoch, not again at the stream's end
    assert all(rel(got, want) < RTOL for _, got, want in rec.seen)


def test_trainer_refuses_an_eval_dataset_that_is_not_a_plan(plan, tmp_path):
    tokens = load_tokens(plan)
    with pytest.raises(PlanMismatchError, match="not a TokenStore: compile the plan with --val-set-size"):
        PlanTrainer(model=tiny_model(), args=trainer_args(tmp_path), plan=plan, eval_dataset=tokens)
    trainer = PlanTrainer(model=tiny_model(), args=trainer_args(tmp_path), plan=plan)
    with pytest.raises(PlanMismatchError, match="not a list"):
        trainer.evaluate(eval_dataset=[{"input_ids": [1, 2]}])
    assert trainer.evaluate(eval_dataset=str(plan))["eval_loss"] == trainer.evaluate()["eval_loss"]


def test_trainer_evaluates_exactly_after_a_resume(plan, tmp_path):
    full = PlanTrainer(model=tiny_model(seed=3), args=trainer_args(tmp_path / "full"), plan=plan)
    full.train()
    # the Trainer restores eval_steps and save_steps from the checkpoint's state: both runs set the same
    kw = dict(save_strategy="steps", save_steps=1, eval_strategy="steps", eval_steps=1)
    PlanTrainer(model=tiny_model(seed=3), args=trainer_args(tmp_path / "run", max_steps=1, **kw), plan=plan).train()
    rec = EvalRecorder(plan)
    resumed = PlanTrainer(model=tiny_model(seed=99), plan=plan, callbacks=[rec],
                          args=trainer_args(tmp_path / "run", **kw))
    resumed.train(resume_from_checkpoint=True)
    assert [step for step, _, _ in rec.seen] == [2, 3]
    assert all(rel(got, want) < RTOL for _, got, want in rec.seen)
    assert rel(rec.seen[-1][1], full.evaluate()["eval_loss"]) < RTOL  # the same model as the uninterrupted run


def test_sft_trainer_evaluate_is_the_exact_eval_loss(plan, tmp_path):
    from plancc.runtime.trl import PlanSFTTrainer
    from tests.runtime.test_trl import config, tokenizer

    rec = EvalRecorder(plan)
    trainer = PlanSFTTrainer(model=tiny_model(seed=3), plan=plan, processing_class=tokenizer(), callbacks=[rec],
                             args=config(tmp_path, gradient_accumulation_steps=2, max_steps=2,
                                         eval_strategy="steps", eval_steps=1))
    trainer.train()
    assert [step for step, _, _ in rec.seen] == [1, 2]
    assert all(rel(got, want) < RTOL for _, got, want in rec.seen)
    with pytest.raises(PlanMismatchError, match="--val-set-size"):
        PlanSFTTrainer(model=tiny_model(), plan=plan, processing_class=tokenizer(), args=config(tmp_path),
                       eval_dataset=trainer.train_dataset)


# ---------------------------------------------------------------- 2 ranks (gloo, spawned)


def _ddp_worker(rank: int, plan: str, root: str, port: int) -> None:
    import os

    from torch.nn.parallel import DistributedDataParallel as DDP

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE="2")
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo", rank=rank, world_size=2)
    try:
        out = {"plain": evaluate_plan(DDP(tiny_model(seed=7, layers=2, hidden=32)), plan).loss}
        rec = EvalRecorder(plan)
        trainer = PlanTrainer(model=tiny_model(seed=3), plan=plan, callbacks=[rec],
                              args=args_for(f"{root}/hf", gradient_accumulation_steps=1, max_steps=2,
                                            ddp_backend="gloo", eval_strategy="steps", eval_steps=1))
        trainer.train()
        out["trainer"] = [(step, got) for step, got, _ in rec.seen]
        out["trainer_ref"] = [want for _, _, want in rec.seen]
        with open(f"{root}/rank{rank}.json", "w") as f:
            json.dump(out, f)
    finally:  # a gloo group left for the interpreter's exit can abort the worker (SIGABRT) after its work is done
        torch.distributed.destroy_process_group()


def test_two_rank_ddp_eval_loss_is_the_exact_token_mean(plan, tmp_path):
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.spawn(_ddp_worker, args=(str(plan), str(tmp_path), port), nprocs=2, join=False)
    deadline = time.monotonic() + 300
    while not ctx.join(timeout=5):
        assert time.monotonic() < deadline, "the ranks hung"
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    want = reference_loss(tiny_model(seed=7, layers=2, hidden=32), plan)
    for r in ranks:
        assert rel(r["plain"], want) < RTOL
        assert [step for step, _ in r["trainer"]] == [1, 2]
        assert all(rel(got, ref) < RTOL for (_, got), ref in zip(r["trainer"], r["trainer_ref"], strict=True))
    assert ranks[0]["trainer"] == ranks[1]["trainer"]  # both ranks log the same all-reduced loss

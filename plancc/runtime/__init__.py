"""Replay a compiled plan in training: sampler, collator, token-mean loss, checkpoints, Hugging Face glue.

Imports only torch, pyarrow, numpy and xxhash (and plancc.store: the plan, `plancc.Plan`, and the token store); `tokenizers` is imported only
by `check_tokenizer`, transformers only by `plancc.runtime.hf`, TRL only by `plancc.runtime.trl`.

    plan = verified_plan(plan_dir)            # plancc.Plan, checked for training (plancc.open_plan(...) works too)
    sampler = PlanSampler(plan, rank=rank, world_size=world)       # + grad_accum=... for an elastic replay
    loader = PlanDataLoader(PlanDataset(load_tokens(plan), PlanCollator.from_plan(plan)), sampler)
    for batch in loader:                      # DDP: under ddp.no_sync() unless batch["plan"]["last_in_update"]
        _, loss = microbatch_loss(ddp, batch, batch["num_items_in_batch"], world_size=world)  # no full logits
        loss.backward()          # or token_loss(logits, batch["shift_labels"], batch["num_items_in_batch"], ...)
        if batch["plan"]["last_in_update"]:
            optimizer.step(); optimizer.zero_grad()
    evaluate_plan(model, plan).loss           # plan compiled with --val-set-size: exact eval token mean
"""

from plancc.errors import PlanMismatchError
from plancc.runtime.checkpoint import (
    CheckpointError,
    Resumed,
    checkpoint_state,
    load_checkpoint,
    restore_checkpoint_state,
    save_checkpoint,
)
from plancc.runtime.collator import PlanCollator, block_causal_mask, model_inputs
from plancc.runtime.data import TokenStore, load_tokens
from plancc.runtime.evaluate import EvalResult, evaluate_plan
from plancc.runtime.forward import microbatch_loss
from plancc.runtime.loader import PlanDataLoader, PlanDataset, eval_loader
from plancc.runtime.loss import token_loss, token_loss_sum
from plancc.runtime.sampler import Microbatch, PlanEvalSampler, PlanSampler
from plancc.runtime.tokenizer import check_tokenizer, plan_tokenizer
from plancc.store.plan import verified_plan

__all__ = [
    "CheckpointError",
    "EvalResult",
    "Microbatch",
    "PlanCollator",
    "PlanDataLoader",
    "PlanDataset",
    "PlanEvalSampler",
    "PlanMismatchError",
    "PlanSampler",
    "Resumed",
    "TokenStore",
    "block_causal_mask",
    "check_tokenizer",
    "checkpoint_state",
    "eval_loader",
    "evaluate_plan",
    "load_checkpoint",
    "load_tokens",
    "microbatch_loss",
    "model_inputs",
    "plan_tokenizer",
    "restore_checkpoint_state",
    "save_checkpoint",
    "token_loss",
    "token_loss_sum",
    "verified_plan",
]

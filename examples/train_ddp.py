"""Train a tiny causal LM on a compiled plan with plain PyTorch DDP: the token-exact loss, no collective for it.

    plancc compile examples/data/chat.jsonl -o out/chat-plan --config examples/chat.toml
    torchrun --nproc_per_node 2 examples/train_ddp.py --plan out/chat-plan --max-updates 4
    torchrun --nproc_per_node 1 examples/train_ddp.py --plan out/chat-plan --grad-accum 8   # elastic replay
    torchrun --nproc_per_node 2 examples/train_ddp.py --plan out/chat-plan --checkpoint out/ckpt --resume

Runs on CPU with gloo (NCCL when CUDA is available). The model is a small Llama built from a config: nothing is
downloaded. Each rank replays its share of the plan; `num_items_in_batch` comes from the plan, so every rank
divides by the same global count without an all-reduce, and `token_loss` multiplies by the world size to undo
DDP's gradient mean. In the final update of an epoch a rank may get an empty placeholder microbatch: it runs a
forward/backward with no target (zero gradient) to keep the ranks in lockstep. Checkpoints go through
`plancc.runtime.save_checkpoint`: a kill at any instant (even mid-save) leaves the last complete step, and
`--resume` starts every rank from the newest step all of them saved completely.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from pathlib import Path
from typing import NoReturn

import torch
import torch.distributed as dist

from plancc import Plan
from plancc.core.layout import replay_problem
from plancc.errors import PlanccError
from plancc.runtime import (
    CheckpointError,
    PlanCollator,
    PlanDataLoader,
    PlanDataset,
    PlanMismatchError,
    PlanSampler,
    load_checkpoint,
    load_tokens,
    model_inputs,
    save_checkpoint,
    token_loss,
    verified_plan,
)


class Bigram(torch.nn.Module):
    """A dependency-free toy causal LM (each position sees only its own token): `--model bigram`."""

    def __init__(self, vocab_size: int, dim: int = 64):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab_size, dim)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(dim, dim), torch.nn.GELU(), torch.nn.Linear(dim, vocab_size))

    def forward(self, input_ids, position_ids=None, attention_mask=None, use_cache=None):
        return {"logits": self.mlp(self.embed(input_ids))}


def tiny_llama(vocab_size: int, seed: int) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=8192,
                      attention_dropout=0.0, use_cache=False)
    cfg._attn_implementation = "sdpa"
    return LlamaForCausalLM(cfg)


def fail(message: str) -> NoReturn:
    """One line and exit status 2: a setting that does not fit the plan is no reason for a traceback."""
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def check_shape(plan: Plan, world: int, grad_accum: int | None) -> None:
    """Refuse, in this script's own flags, a process count and --grad-accum that do not replay the plan's updates."""
    problem = replay_problem(plan.settings.world_size, plan.settings.grad_accum, world, grad_accum, flag="--grad-accum", sep=" ")
    if problem is not None:
        fail(problem)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--plan", required=True, help="a plan directory from `plancc compile`")
    ap.add_argument("--grad-accum", type=int, default=None,
                    help="replay elastically: world_size x grad_accum must equal the plan's")
    ap.add_argument("--epochs", type=int, default=None, help="epochs to train (default: all of the plan's)")
    ap.add_argument("--max-updates", type=int, default=None, help="stop after this many optimizer steps")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--checkpoint", type=Path, default=None, help="directory for checkpoints (saved per update)")
    ap.add_argument("--save-every", type=int, default=2, help="save a checkpoint every N optimizer steps")
    ap.add_argument("--keep", type=int, default=2, help="checkpoints (steps) to keep")
    ap.add_argument("--resume", action="store_true",
                    help="resume from the newest checkpoint in --checkpoint that every rank saved completely")
    ap.add_argument("--allow-dataset-change", action="store_true")
    ap.add_argument("--num-workers", type=int, default=0)
    ap.add_argument("--model", choices=("llama", "bigram"), default="llama",
                    help="a tiny Llama from transformers (default) or a dependency-free toy model")
    ap.add_argument("--verify", choices=("chunks", "hash", "counts", "none"), default="chunks",
                    help="check the tokenized data against the plan (chunks: each chunk on first read; hash: all at start)")
    args = ap.parse_args()

    world = int(os.environ.get("WORLD_SIZE", "1"))
    try:
        plan = verified_plan(args.plan)
    except PlanccError as e:
        fail(str(e))
    check_shape(plan, world, args.grad_accum)
    if args.resume and args.checkpoint is None:
        fail("--resume needs --checkpoint DIR")
    if world > 1:
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    rank = dist.get_rank() if world > 1 else 0
    device = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}" if torch.cuda.is_available() else "cpu")
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))

    sampler = PlanSampler(plan, rank=rank, world_size=world, grad_accum=args.grad_accum)
    try:
        tokens = load_tokens(plan, verify=args.verify, allow_dataset_change=args.allow_dataset_change)
    except PlanccError as e:  # every rank reads the same data and fails alike
        fail(str(e))
    loader = PlanDataLoader(PlanDataset(tokens, PlanCollator.from_plan(plan)), sampler,
                            num_workers=args.num_workers)

    vocab = -(-(tokens.max_id + 1) // 64) * 64
    if args.model == "llama":
        model = tiny_llama(vocab, args.seed)
    else:
        torch.manual_seed(args.seed)
        model = Bigram(vocab)
    model = model.to(device)
    ddp = torch.nn.parallel.DistributedDataParallel(model) if world > 1 else model
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)

    step = 0
    if args.resume:
        try:
            resumed = load_checkpoint(args.checkpoint, sampler=sampler, model=model, map_location=device,
                                      allow_dataset_change=args.allow_dataset_change)
        except (CheckpointError, PlanMismatchError) as e:  # raised on every rank alike: none is left waiting
            print(f"rank {rank}: --resume: {e}", file=sys.stderr)
            sys.exit(2)
        model.load_state_dict(resumed.state["model"])
        opt.load_state_dict(resumed.state["optim"])
        step = resumed.step
        if rank == 0:
            print(f"resumed at epoch {sampler.epoch}, update {sampler.locate(sampler.position)[0]} (step {step})")

    if rank == 0:
        print(f"plan {plan.path}: world_size {world} x grad_accum {sampler.grad_accum} "
              f"(compiled for {plan.settings.world_size} x {plan.settings.grad_accum}), mode {plan.settings.mode}, shift {plan.settings.shift}")
    epochs = args.epochs if args.epochs is not None else len(plan.epochs)
    update_loss, t0 = torch.zeros((), dtype=torch.float64, device=device), time.perf_counter()
    for epoch in range(sampler.epoch, epochs):
        loader.set_epoch(epoch)
        for batch in loader:
            last = batch["plan"]["last_in_update"]
            batch = {k: (v.to(device) if torch.is_tensor(v) else v) for k, v in batch.items()}
            # DDP decides at forward time whether this backward all-reduces: only on the update's last micro-step
            sync = contextlib.nullcontext() if (last or world == 1) else ddp.no_sync()
            with sync:
                logits = ddp(**model_inputs(batch))["logits"]
                loss = token_loss(logits, batch["shift_labels"], batch["num_items_in_batch"], world_size=world)
                loss.backward()
            update_loss += loss.detach().double() / world
            if not last:
                continue
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            step += 1
            if world > 1:  # for logging only: the exact token-mean loss of the update
                dist.all_reduce(update_loss)
            if rank == 0:
                print(f"epoch {epoch} update {batch['plan']['update']:4d} step {step:4d} "
                      f"loss {update_loss.item():.4f} targets {int(batch['num_items_in_batch'])} "
                      f"({time.perf_counter() - t0:.1f}s)", flush=True)
            update_loss.zero_()
            if args.checkpoint is not None and step % args.save_every == 0:
                save_checkpoint(args.checkpoint, step, {"model": model.state_dict(), "optim": opt.state_dict()},
                                sampler=sampler, model=model, keep=args.keep)
            if args.max_updates is not None and step >= args.max_updates:
                break
        else:
            continue
        break
    if world > 1:  # leave together: a rank tearing gloo down while its peer is still in a collective aborts
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()

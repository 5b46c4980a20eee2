"""Train a tiny causal LM with DPO (or IPO, hinge, SimPO, ORPO, KTO) on a compiled preference plan, plain PyTorch DDP:
each update's exact pair mean, whatever the accumulation and world size.

    plancc compile examples/data/pairs.jsonl -o out/dpo-plan --tokenizer builtin --chat-template chatml \\
        --sequence-len 1024 --micro-batch-size 2 --world-size 2 --grad-accum 2 --val-set-size 20
    torchrun --nproc_per_node 2 examples/train_dpo.py --plan out/dpo-plan --max-updates 4
    torchrun --nproc_per_node 1 examples/train_dpo.py --plan out/dpo-plan --grad-accum 4 --loss-type ipo  # elastic

Runs on CPU with gloo (NCCL when CUDA is available); the model is a small Llama built from a config (nothing is
downloaded) and the reference model its frozen copy at the start. Each microbatch holds whole pairs, each pair's
chosen completion next to its rejected one (`batch["chosen_index"]`, `batch["rejected_index"]`); `sequence_logps`
sums every completion's target log-probs and `preference_loss` divides the microbatch's pair losses by the
update's pair count on every rank (`batch["num_pairs_in_batch"]`, from the plan: no collective) and multiplies by
the world size to undo DDP's mean. A KTO plan (unpaired data) first runs the update's KL sequences through both
models for its reference point (`kl_reference_point`, one all-reduce), then trains. With an eval plan the run ends
with the exact eval pair mean and reward accuracy (`evaluate_preference`).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import os
import sys
from typing import NoReturn

import torch
import torch.distributed as dist

from plancc.errors import PlanccError
from plancc.runtime import (
    PlanCollator,
    PlanDataLoader,
    PlanDataset,
    PlanSampler,
    load_tokens,
    model_inputs,
    verified_plan,
)
from plancc.runtime.preference import REFERENCE_FREE, kl_reference_point, preference_loss, sequence_logps
from plancc.runtime.preference_eval import evaluate_preference
from plancc.store.plan import replay_grad_accum


def tiny_llama(vocab_size: int, seed: int) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=8192,
                      attention_dropout=0.0, use_cache=False)
    cfg._attn_implementation = "sdpa"
    return LlamaForCausalLM(cfg)


def fail(message: str) -> NoReturn:
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def updates(loader):
    """The loader's batches one optimizer update at a time (a KTO update's KL point needs all of them first)."""
    held = []
    for batch in loader:
        held.append(batch)
        if batch["plan"]["last_in_update"]:
            yield held
            held = []


def train_update(ddp, model, ref, batches, args, world: int, device) -> float:
    """Backward of one update's micro-steps (gradients left in `model`); returns the update's loss (this rank)."""
    batches = [{k: v.to(device) if torch.is_tensor(v) else ({n: t.to(device) if torch.is_tensor(t) else t
                                                            for n, t in v.items()} if k == "kl" else v)
                for k, v in b.items()} for b in batches]
    options = {}
    if args.loss_type == "kto":
        with torch.no_grad():
            kl = [(sequence_logps(model(**model_inputs(b["kl"])).logits, b["kl"])[0],
                   sequence_logps(ref(**model_inputs(b["kl"])).logits, b["kl"])[0]) for b in batches]
        options["kl"] = kl_reference_point([p for p, _ in kl], [r for _, r in kl])
    total = 0.0
    for i, batch in enumerate(batches):
        last = i == len(batches) - 1
        with contextlib.nullcontext() if (last or world == 1) else ddp.no_sync():
            policy = sequence_logps(ddp(**model_inputs(batch)).logits, batch)
            with torch.no_grad():
                reference = None if args.loss_type in REFERENCE_FREE else sequence_logps(
                    ref(**model_inputs(batch)).logits, batch)
            loss = preference_loss(policy, reference, batch, loss_type=args.loss_type, beta=args.beta,
                                   world_size=world, **options)
            loss.backward()
        total += float(loss) / world
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--plan", required=True, help="a preference plan directory from `plancc compile`")
    ap.add_argument("--loss-type", default=None, choices=("sigmoid", "hinge", "ipo", "simpo", "orpo", "kto"),
                    help="default: sigmoid (DPO) for pairs, kto for unpaired data")
    ap.add_argument("--beta", type=float, default=0.1)
    ap.add_argument("--grad-accum", type=int, default=None, help="replay elastically (W x G equal to the plan's)")
    ap.add_argument("--max-updates", type=int, default=None)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    world = int(os.environ.get("WORLD_SIZE", "1"))
    try:
        plan = verified_plan(args.plan)
        replay_grad_accum(plan.settings, world, args.grad_accum, flag="--grad-accum")
    except PlanccError as e:
        fail(str(e))
    if plan.manifest.data_kind == "sft":
        fail(f"{plan.path} holds SFT data: train it with examples/train_ddp.py")
    args.loss_type = args.loss_type or ("kto" if plan.manifest.data_kind == "unpaired_preference" else "sigmoid")
    if (args.loss_type == "kto") != (plan.manifest.data_kind == "unpaired_preference"):
        fail(f"--loss-type {args.loss_type} does not fit {plan.manifest.data_kind} data (kto trains unpaired data)")
    if world > 1:
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    rank = dist.get_rank() if world > 1 else 0
    device = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}" if torch.cuda.is_available() else "cpu")
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))

    sampler = PlanSampler(plan, rank=rank, world_size=world, grad_accum=args.grad_accum)
    tokens = load_tokens(plan)
    loader = PlanDataLoader(PlanDataset(tokens, PlanCollator.from_plan(plan)), sampler)
    model = tiny_llama(-(-(tokens.max_id + 1) // 64) * 64, args.seed).to(device)
    ref = copy.deepcopy(model).eval().requires_grad_(False)
    ddp = torch.nn.parallel.DistributedDataParallel(model) if world > 1 else model
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)

    step = 0
    for epoch in plan.epochs:
        loader.set_epoch(epoch)
        for batches in updates(loader):
            loss = torch.tensor(train_update(ddp, model, ref, batches, args, world, device), dtype=torch.float64)
            opt.step()
            opt.zero_grad(set_to_none=True)
            step += 1
            if world > 1:  # for logging only: the update's exact pair-mean loss
                dist.all_reduce(loss)
            last = batches[-1]
            count = last["num_pairs_in_batch"] if "num_pairs_in_batch" in last else (
                last["num_desirable_in_batch"] + last["num_undesirable_in_batch"])
            if rank == 0:
                print(f"epoch {epoch} update {last['plan']['update']:4d} step {step:4d} loss {loss.item():.6f} "
                      f"{'completions' if args.loss_type == 'kto' else 'pairs'} {int(count)}", flush=True)
            if args.max_updates is not None and step >= args.max_updates:
                break
        else:
            continue
        break
    if plan.manifest.has_eval:
        result = evaluate_preference(model, None if args.loss_type in REFERENCE_FREE else ref, plan, tokens,
                                     loss_type=args.loss_type, beta=args.beta, rank=rank, world_size=world)
        if rank == 0:
            accuracy = "" if result.reward_accuracy is None else f" reward accuracy {result.reward_accuracy:.3f}"
            print(f"eval loss {result.loss:.6f} over {result.items} {'completions' if args.loss_type == 'kto' else 'pairs'}"
                  f"{accuracy}", flush=True)
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()

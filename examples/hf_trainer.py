"""Train with the Hugging Face `Trainer` on a compiled plan: the plan's batches, its exact `num_items_in_batch`.

    pip install -e ".[hf]"
    plancc compile examples/data/chat.jsonl -o out/chat-plan --config examples/chat.toml
    torchrun --nproc_per_node 2 examples/hf_trainer.py --plan out/chat-plan --output-dir out/hf --max-steps 4
    torchrun --nproc_per_node 2 examples/hf_trainer.py --plan out/chat-plan --output-dir out/hf --resume
    accelerate launch --multi_gpu --num_processes 2 examples/hf_trainer.py --plan out/chat-plan --max-steps 4

`PlanTrainer` is a `Trainer` whose train dataloader replays the plan for this rank, whose accumulation windows
are the plan's updates, and whose loss is divided by the plan's global target count of each update. Set
`gradient_accumulation_steps` so that processes x steps equals the plan's microbatches per update (the plan's
world_size x grad_accum). Checkpoints carry each rank's plan position (`plancc_sampler*.json`, written
atomically once the checkpoint's other files are on disk); `--resume` takes the newest checkpoint that every rank
saved completely and refuses one whose ranks disagree.
The model is a small Llama built from a config: nothing is downloaded.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import NoReturn

import torch
from transformers import LlamaConfig, LlamaForCausalLM, TrainingArguments

from plancc import Plan
from plancc.core.layout import elastic_grad_accum, replay_problem
from plancc.errors import PlanccError
from plancc.runtime import load_tokens, verified_plan
from plancc.runtime.hf import PlanTrainer


def arguments(output_dir: str, description: str | None = __doc__) -> argparse.ArgumentParser:
    """The options of the Trainer examples (`trl_sft.py` adds its own)."""
    ap = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--plan", required=True)
    ap.add_argument("--output-dir", default=output_dir)
    ap.add_argument("--max-steps", type=int, default=-1, help="optimizer steps (default: the plan's epochs)")
    ap.add_argument("--epochs", type=int, default=None)
    ap.add_argument("--save-steps", type=int, default=2)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--resume", action="store_true", help="resume from the last checkpoint in --output-dir")
    return ap


def fail(message: str) -> NoReturn:
    """Stop with one line and exit status 2: a setting that does not fit the plan is no reason for a traceback."""
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def open_run(plan_dir: str):
    """The plan, this run's process count (checked against the plan's microbatches per update) and its tokens."""
    try:
        plan = verified_plan(plan_dir)
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if elastic_grad_accum(plan.settings.batches_per_update, world) is None:
            fail(replay_problem(plan.settings.world_size, plan.settings.grad_accum, world, None,
                                flag="gradient_accumulation_steps"))
        return plan, world, load_tokens(plan)
    except PlanccError as e:
        fail(str(e))


def tiny_llama(vocab: int) -> LlamaForCausalLM:
    """A small Llama from a config (nothing downloaded), its vocabulary rounded up to a multiple of 64."""
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=-(-vocab // 64) * 64, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=8192, use_cache=False)
    cfg._attn_implementation = "sdpa"
    return LlamaForCausalLM(cfg)


def training_settings(args: argparse.Namespace, plan: Plan, world: int) -> dict:
    """The `TrainingArguments` a plan decides: accumulation = the plan's microbatches per update / processes."""
    return dict(
        output_dir=args.output_dir,
        use_cpu=not torch.cuda.is_available(),
        gradient_accumulation_steps=elastic_grad_accum(plan.settings.batches_per_update, world),
        per_device_train_batch_size=1,  # ignored: the plan decides every batch
        num_train_epochs=args.epochs if args.epochs is not None else len(plan.epochs),
        max_steps=args.max_steps,
        learning_rate=args.lr,
        lr_scheduler_type="constant",
        logging_steps=1,
        save_strategy="steps",
        save_steps=args.save_steps,
        report_to=[],
        ddp_backend="gloo" if world > 1 and not torch.cuda.is_available() else None,
    )


def finish() -> None:
    """Leave together: a rank tearing gloo down mid-collective aborts."""
    if torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


def main() -> None:
    ap = arguments("out/hf")
    ap.add_argument("--save-total-limit", type=int, default=2, help="checkpoints to keep")
    args = ap.parse_args()
    plan, world, tokens = open_run(args.plan)
    model = tiny_llama(tokens.max_id + 1)
    training_args = TrainingArguments(**training_settings(args, plan, world), save_total_limit=args.save_total_limit)
    trainer = PlanTrainer(model=model, args=training_args, plan=plan, tokens=tokens)
    trainer.train(resume_from_checkpoint=True if args.resume else None)
    finish()


if __name__ == "__main__":
    main()

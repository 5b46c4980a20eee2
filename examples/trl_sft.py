"""Train with TRL's `SFTTrainer` on a compiled plan: the plan's batches, its exact `num_items_in_batch`, checked resume.

    pip install -e ".[hf]"
    plancc compile examples/data/chat.jsonl -o out/chat-plan --config examples/chat.toml
    accelerate launch --multi_gpu --num_processes 2 examples/trl_sft.py --plan out/chat-plan --max-steps 4
    python examples/trl_sft.py --plan out/chat-plan --max-steps 4           # one process: G = W x G of the plan
    accelerate launch --multi_gpu --num_processes 2 examples/trl_sft.py --plan out/chat-plan --resume

(`--multi_gpu` selects accelerate's torchrun launcher; without GPUs the processes train on the CPU with gloo.)
`PlanSFTTrainer` is an `SFTTrainer` whose batches, counts and loss come from the plan (see
`plancc.runtime.trl`). `gradient_accumulation_steps` is set so that processes x steps equals the plan's
microbatches per update. The tokenizer is the one the plan was compiled with: `--tokenizer DIR` for a Hugging Face
tokenizer directory, else plancc's built-in byte-level tokenizer. The model is a small Llama built from a config:
nothing is downloaded.
"""

from __future__ import annotations

import argparse
import os

import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
from trl import SFTConfig

from plancc.runtime import RuntimePlan, load_tokens
from plancc.runtime.trl import PlanSFTTrainer


def tokenizer_for(path: str | None):
    if path is not None:
        return AutoTokenizer.from_pretrained(path, local_files_only=True)
    from plancc.sources.tokenizer import BUILTIN, load_tokenizer  # what `tokenizer = "builtin"` compiled with

    tok = load_tokenizer(BUILTIN)
    return PreTrainedTokenizerFast(tokenizer_object=tok.tokenizer, eos_token=tok.eos_token, pad_token="<|pad|>",
                                   bos_token=tok.bos_token)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--plan", required=True)
    ap.add_argument("--output-dir", default="out/sft")
    ap.add_argument("--tokenizer", default=None, help="the Hugging Face tokenizer directory the plan was compiled with")
    ap.add_argument("--max-steps", type=int, default=-1, help="optimizer steps (default: the plan's epochs)")
    ap.add_argument("--epochs", type=int, default=None)
    ap.add_argument("--save-steps", type=int, default=2)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--resume", action="store_true", help="resume from the last checkpoint in --output-dir")
    args = ap.parse_args()

    plan = RuntimePlan(args.plan)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if plan.batches_per_update % world:
        raise SystemExit(f"{world} processes cannot replay a plan of {plan.batches_per_update} microbatches per update")
    tokens = load_tokens(plan)
    tokenizer = tokenizer_for(args.tokenizer)
    vocab = -(-max(len(tokenizer), tokens.max_id + 1) // 64) * 64
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=8192, use_cache=False)
    cfg._attn_implementation = "sdpa"
    model = LlamaForCausalLM(cfg)

    config = SFTConfig(
        output_dir=args.output_dir,
        use_cpu=not torch.cuda.is_available(),
        bf16=torch.cuda.is_available(),
        gradient_checkpointing=False,
        gradient_accumulation_steps=plan.batches_per_update // world,
        per_device_train_batch_size=1,  # ignored: the plan decides every batch
        num_train_epochs=args.epochs if args.epochs is not None else plan.epochs,
        max_steps=args.max_steps,
        learning_rate=args.lr,
        lr_scheduler_type="constant",
        logging_steps=1,
        save_strategy="steps",
        save_steps=args.save_steps,
        report_to=[],
        ddp_backend="gloo" if world > 1 and not torch.cuda.is_available() else None,
    )
    trainer = PlanSFTTrainer(model=model, args=config, plan=plan, tokens=tokens, processing_class=tokenizer)
    trainer.train(resume_from_checkpoint=True if args.resume else None)
    if torch.distributed.is_initialized():  # leave together: a rank tearing gloo down mid-collective aborts
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()

"""Train with TRL's `SFTTrainer` on a compiled plan: the plan's batches, its exact `num_items_in_batch`, checked resume.

    pip install -e ".[hf]"
    plancc compile examples/data/chat.jsonl -o out/chat-plan --config examples/chat.toml
    accelerate launch --multi_gpu --num_processes 2 examples/trl_sft.py --plan out/chat-plan --max-steps 4
    python examples/trl_sft.py --plan out/chat-plan --max-steps 4           # one process: G = W x G of the plan
    accelerate launch --multi_gpu --num_processes 2 examples/trl_sft.py --plan out/chat-plan --resume

(`--multi_gpu` selects accelerate's torchrun launcher; without GPUs the processes train on the CPU with gloo.)
`PlanSFTTrainer` is an `SFTTrainer` whose batches, counts and loss come from the plan (see
`plancc.runtime.trl`). `gradient_accumulation_steps` is set so that processes x steps equals the plan's
microbatches per update. The tokenizer is the one the plan was compiled with: by default the one the plan records
(its directory, or plancc's built-in byte-level tokenizer); `--tokenizer DIR` names a Hugging Face tokenizer
directory instead (a copy elsewhere, or for a plan of already tokenized data). Another tokenizer than the plan's is
refused. The model is a small Llama built from a config: nothing is downloaded.
"""

from __future__ import annotations

from pathlib import Path

import torch
from hf_trainer import (  # the shared set-up, beside this
    arguments,
    fail,
    finish,
    open_run,
    tiny_llama,
    training_settings,
)
from transformers import AutoTokenizer, PreTrainedTokenizerFast
from trl import SFTConfig

from plancc import Plan
from plancc.runtime import PlanMismatchError, plan_tokenizer
from plancc.runtime.trl import PlanSFTTrainer


def tokenizer_for(path: str | None, plan: Plan):
    """`--tokenizer`, else the tokenizer the plan records (PlanSFTTrainer refuses any other)."""
    if path is None:
        recorded = plan_tokenizer(plan)
        if recorded is None:
            fail(f"plan {plan.path} was compiled from already tokenized data and records no tokenizer: pass "
                     "--tokenizer DIR (the one that tokenized it)")
        if recorded.builtin:
            return builtin_tokenizer()
        path = recorded.name
        if not Path(path).exists():
            fail(f"plan {plan.path} was compiled with the tokenizer {path}, which is not there: pass --tokenizer "
                     "DIR (a copy of it)")
    if Path(path).is_file():  # a bare tokenizer.json, as `plancc compile --tokenizer FILE` takes
        return PreTrainedTokenizerFast(tokenizer_file=path, name_or_path=path)
    return AutoTokenizer.from_pretrained(path, local_files_only=True)


def builtin_tokenizer() -> PreTrainedTokenizerFast:
    """plancc's built-in byte-level tokenizer (what `tokenizer = "builtin"` compiles with) for transformers."""
    from plancc.scan.sources.tokenizer import BUILTIN, load_tokenizer

    tok = load_tokenizer(BUILTIN)
    return PreTrainedTokenizerFast(tokenizer_object=tok.tokenizer, eos_token=tok.eos_token, pad_token="<|pad|>",
                                   bos_token=tok.bos_token)


def main() -> None:
    ap = arguments("out/sft", __doc__)
    ap.add_argument("--tokenizer", default=None, help="the Hugging Face tokenizer directory the plan was compiled with")
    args = ap.parse_args()
    plan, world, tokens = open_run(args.plan)
    tokenizer = tokenizer_for(args.tokenizer, plan)
    model = tiny_llama(max(len(tokenizer), tokens.max_id + 1))
    config = SFTConfig(**training_settings(args, plan, world), bf16=torch.cuda.is_available(),
                       gradient_checkpointing=False)
    try:
        trainer = PlanSFTTrainer(model=model, args=config, plan=plan, tokens=tokens, processing_class=tokenizer)
    except PlanMismatchError as e:  # another tokenizer than the plan's: one line, nothing trained or saved
        fail(str(e))
    trainer.train(resume_from_checkpoint=True if args.resume else None)
    finish()


if __name__ == "__main__":
    main()

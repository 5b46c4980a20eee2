"""Train with TRL's `DPOTrainer` (or `KTOTrainer`) on a compiled preference plan: the plan's batches, each update's
exact pair mean, the exact eval pair mean and reward accuracy, checked resume.

    pip install -e ".[hf]"
    plancc compile examples/data/pairs.jsonl -o out/dpo-plan --tokenizer builtin --chat-template chatml \\
        --sequence-len 1024 --micro-batch-size 2 --world-size 2 --grad-accum 2 --val-set-size 20
    accelerate launch --multi_gpu --num_processes 2 examples/trl_dpo.py --plan out/dpo-plan --max-steps 4
    python examples/trl_dpo.py --plan out/dpo-plan --max-steps 4 --loss-type ipo     # one process: G = W x G

`PlanDPOTrainer` is a `DPOTrainer` whose batches, counts and loss come from the plan (`plancc.runtime.trl_preference`);
`--loss-type` is sigmoid (DPO), hinge, ipo, simpo or orpo, and a plan of unpaired data trains with `PlanKTOTrainer`
(kto). The reference model is the model's frozen copy at the start. The tokenizer is the one the plan records (as in
`trl_sft.py`). The model is a small Llama built from a config: nothing is downloaded.
"""

from __future__ import annotations

import torch
from hf_trainer import arguments, fail, finish, open_run, tiny_llama, training_settings  # the shared set-up
from trl import DPOConfig, KTOConfig
from trl_sft import tokenizer_for

from plancc.runtime import PlanMismatchError
from plancc.runtime.trl_preference import PlanDPOTrainer, PlanKTOTrainer


def main() -> None:
    ap = arguments("out/dpo", __doc__)
    ap.add_argument("--tokenizer", default=None, help="the Hugging Face tokenizer directory the plan was compiled with")
    ap.add_argument("--loss-type", default="sigmoid", choices=("sigmoid", "hinge", "ipo", "simpo", "orpo"),
                    help="the pair loss (a plan of unpaired data trains kto)")
    ap.add_argument("--beta", type=float, default=0.1)
    args = ap.parse_args()
    plan, world, tokens = open_run(args.plan)
    tokenizer = tokenizer_for(args.tokenizer, plan)
    model = tiny_llama(max(len(tokenizer), tokens.max_id + 1))
    common = dict(**training_settings(args, plan, world), bf16=torch.cuda.is_available(), gradient_checkpointing=False,
                  beta=args.beta, eval_strategy="steps" if plan.manifest.has_eval else "no", eval_steps=args.save_steps)
    unpaired = plan.manifest.data_kind == "unpaired_preference"
    trainer_class = PlanKTOTrainer if unpaired else PlanDPOTrainer
    config = KTOConfig(**common) if unpaired else DPOConfig(**common, loss_type=args.loss_type)
    try:
        trainer = trainer_class(model=model, args=config, plan=plan, tokens=tokens, processing_class=tokenizer)
    except PlanMismatchError as e:  # another tokenizer than the plan's, SFT data: one line, nothing trained
        fail(str(e))
    trainer.train(resume_from_checkpoint=True if args.resume else None)
    if plan.manifest.has_eval:
        metrics = trainer.evaluate()
        if trainer.is_world_process_zero():
            print({k: v for k, v in metrics.items() if k.startswith("eval_") and "runtime" not in k})
    finish()


if __name__ == "__main__":
    main()

"""TRL integration: `PlanSFTTrainer`, TRL's `SFTTrainer` replaying a plancc plan.

    from trl import SFTConfig
    from plancc.runtime.trl import PlanSFTTrainer
    args = SFTConfig(output_dir="out/sft", gradient_accumulation_steps=G, bf16=False, ...)
    trainer = PlanSFTTrainer(model=model, args=args, plan=plan_dir, processing_class=tokenizer)
    trainer.train()                                   # or train(resume_from_checkpoint=True)

It is `PlanTrainer` (see `plancc.runtime.hf`: the plan's sampler and collator, the plan's `num_items_in_batch`,
the token-mean loss, epochs as one stream, checked resume) placed in front of `SFTTrainer` in the class order, so
SFTTrainer keeps its model set-up (PEFT, chat template, pad token, logging, model card) while every batch, count
and loss comes from the plan. What differs from a plain `SFTTrainer`:

- no dataset preparation: the plan's tokenized data is what the model sees, so `args.dataset_kwargs` gets
  `skip_prepare_dataset=True`, and `packing`, `padding_free` and `max_length` are the plan's business (packing
  or padding-free in the config is refused). `train_dataset` defaults to a one-sample preview of the plan's data,
  only for the checks SFTTrainer makes at start-up; training reads the plan;
- the loss is the plan's token mean (fp32 cross entropy, sum / the update's plan count x world size), by
  `loss="chunked"` (default), `"logits"` or `"model"` as in `PlanTrainer`, or `loss="fused"`: TRL's fused LM head
  (the model called with `fused_lm_head=True`, `shift_labels` and the plan's `num_items_in_batch`), which also
  never builds every token's logits. `compute_loss_func` gets the plan's count. `loss_type="nll"` only; TRL's
  token-accuracy and entropy metrics are not logged;
- evaluation is `PlanTrainer.evaluate`: the exact token-mean loss over the plan's eval plan (compile with
  `--val-set-size` or a recipe's `eval_datasets`), logged as `eval_loss`; an `eval_dataset` that is not a plan is
  refused;
- `processing_class` is required: the tokenizer the plan was compiled with (another one is refused, see
  `plancc.runtime.check_tokenizer`); it is saved with checkpoints, and its pad token, else its eos token, pads
  the rows unless `pad_token_id` is given.
`datasets` is imported here only because SFTTrainer accepts nothing else as `train_dataset`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from datasets import Dataset
from trl import SFTConfig, SFTTrainer

from plancc.errors import PlanMismatchError
from plancc.runtime.data import TokenStore, load_tokens
from plancc.runtime.forward import LOSS_PATHS, plan_forward
from plancc.runtime.hf import PlanTrainer
from plancc.runtime.loss import plan_count
from plancc.store.plan import Plan, verified_plan


def _preview(tokens: TokenStore) -> Dataset:
    """The plan's first sample as a one-row `datasets.Dataset` (input_ids, labels): what SFTTrainer inspects."""
    a, b = int(tokens.offsets[0]), int(tokens.offsets[1])
    return Dataset.from_dict({"input_ids": [tokens.input_ids[a:b].tolist()],
                              "labels": [tokens.targets[a:b].tolist()]})


class PlanSFTTrainer(PlanTrainer, SFTTrainer):
    """TRL's `SFTTrainer` on a plancc plan (see module docstring). Keyword arguments as `PlanTrainer`'s (`plan`,
    `tokens`, `verify`, `allow_dataset_change`, `pad_token_id`, `explicit_mask`, `loss`: also `"fused"`) plus
    SFTTrainer's."""

    loss_paths = (*LOSS_PATHS, "fused")

    def __init__(self, *args: Any, plan: str | Path | Plan, processing_class: Any,
                 tokens: TokenStore | None = None, verify: str = "hash", allow_dataset_change: bool = False,
                 pad_token_id: int | None = None, **kwargs: Any):
        config = kwargs.get("args", args[1] if len(args) > 1 else None)
        if not isinstance(config, SFTConfig):
            raise TypeError("PlanSFTTrainer needs args=SFTConfig(...) (with gradient_accumulation_steps matching "
                            f"the plan), got {type(config).__name__}")
        if config.packing or config.padding_free:
            raise PlanMismatchError("the plan already packs the samples: set packing=False and padding_free=False "
                                    "in the SFTConfig")
        if config.loss_type != "nll":
            raise PlanMismatchError(f"loss_type={config.loss_type!r} changes the objective the plan counts for; "
                                    "PlanSFTTrainer trains the token-mean NLL (loss_type='nll')")
        config.dataset_kwargs = {**(config.dataset_kwargs or {}), "skip_prepare_dataset": True}
        plan = verified_plan(plan)
        if tokens is None:
            tokens = load_tokens(plan, verify=verify, allow_dataset_change=allow_dataset_change)
        if pad_token_id is None:
            pad_token_id = next((t for t in (getattr(processing_class, "pad_token_id", None),
                                             getattr(processing_class, "eos_token_id", None)) if t is not None), 0)
        kwargs.setdefault("train_dataset", _preview(tokens))
        super().__init__(*args, plan=plan, tokens=tokens, verify=verify, allow_dataset_change=allow_dataset_change,
                         pad_token_id=pad_token_id, processing_class=processing_class, **kwargs)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        """`PlanTrainer.compute_loss`, or with `loss="fused"` TRL's fused LM head fed the plan's count."""
        if self.plan_loss != "fused" or self.compute_loss_func is not None:
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        count = plan_count(inputs["num_items_in_batch"] if num_items_in_batch is None else num_items_in_batch,
                           inputs["input_ids"].device)
        outputs, _ = plan_forward(model, inputs, explicit_mask=self.explicit_mask, fused_lm_head=True,
                                  shift_labels=inputs["shift_labels"], num_items_in_batch=count)
        loss = outputs["loss"] * self.args.world_size
        return (loss, outputs) if return_outputs else loss

    def _eval_loss_path(self) -> str:
        """Evaluation sums CE by the chunked path under `loss="fused"` (the same numbers)."""
        return "chunked" if self.plan_loss == "fused" else self.plan_loss

    def _eval_stand_in(self) -> Dataset:
        """SFTTrainer inspects the eval dataset's columns at start-up: the same preview as for training."""
        return _preview(self.plan_tokens)


__all__ = ["PlanSFTTrainer"]

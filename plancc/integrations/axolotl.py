"""An Axolotl plugin that makes Axolotl train on a plancc plan. In the user's own Axolotl YAML:

    plugins:
      - plancc.integrations.axolotl.PlanccPlugin
    plancc_plan: out/chat-plan          # a compiled plan directory
    plancc_loss: chunked                # optional: chunked (default), logits or model (see below)
    gradient_accumulation_steps: 4      # x the number of processes = the plan's microbatches per update

then `axolotl train config.yml` (or `accelerate launch -m axolotl.cli.train config.yml`). Axolotl keeps its model
set-up (loading, quantization, adapters, kernels, DeepSpeed/FSDP, its logging and schedule); the plan supplies:

- the batches: `load_datasets` hands Axolotl a one-sample preview of the plan's data (Axolotl's dataset loading
  and packing do not run; `datasets:` may be omitted) and the plan's optimizer-step count, and the trainer class
  is Axolotl's own `AxolotlTrainer` with `plancc.runtime.hf.PlanTrainer` in front of it, so every rank reads its
  microbatches in the plan's order (`micro_batch_size` and `sample_packing` are the plan's business);
- the loss: the plan's exact token mean, with the plan's global count for each update (`plancc.runtime.forward`).
  With a fused kernel that Axolotl patches into the model's forward (Liger's fused linear cross entropy,
  cut-cross-entropy), set `plancc_loss: model`, so the model's own loss gets `labels`, `shift_labels` and the
  plan's `num_items_in_batch`;
- evaluation: the plan's eval plan (compiled with `--val-set-size` or a recipe's eval datasets), the exact token
  mean, on Axolotl's eval schedule (`eval_steps`, `evals_per_epoch`);
- the tokenizer check: the tokenizer Axolotl loads must be the one the plan was compiled with;
- resume: Axolotl's `resume_from_checkpoint` / `auto_resume_from_checkpoints` go through `PlanTrainer`'s checked
  resume (every checkpoint carries each rank's sampler state).
Preference training (`rl:`) is not planned this way and is refused.
"""

from __future__ import annotations

from typing import Any

from axolotl.common.datasets import TrainDatasetMeta
from axolotl.core.trainers.base import AxolotlTrainer
from axolotl.integrations.base import BasePlugin
from datasets import Dataset
from pydantic import BaseModel

from plancc.core import layout
from plancc.errors import PlanMismatchError
from plancc.runtime.data import load_tokens
from plancc.runtime.forward import LOSS_PATHS
from plancc.runtime.hf import PlanTrainer
from plancc.runtime.sampler import PlanSampler
from plancc.store.plan import verified_plan


class PlanccArgs(BaseModel):
    """The keys the plugin adds to an Axolotl config."""

    plancc_plan: str | None = None
    plancc_loss: str = "chunked"


def _preview(plan_dir: str) -> Dataset:
    """The plan's first sample as a one-row dataset: what Axolotl inspects before training (never trained on)."""
    tokens = load_tokens(verified_plan(plan_dir), verify="none")
    a, b = int(tokens.offsets[0]), int(tokens.offsets[1])
    ids = tokens.input_ids[a:b].tolist()
    return Dataset.from_dict({"input_ids": [ids], "labels": [tokens.targets[a:b].tolist()],
                              "attention_mask": [[1] * len(ids)]})


def plan_steps(plan_dir: str, epochs: float | None) -> int:
    """The optimizer steps of the plan's first `epochs` epochs (all of them when None)."""
    plan = verified_plan(plan_dir)
    sampler = PlanSampler(plan, rank=0, world_size=1, grad_accum=layout.batches_per_update(plan.settings.world_size, plan.settings.grad_accum))
    count = len(plan.epochs) if epochs is None else int(epochs)
    return sum(sampler.updates_per_epoch(e) for e in plan.epochs[:count])


def trainer_class(plan_dir: str, loss: str) -> type:
    """Axolotl's `AxolotlTrainer` replaying the plan at `plan_dir` (`PlanTrainer` first in the class order)."""

    class PlanAxolotlTrainer(PlanTrainer, AxolotlTrainer):
        """`AxolotlTrainer` on a plancc plan: the plan's batches, counts, loss, eval plan and resume."""

        def __init__(self, *args: Any, **kwargs: Any):
            tokenizer = kwargs.get("processing_class")
            pad = next((t for t in (getattr(tokenizer, "pad_token_id", None),
                                    getattr(tokenizer, "eos_token_id", None)) if t is not None), 0)
            kwargs["eval_dataset"] = None  # the preview stands for the plan's eval plan, which PlanTrainer runs
            super().__init__(*args, plan=plan_dir, loss=loss, pad_token_id=pad, **kwargs)

    return PlanAxolotlTrainer


class PlanccPlugin(BasePlugin):
    """Axolotl plugin: train on the plan named by `plancc_plan` (see module docstring)."""

    def get_input_args(self) -> str:
        """The pydantic model of the plugin's config keys."""
        return "plancc.integrations.axolotl.PlanccArgs"

    def _plan(self, cfg) -> str:
        plan = cfg.get("plancc_plan")
        if not plan:
            raise PlanMismatchError("the plancc plugin needs `plancc_plan: PATH` (a compiled plan directory) in the "
                                    "Axolotl config")
        if cfg.get("rl"):
            raise PlanMismatchError("the plancc plugin trains supervised fine-tuning plans; remove `rl:` (preference "
                                    "training is not replayed through Axolotl)")
        if cfg.get("plancc_loss", "chunked") not in LOSS_PATHS:
            raise PlanMismatchError(f"plancc_loss: {cfg.get('plancc_loss')!r}: choose one of {', '.join(LOSS_PATHS)}")
        return str(plan)

    def load_datasets(self, cfg, preprocess: bool = False) -> TrainDatasetMeta:
        """A preview of the plan's data in place of Axolotl's datasets, and the plan's optimizer-step count."""
        plan = self._plan(cfg)
        epochs = None if cfg.get("max_steps") else cfg.get("num_epochs")
        has_eval = verified_plan(plan).has_eval
        preview = _preview(plan)
        return TrainDatasetMeta(train_dataset=preview, eval_dataset=preview if has_eval else None,
                                total_num_steps=cfg.get("max_steps") or plan_steps(plan, epochs))

    def get_trainer_cls(self, cfg) -> type:
        """Axolotl's trainer with the plan's replay in front of it."""
        return trainer_class(self._plan(cfg), cfg.get("plancc_loss") or "chunked")


__all__ = ["PlanccArgs", "PlanccPlugin", "plan_steps", "trainer_class"]

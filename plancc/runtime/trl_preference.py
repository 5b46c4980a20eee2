"""TRL integration for preference plans: `PlanDPOTrainer` (DPO, IPO, hinge, SimPO, ORPO) and `PlanKTOTrainer`,
TRL's `DPOTrainer` and `KTOTrainer` replaying a plancc preference plan (docs/preference.md).

    from trl import DPOConfig
    from plancc.runtime.trl_preference import PlanDPOTrainer
    args = DPOConfig(output_dir="out/dpo", gradient_accumulation_steps=G, beta=0.1, loss_type="sigmoid", ...)
    trainer = PlanDPOTrainer(model=model, ref_model=ref_model, args=args, plan=plan_dir, processing_class=tokenizer)
    trainer.train()                                   # or train(resume_from_checkpoint=True)

Each is `PlanTrainer` (`plancc.runtime.hf`: the plan's sampler and batches, epochs as one stream, checked resume,
the tokenizer check) in front of TRL's trainer in the class order, as `PlanSFTTrainer` is: TRL keeps its model
set-up (pad token, reference model, dropout off, model card) while every batch, count and loss comes from the plan.
What differs from the plain TRL trainer:

- the loss is `plancc.runtime.preference_loss` over `sequence_logps` of the plan's packed batches: each update's
  pair mean (KTO: completion mean) exactly, whatever the accumulation and world size. `args.loss_type` is one of
  sigmoid, hinge, ipo, simpo, orpo for `PlanDPOTrainer` (simpo's `gamma` through `loss_options`; `label_smoothing`
  from the config) and kto for `PlanKTOTrainer`, whose KL reference point is taken over each whole update before
  its first micro-step (`get_batch_samples`), the same on every micro-step and rank;
- `ref_model` defaults to a frozen copy of `model` as it is when the trainer is made (TRL would load the model's
  checkpoint again); the reference-free simpo and orpo never run it;
- no dataset preparation: `train_dataset` defaults to one pair of the plan's data decoded (TRL inspects one at
  start-up); precomputed reference log-probs, `padding_free`, several loss types, `ld_alpha`, WPO weighting and
  f-divergences other than reverse KL are refused (they change what the plan counts for);
- `evaluate()` runs the plan's eval plan: `eval_loss` is the exact pair mean over the whole eval set on every rank
  and `eval_rewards/accuracies` the share of pairs whose chosen completion earns the higher reward
  (`plancc.runtime.preference_eval`).
`datasets` is imported here only because TRL's trainers accept nothing else as `train_dataset`.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import numpy as np
import torch
from datasets import Dataset
from trl import DPOConfig, DPOTrainer, KTOConfig, KTOTrainer

from plancc.core.plan_arrays import IGNORE_INDEX
from plancc.errors import PlanMismatchError
from plancc.runtime.data import TokenStore, load_tokens
from plancc.runtime.evaluate import plan_forward
from plancc.runtime.hf import TRAINER_OF, PlanTrainer
from plancc.runtime.preference import REFERENCE_FREE, kl_reference_point, preference_loss, sequence_logps
from plancc.runtime.preference_eval import batch_logps, preference_eval_result, preference_eval_totals
from plancc.store.plan import Plan, verified_plan

DPO_LOSS_TYPES = ("sigmoid", "hinge", "ipo", "simpo", "orpo")


def _decoded(tokens: TokenStore, sid: int, processing_class: Any) -> tuple[str, str]:
    """(prompt, completion) text of sample `sid`: its tokens before and from its first target, decoded."""
    a, b = int(tokens.offsets[sid]), int(tokens.offsets[sid + 1])
    ids, targets = np.asarray(tokens.input_ids[a:b]), np.asarray(tokens.targets[a:b])
    first = int(np.argmax(targets != IGNORE_INDEX)) if (targets != IGNORE_INDEX).any() else b - a
    return (processing_class.decode(ids[:first].tolist()), processing_class.decode(ids[first:].tolist()))


def _preview(plan: Plan, tokens: TokenStore, processing_class: Any) -> Dataset:
    """The plan's first pair (or completion) decoded as a one-row `datasets.Dataset`: what TRL inspects."""
    first = plan.epoch(0)[0][0]
    prompt, chosen = _decoded(tokens, first[0], processing_class)
    if plan.manifest.data_kind == "preference":
        return Dataset.from_dict({"prompt": [prompt], "chosen": [chosen],
                                  "rejected": [_decoded(tokens, first[1], processing_class)[1]]})
    return Dataset.from_dict({"prompt": [prompt], "completion": [chosen], "label": [True]})


def _config(args: tuple, kwargs: dict, kind: type) -> Any:
    config = kwargs.get("args", args[2] if len(args) > 2 else None)
    if not isinstance(config, kind):
        raise TypeError(f"this trainer needs args={kind.__name__}(...) (with gradient_accumulation_steps matching "
                        f"the plan), got {type(config).__name__}")
    if config.precompute_ref_log_probs:
        raise PlanMismatchError("precompute_ref_log_probs=True precomputes over TRL's own dataset order; the plan "
                                "decides the batches: set it to False")
    return config


class _PlanPreference(PlanTrainer):
    """What `PlanDPOTrainer` and `PlanKTOTrainer` share: the plan of the right kind, its tokens and preview, the
    reference model, the loss and the exact evaluation."""

    data_kind = "preference"

    def _setup(self, args: tuple, kwargs: dict, *, plan: str | Path | Plan, processing_class: Any,
               tokens: TokenStore | None, verify: str, allow_dataset_change: bool, pad_token_id: int | None,
               loss_type: str) -> dict[str, Any]:
        plan = verified_plan(plan)
        if plan.manifest.data_kind != self.data_kind:
            raise PlanMismatchError(f"{plan.path} holds {plan.manifest.data_kind} data; {type(self).__name__} trains "
                                    f"{self.data_kind} data: use {TRAINER_OF[plan.manifest.data_kind]}")
        if tokens is None:
            tokens = load_tokens(plan, verify=verify, allow_dataset_change=allow_dataset_change)
        if pad_token_id is None:
            pad_token_id = next((t for t in (getattr(processing_class, "pad_token_id", None),
                                             getattr(processing_class, "eos_token_id", None)) if t is not None), 0)
        model = kwargs.get("model", args[0] if args else None)
        if kwargs.get("ref_model") is None and loss_type not in REFERENCE_FREE:
            kwargs["ref_model"] = copy.deepcopy(model).eval().requires_grad_(False)
        kwargs.setdefault("train_dataset", _preview(plan, tokens, processing_class))
        self.plan_loss_type, self.plan_processing_class = loss_type, processing_class
        return dict(plan=plan, tokens=tokens, verify=verify, allow_dataset_change=allow_dataset_change,
                    pad_token_id=pad_token_id, processing_class=processing_class, **kwargs)

    def _eval_stand_in(self) -> Dataset:
        """TRL prepares the eval dataset at start-up: the same preview as for training."""
        return _preview(self.plan, self.plan_tokens, self.plan_processing_class)

    def _reference(self, inputs: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor] | None:
        if self.plan_loss_type in REFERENCE_FREE:
            return None
        with torch.no_grad():
            return batch_logps(self.ref_model, inputs, explicit_mask=self.explicit_mask)

    def _loss_options(self, inputs: dict[str, Any]) -> dict[str, Any]:
        return {}

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        """This microbatch's share of the update's preference loss, normalized by the update's counts from the
        plan (`plancc.runtime.preference_loss`)."""
        outputs, logits = plan_forward(model, inputs, explicit_mask=self.explicit_mask)
        loss = preference_loss(sequence_logps(logits, inputs), self._reference(inputs), inputs,
                               loss_type=self.plan_loss_type, beta=self.beta, world_size=self.args.world_size,
                               **self._loss_options(inputs))
        return (loss, outputs) if return_outputs else loss

    def plan_eval_metrics(self, model: Any, loader: Any, plan: Plan, prefix: str) -> dict[str, float]:
        """`<prefix>_loss`: the exact pair (KTO: completion) mean over the eval plan on every rank; `<prefix>_pairs`
        (or `_completions`) its count, and `<prefix>_rewards/accuracies` (`<prefix>_kl` for KTO)."""
        distributed = self.args.world_size > 1
        totals, kl = preference_eval_totals(model, self.ref_model, loader, loss_type=self.plan_loss_type,
                                            beta=self.beta, explicit_mask=self.explicit_mask,
                                            distributed=distributed, **self._loss_options({}))
        result = preference_eval_result(totals, plan, self.plan_loss_type, distributed=distributed, kl=kl)
        if result.reward_accuracy is None:
            return {f"{prefix}_loss": result.loss, f"{prefix}_completions": result.items, f"{prefix}_kl": kl}
        return {f"{prefix}_loss": result.loss, f"{prefix}_pairs": result.items,
                f"{prefix}_rewards/accuracies": result.reward_accuracy}


class PlanDPOTrainer(_PlanPreference, DPOTrainer):
    """TRL's `DPOTrainer` on a plancc preference plan (see module docstring). Keyword arguments as
    `PlanSFTTrainer`'s (`plan`, `tokens`, `verify`, `allow_dataset_change`, `pad_token_id`, `explicit_mask`),
    `loss_options` (simpo's `gamma`), plus DPOTrainer's."""

    def __init__(self, *args: Any, plan: str | Path | Plan, processing_class: Any, tokens: TokenStore | None = None,
                 verify: str = "hash", allow_dataset_change: bool = False, pad_token_id: int | None = None,
                 loss_options: dict[str, Any] | None = None, **kwargs: Any):
        config = _config(args, kwargs, DPOConfig)
        loss_types = list(config.loss_type)
        if len(loss_types) != 1 or loss_types[0] not in DPO_LOSS_TYPES or config.loss_weights:
            raise PlanMismatchError(f"loss_type {loss_types}: PlanDPOTrainer trains one of "
                                    f"{', '.join(DPO_LOSS_TYPES)} (kto: PlanKTOTrainer)")
        for name, value, plain in (("ld_alpha", config.ld_alpha, None), ("use_weighting", config.use_weighting, False),
                                   ("f_divergence_type", config.f_divergence_type, "reverse_kl")):
            if value != plain:
                raise PlanMismatchError(f"{name}={value!r} changes the objective the plan counts for; PlanDPOTrainer "
                                        f"trains the plain pair mean ({name}={plain!r})")
        self.plan_options = dict(loss_options or {})
        if loss_types[0] == "simpo":
            self.plan_options.setdefault("label_smoothing", config.label_smoothing)
        kwargs = self._setup(args, kwargs, plan=plan, processing_class=processing_class, tokens=tokens, verify=verify,
                             allow_dataset_change=allow_dataset_change, pad_token_id=pad_token_id,
                             loss_type=loss_types[0])
        super().__init__(*args, **kwargs)

    def _loss_options(self, inputs: dict[str, Any]) -> dict[str, Any]:
        return self.plan_options


class PlanKTOTrainer(_PlanPreference, KTOTrainer):
    """TRL's `KTOTrainer` on a plancc unpaired preference plan (see module docstring): keyword arguments as
    `PlanDPOTrainer`'s. `per_device_train_batch_size` is the plan's business (TRL's check that it exceeds 1 is
    met, and batches come from the plan)."""

    data_kind = "unpaired_preference"

    def __init__(self, *args: Any, plan: str | Path | Plan, processing_class: Any, tokens: TokenStore | None = None,
                 verify: str = "hash", allow_dataset_change: bool = False, pad_token_id: int | None = None,
                 **kwargs: Any):
        config = _config(args, kwargs, KTOConfig)
        if config.loss_type != "kto":
            raise PlanMismatchError(f"loss_type {config.loss_type!r}: PlanKTOTrainer trains kto")
        config.per_device_train_batch_size = max(config.per_device_train_batch_size, 2)  # TRL's check; unused
        kwargs = self._setup(args, kwargs, plan=plan, processing_class=processing_class, tokens=tokens, verify=verify,
                             allow_dataset_change=allow_dataset_change, pad_token_id=pad_token_id, loss_type="kto")
        super().__init__(*args, **kwargs)

    def get_batch_samples(self, epoch_iterator, num_batches, device):
        """One plan update's batches (`PlanTrainer.get_batch_samples`), each given the update's KL reference
        point, taken over all of them on every rank before the first micro-step."""
        batches, num_items = super().get_batch_samples(epoch_iterator, num_batches, device)
        if batches:
            model = self.model_wrapped if self.model_wrapped is not None else self.model
            with torch.no_grad():
                terms = [(batch_logps(getattr(model, "module", model), b["kl"], explicit_mask=self.explicit_mask)[0],
                          batch_logps(self.ref_model, b["kl"], explicit_mask=self.explicit_mask)[0]) for b in batches]
            kl = kl_reference_point([p for p, _ in terms], [r for _, r in terms])
            for b in batches:
                b["kto_kl"] = kl
        return batches, num_items

    def _loss_options(self, inputs: dict[str, Any]) -> dict[str, Any]:
        options = {"desirable_weight": self.desirable_weight, "undesirable_weight": self.undesirable_weight}
        return {**options, "kl": inputs["kto_kl"]} if "kto_kl" in inputs else options


__all__ = ["PlanDPOTrainer", "PlanKTOTrainer"]

"""The exact eval loss of a preference plan's eval plan: the pair mean (or, for KTO, the completion mean) over the
whole eval set on every rank, and the reward accuracy (docs/preference.md).

Each rank sums its share of the eval plan's per-pair losses (and ORPO's chosen-completion NLL and targets) and
counts its pairs and the pairs whose chosen completion earns the higher reward; one all-reduce of these totals
gives the eval set's figures, and the pair count must equal the one the plan stores. A mean of per-batch means
would weigh a pair of a small batch more than one of a large batch, as in training. KTO's KL reference point is
taken over the whole eval set, first (one more pass and all-reduce).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from plancc.errors import PlanMismatchError
from plancc.runtime.collator import PlanCollator
from plancc.runtime.data import TokenStore, load_tokens
from plancc.runtime.evaluate import plan_forward
from plancc.runtime.loader import PlanDataset, eval_loader
from plancc.runtime.preference import REFERENCE_FREE, kl_reference_point, preference_terms, sequence_logps
from plancc.runtime.sampler import PlanEvalSampler
from plancc.store.plan import Plan, eval_counts, verified_plan

TOTALS = ("loss_sum", "nll_sum", "chosen_targets", "correct", "items")


@dataclass(frozen=True)
class PreferenceEvalResult:
    """The eval set's preference loss (its pair mean: `items` pairs, or completions for KTO), the share of pairs
    whose chosen completion earns the higher reward (None for KTO) and KTO's KL reference point (None else)."""

    loss: float
    reward_accuracy: float | None
    items: int
    kl: float | None = None


def _device(model: torch.nn.Module) -> torch.device:
    first = next(getattr(model, "module", model).parameters(), None)
    return first.device if first is not None else torch.device("cpu")


def batch_logps(model: torch.nn.Module, batch: dict[str, Any], *, explicit_mask: bool = False
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """`sequence_logps` of `model` on a collated batch, moved to the model's device first."""
    device = _device(model)
    on_device = {k: v.to(device) if torch.is_tensor(v) else v for k, v in batch.items()}
    return sequence_logps(plan_forward(model, on_device, explicit_mask=explicit_mask)[1], on_device)


def _all_reduce(totals: torch.Tensor, distributed: bool) -> torch.Tensor:
    if distributed:
        import torch.distributed as dist

        dist.all_reduce(totals)
    return totals


def preference_eval_totals(model: torch.nn.Module, ref_model: torch.nn.Module | None, batches, *,
                           loss_type: str = "sigmoid", beta: float = 0.1, explicit_mask: bool = False,
                           distributed: bool = False, **kw: Any) -> tuple[torch.Tensor, float | None]:
    """(`TOTALS` over `batches` as a float64 vector, all-reduced when `distributed`; KTO's KL reference point over
    all of them, else None), the models in eval mode."""
    batches = list(batches)
    models = [m for m in (model, ref_model) if m is not None]
    modes = [m.training for m in models]
    for m in models:
        m.eval()
    totals = torch.zeros(len(TOTALS), dtype=torch.float64, device=_device(model))
    kl = None
    try:
        with torch.no_grad():
            if loss_type == "kto":
                kl_terms = [(batch_logps(model, b["kl"], explicit_mask=explicit_mask)[0],
                             batch_logps(ref_model, b["kl"], explicit_mask=explicit_mask)[0]) for b in batches]
                kw["kl"] = kl_reference_point([p for p, _ in kl_terms], [r for _, r in kl_terms])
                kl = float(kw["kl"])
            for b in batches:  # placeholders too: every rank runs the same forwards (sharded models)
                policy = batch_logps(model, b, explicit_mask=explicit_mask)
                reference = None if loss_type in REFERENCE_FREE else batch_logps(ref_model, b,
                                                                                 explicit_mask=explicit_mask)
                terms = preference_terms(policy, reference, b, loss_type=loss_type, beta=beta, **kw)
                totals[0] += terms.per_item.double().sum()
                if terms.nll is not None:
                    totals[1] += terms.nll.double()
                    totals[2] += int(policy[1][b["chosen_index"].to(policy[1].device)].sum())
                if loss_type == "kto":
                    totals[4] += int(b["num_sequences"])
                else:
                    totals[3] += int((terms.rewards[0] > terms.rewards[1]).sum())
                    totals[4] += int(b["chosen_index"].shape[0])
    finally:
        for m, mode in zip(models, modes, strict=True):
            m.train(mode)
    return _all_reduce(totals, distributed), kl


def preference_eval_result(totals: torch.Tensor, plan: Plan, loss_type: str, *, distributed: bool,
                           kl: float | None = None) -> PreferenceEvalResult:
    """The eval figures from all-reduced `TOTALS`; under `distributed`, the count is checked against the plan's."""
    loss_sum, nll_sum, chosen_targets, correct, items = (float(x) for x in totals)
    items = round(items)
    expected = sum(eval_counts(plan.manifest).values())
    if distributed and items != expected:
        raise PlanMismatchError(f"the ranks evaluated {items} {'completions' if loss_type == 'kto' else 'pairs'} "
                                f"but the eval plan holds {expected}: every rank must evaluate its share")
    loss = loss_sum / max(items, 1) + (nll_sum / max(chosen_targets, 1.0) if loss_type == "orpo" else 0.0)
    accuracy = None if loss_type == "kto" else correct / max(items, 1)
    return PreferenceEvalResult(loss, accuracy, items, kl)


def _distributed() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def evaluate_preference(model: torch.nn.Module, ref_model: torch.nn.Module | None, plan: str | Path | Plan,
                        tokens: TokenStore | None = None, *, loss_type: str = "sigmoid", beta: float = 0.1,
                        rank: int | None = None, world_size: int | None = None, pad_token_id: int = 0,
                        explicit_mask: bool = False, loader_kwargs: dict[str, Any] | None = None,
                        **kw: Any) -> PreferenceEvalResult:
    """The eval figures of `model` (against `ref_model`; None for simpo and orpo) over `plan`'s eval plan (module
    docstring): this rank's share, then one all-reduce when torch.distributed runs with more than one process.
    `kw`: the loss's options (`preference_loss`)."""
    plan = verified_plan(plan)
    plan.eval()  # refused, saying how to compile one, for a plan without an eval plan
    tokens = load_tokens(plan) if tokens is None else tokens
    sampler = PlanEvalSampler(plan, rank=rank, world_size=world_size)
    loader = eval_loader(PlanDataset(tokens, PlanCollator.from_plan(plan, pad_token_id=pad_token_id)), sampler,
                         **(loader_kwargs or {}))
    distributed = _distributed() and sampler.world_size > 1
    totals, kl = preference_eval_totals(model, ref_model, loader, loss_type=loss_type, beta=beta,
                                        explicit_mask=explicit_mask, distributed=distributed, **kw)
    return preference_eval_result(totals, plan, loss_type, distributed=distributed, kl=kl)


__all__ = ["PreferenceEvalResult", "batch_logps", "evaluate_preference", "preference_eval_result",
           "preference_eval_totals"]

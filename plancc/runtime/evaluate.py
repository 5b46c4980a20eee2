"""The exact eval loss of a plan's eval plan: the token mean of CE over every held-out target on every rank.

    result = evaluate_plan(model, plan_dir)            # under torch.distributed: each rank runs its share
    result.loss                                        # sum of CE over all ranks / the plan's eval target count

A mean of per-batch means weighs a target of a short batch more than one of a long batch (the bug the training
loss avoids, `plancc.runtime.loss`). Here each rank sums CE (fp32 per batch, accumulated in fp64) and counts
targets over its share of the eval plan (`PlanEvalSampler`), then one all-reduce of (sum, count) gives the
global totals; the count must equal the eval target count the plan stores, so a rank that skipped or repeated a
microbatch is an error, not a silently different mean.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from plancc.errors import PlanMismatchError
from plancc.runtime.collator import PlanCollator
from plancc.runtime.data import TokenStore, load_tokens
from plancc.runtime.forward import microbatch_loss, plan_forward
from plancc.runtime.loader import PlanDataset, eval_loader
from plancc.runtime.sampler import PlanEvalSampler
from plancc.store.plan import Plan, verified_plan


@dataclass(frozen=True)
class EvalResult:
    """The eval set's token-mean loss and the totals it is made of (over every rank when distributed)."""

    loss: float
    loss_sum: float
    targets: int


def _device(model: torch.nn.Module) -> torch.device:
    first = next(getattr(model, "module", model).parameters(), None)
    return first.device if first is not None else torch.device("cpu")


def batch_loss_sum(model: torch.nn.Module, batch: dict[str, Any], *, explicit_mask: bool = False,
                   loss: str = "chunked") -> torch.Tensor:
    """Sum of CE over one collated batch, moved to the model's device first, by the `loss` path
    (`plancc.runtime.forward`: a count of 1 turns the token mean into the sum)."""
    device = _device(model)
    on_device = {k: v.to(device) if torch.is_tensor(v) else v for k, v in batch.items()}
    return microbatch_loss(model, on_device, 1, path=loss, explicit_mask=explicit_mask)[1]


def eval_totals(model: torch.nn.Module, batches, *, explicit_mask: bool = False, loss: str = "chunked") -> torch.Tensor:
    """(sum of CE, targets) over `batches` as a float64 pair on the model's device, the model in eval mode."""
    totals = torch.zeros(2, dtype=torch.float64, device=_device(model))
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for batch in batches:  # placeholders too: every rank runs the same forwards (sharded models)
                totals[0] += batch_loss_sum(model, batch, explicit_mask=explicit_mask, loss=loss).double()
                totals[1] += int(batch["label_count"])
    finally:
        model.train(was_training)
    return totals


def eval_result(totals: torch.Tensor, plan: Plan, *, distributed: bool) -> EvalResult:
    """All-reduce the (sum, targets) pair once when `distributed`, check the count against the plan's, and
    divide: the exact token mean."""
    if distributed:
        import torch.distributed as dist

        dist.all_reduce(totals)
    loss_sum, targets = float(totals[0]), round(float(totals[1]))
    want = plan.eval().total_label_count
    if distributed and targets != want:
        raise PlanMismatchError(f"the ranks evaluated {targets} targets but the eval plan holds {want}: every rank "
                                "must evaluate its share (same world size)")
    return EvalResult(loss_sum / max(targets, 1), loss_sum, targets)


def _distributed() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def evaluate_plan(model: torch.nn.Module, plan: str | Path | Plan, tokens: TokenStore | None = None, *,
                  rank: int | None = None, world_size: int | None = None, pad_token_id: int = 0,
                  explicit_mask: bool = False, loss: str = "chunked", **loader_kwargs: Any) -> EvalResult:
    """The eval loss of `model` over `plan`'s eval plan (see module docstring): this rank's share, then one
    all-reduce when torch.distributed runs with more than one process. `tokens` default to the plan's data.
    Without torch.distributed, `rank`/`world_size` pick one share and the result covers that share only. `loss`:
    how each batch's CE is computed (`plancc.runtime.forward.LOSS_PATHS`; all give the same sum)."""
    plan = verified_plan(plan)
    if plan.manifest.data_kind != "sft":
        raise PlanMismatchError(f"{plan.path} holds {plan.manifest.data_kind} data: its eval loss is a pair mean, not a token "
                                "mean; use plancc.runtime.preference_eval.evaluate_preference")
    tokens = load_tokens(plan) if tokens is None else tokens
    sampler = PlanEvalSampler(plan, rank=rank, world_size=world_size)
    loader = eval_loader(PlanDataset(tokens, PlanCollator.from_plan(plan, pad_token_id=pad_token_id)), sampler,
                         **loader_kwargs)
    totals = eval_totals(model, loader, explicit_mask=explicit_mask, loss=loss)
    return eval_result(totals, plan, distributed=_distributed() and sampler.world_size > 1)


__all__ = ["EvalResult", "batch_loss_sum", "eval_result", "eval_totals", "evaluate_plan", "plan_forward"]

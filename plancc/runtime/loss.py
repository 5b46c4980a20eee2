"""The token-mean loss of an optimizer step, split over microbatches and ranks (seed 002's fix, automatic).

For update `u` with `N` supervised targets over all its microbatches and ranks (the plan's `num_items`), the
objective is `L = (1/N) * sum over every target of CE`. Each microbatch contributes `sum(CE) / N`; DDP averages
gradients over `W` ranks, so each rank multiplies by `W` to undo the mean. Summing the microbatch gradients of
all ranks then gives exactly the gradient of `L`, whatever the per-microbatch target counts::

    loss = token_loss(logits, batch["shift_labels"], batch["num_items_in_batch"], world_size=W)
    loss.backward()          # accumulate; optimizer.step() after the update's last micro-step

`N` comes from the plan, so no collective is needed. Logits are upcast to fp32 before the softmax.
`plancc.runtime.forward` gets the same loss without every token's logits (the chunked path) or from the
model's own loss function.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from plancc.core.plan_arrays import IGNORE_INDEX


def token_loss_sum(logits: torch.Tensor, shift_labels: torch.Tensor) -> torch.Tensor:
    """Sum of per-target cross entropy in fp32 (`shift_labels[t]` is the target of `logits[t]`)."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(),
                           shift_labels.reshape(-1).to(logits.device), ignore_index=IGNORE_INDEX, reduction="sum")


def token_mean(loss_sum: torch.Tensor, num_items_in_batch: torch.Tensor | int, *, world_size: int = 1) -> torch.Tensor:
    """A microbatch's CE sum as its share of the update's token mean: sum / num_items * world_size (an update
    with no targets at all, every sample unsupervised, gives 0, not NaN)."""
    return loss_sum * world_size / plan_count(num_items_in_batch, loss_sum.device)


def plan_count(num_items_in_batch: torch.Tensor | int, device: torch.device | None = None) -> torch.Tensor | float:
    """The update's target count as the divisor of its loss: at least 1, fp32 on `device` when a tensor."""
    if torch.is_tensor(num_items_in_batch):
        return num_items_in_batch.to(device).clamp_min(1).to(torch.float32)
    return float(max(int(num_items_in_batch), 1))


def token_loss(logits: torch.Tensor, shift_labels: torch.Tensor, num_items_in_batch: torch.Tensor | int, *,
               world_size: int = 1) -> torch.Tensor:
    """This microbatch's share of the update's token-mean loss: sum(CE) / num_items * world_size."""
    return token_mean(token_loss_sum(logits, shift_labels), num_items_in_batch, world_size=world_size)


__all__ = ["plan_count", "token_loss", "token_loss_sum", "token_mean"]

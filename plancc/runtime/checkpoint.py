"""Checkpoint bookkeeping: the sampler state plus what makes it exact, and a validity flag when it cannot be.

At an update boundary the sampler position alone resumes exactly (the optimizer has stepped; gradients are
zero). Mid-update, the gradients accumulated so far belong to the checkpoint too: `checkpoint_state(sampler,
model=model)` saves them (each rank its own, before DDP's all-reduce). Without a model, a mid-update state is
recorded as invalid, and `restore_checkpoint_state` refuses it with a message instead of silently restarting the
update::

    ckpt = {"model": model.state_dict(), "optim": optim.state_dict(), "data": checkpoint_state(sampler, model=model)}
    ...
    restore_checkpoint_state(ckpt["data"], sampler, model=model)
"""

from __future__ import annotations

from typing import Any

import torch

from plancc.runtime.plan import PlanMismatchError
from plancc.runtime.sampler import PlanSampler


def _unwrap(model: torch.nn.Module) -> torch.nn.Module:
    return getattr(model, "module", model)


def checkpoint_state(sampler: PlanSampler, *, model: torch.nn.Module | None = None) -> dict[str, Any]:
    """The data side of a checkpoint: sampler state, and the accumulated gradients when taken mid-update."""
    state = sampler.state_dict()
    out: dict[str, Any] = {"sampler": state, "grads": None}
    if state["valid"] and not state["at_update_boundary"]:
        if model is None:
            state["valid"] = False
            state["invalid_reason"] = (f"saved mid-update (update {state['update']}, micro-step "
                                       f"{state['micro_step']}) without the gradients accumulated so far")
        else:
            out["grads"] = {name: (None if p.grad is None else p.grad.detach().clone())
                            for name, p in _unwrap(model).named_parameters()}
    return out


def restore_checkpoint_state(ckpt: dict[str, Any], sampler: PlanSampler, *, model: torch.nn.Module | None = None,
                             allow_dataset_change: bool = False) -> None:
    """Resume `sampler` (and a mid-update model's accumulated gradients) from `checkpoint_state`'s output."""
    sampler.load_state_dict(ckpt["sampler"], allow_dataset_change=allow_dataset_change)
    grads = ckpt.get("grads")
    if grads is None:
        return
    if model is None:
        raise PlanMismatchError("this checkpoint was taken mid-update: pass model= to restore its accumulated "
                                "gradients, or resume from a checkpoint taken at an optimizer step")
    for name, p in _unwrap(model).named_parameters():
        g = grads.get(name)
        p.grad = None if g is None else g.to(p.device).clone()

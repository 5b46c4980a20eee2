"""Sharded (FSDP2, `fully_shard`) model and optimizer state in plancc checkpoints: each rank saves its own shards.

`save_checkpoint` already writes one tensor file per rank beside that rank's sampler state, so a sharded model
needs no gather: each rank saves the local shard of every DTensor (plain tensors, read back with
`weights_only=True`; no pickle) and, on resume, puts them back into the same sharding::

    save_checkpoint(ckpt, step, {"model": local_shards(model.state_dict()),
                                 "optim": local_shards(opt.state_dict())}, sampler=sampler)
    r = load_checkpoint(ckpt, sampler=sampler)
    model.load_state_dict(restore_shards(r.state["model"], model.state_dict()))
    opt.load_state_dict(restore_optimizer_shards(r.state["optim"], opt))

Resume needs the same world size and sharding (the sampler refuses another world size anyway).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.tensor import DTensor


def local_shards(state: Any) -> Any:
    """`state` (nested dicts, lists, tensors) with every DTensor replaced by this rank's shard of it."""
    if isinstance(state, DTensor):
        return state.to_local().detach().clone()
    if isinstance(state, dict):
        return {k: local_shards(v) for k, v in state.items()}
    if isinstance(state, list | tuple):
        return type(state)(local_shards(v) for v in state)
    return state


def _shard_like(local: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    if not isinstance(like, DTensor):
        return local
    if local.shape != like.to_local().shape:
        raise ValueError(f"a saved shard of shape {tuple(local.shape)} does not fit this rank's shard of shape "
                         f"{tuple(like.to_local().shape)}: resume with the world size and sharding it was saved with")
    return DTensor.from_local(local.to(like.device), like.device_mesh, like.placements, shape=like.shape,
                              stride=like.stride())


def restore_shards(saved: dict[str, Any], like: dict[str, Any]) -> dict[str, Any]:
    """A model state dict from `local_shards` output, each tensor sharded as its counterpart in `like` (the model's
    own `state_dict()`)."""
    return {k: _shard_like(v, like[k]) if torch.is_tensor(v) and k in like else v for k, v in saved.items()}


def restore_optimizer_shards(saved: dict[str, Any], optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """An optimizer state dict from `local_shards` output, each per-parameter tensor of the parameter's shape
    sharded as that parameter (scalars such as Adam's `step` stay as saved)."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    state = {}
    for index, values in saved["state"].items():
        param = params[int(index)]
        local = param.to_local() if isinstance(param, DTensor) else param
        state[index] = {k: _shard_like(v, param) if torch.is_tensor(v) and v.shape == local.shape and v.dim() else v
                        for k, v in values.items()}
    return {**saved, "state": state}


__all__ = ["local_shards", "restore_optimizer_shards", "restore_shards"]

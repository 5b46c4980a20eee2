"""One microbatch through a Hugging Face causal LM to its share of the update's token-mean loss, by one of three
paths that give the same number (fp32, relative 1e-5):

- `"chunked"` (the default): the model runs as usual up to its output head, which is handed an empty slice of
  the hidden states (a forward pre-hook), so no logits are built; the hook computes the loss from the hidden
  states and the head's weight a chunk of tokens at a time (`plancc.runtime.chunked_loss`). The hook runs inside
  the model's own forward (DDP's and FSDP's hooks see a normal forward, the head's weight is gathered), so it
  works on a wrapped model. Needs a plain `nn.Linear` head (not a PEFT adapter on it);
- `"logits"`: the full logits, then `token_loss_sum` (fp32 over every token: the memory the chunked path saves);
- `"model"`: the model's own loss, handed `labels`, `shift_labels` and the plan's `num_items_in_batch`, so that
  Hugging Face's loss function (sum / num_items_in_batch), or whatever kernel patched into the model's forward
  reads them (Liger's fused linear cross entropy, cut-cross-entropy), computes the exact token mean.

A user's `compute_loss_func(outputs, labels, num_items_in_batch=N)` (the `Trainer` convention: it returns
sum / N) gets the model's outputs (with logits) and the plan's count.
Every path's result is multiplied by the world size, which undoes the data-parallel gradient mean
(`plancc.runtime.loss`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch

from plancc.errors import PlanMismatchError
from plancc.runtime.chunked_loss import chunked_loss_sum, head_transform
from plancc.runtime.collator import model_inputs
from plancc.runtime.loss import plan_count, token_loss_sum, token_mean

LOSS_PATHS = ("chunked", "logits", "model")


def _inner(model: torch.nn.Module) -> torch.nn.Module:
    return getattr(model, "module", model)  # DDP keeps the model as .module; FSDP2 shards it in place


def plan_forward(model: torch.nn.Module, batch: dict[str, Any], *, explicit_mask: bool = False,
                 **extra: Any) -> tuple[Any, Any]:
    """(outputs, logits) of a Hugging Face causal LM (DDP-wrapped or not) on one collated batch, called with
    `model_inputs` for its attention implementation (training and evaluation call it alike) plus `extra`."""
    inner = _inner(model)
    attn = getattr(getattr(inner, "config", None), "_attn_implementation", None)
    outputs = model(**model_inputs(batch, attn, explicit_mask=explicit_mask,
                                   dtype=getattr(inner, "dtype", torch.float32)), **extra)
    return outputs, (outputs.get("logits") if isinstance(outputs, dict) else outputs[0])


def output_head(model: torch.nn.Module) -> torch.nn.Linear:
    """The model's output head (`get_output_embeddings()`), refused unless it is a plain `nn.Linear`."""
    inner = _inner(model)
    head = inner.get_output_embeddings() if hasattr(inner, "get_output_embeddings") else None
    if type(head) is not torch.nn.Linear:
        raise PlanMismatchError(
            f"the chunked loss needs the model's output head as a plain torch.nn.Linear, got {type(head).__name__}; "
            "use loss='logits' (full logits) or loss='model' (the model's own loss function)")
    return head


@contextlib.contextmanager
def _loss_at_head(model: torch.nn.Module, shift_labels: torch.Tensor, found: list):
    """While active, the model's head computes the chunked CE sum of its input into `found` and passes on an empty
    slice (so the model builds no logits)."""
    head = output_head(model)
    scale, softcap = head_transform(_inner(model).config)

    def hook(module, args):
        hidden = args[0]
        if hidden.shape[:-1] != shift_labels.shape:
            raise PlanMismatchError(f"the output head got hidden states of shape {tuple(hidden.shape)} for labels "
                                    f"of shape {tuple(shift_labels.shape)}; use loss='logits'")
        found.append(chunked_loss_sum(hidden, module.weight, shift_labels, bias=module.bias, scale=scale,
                                      softcap=softcap))
        return (hidden[..., :0, :], *args[1:])

    handle = head.register_forward_pre_hook(hook)
    try:
        yield
    finally:
        handle.remove()


def forward_loss_sum(model: torch.nn.Module, batch: dict[str, Any], *, path: str = "chunked",
                     explicit_mask: bool = False) -> tuple[Any, torch.Tensor]:
    """(outputs, sum of CE in fp32) over one collated batch by the `"chunked"` or `"logits"` path (the chunked
    path's outputs hold empty logits)."""
    if path == "logits":
        outputs, logits = plan_forward(model, batch, explicit_mask=explicit_mask)
        return outputs, token_loss_sum(logits, batch["shift_labels"])
    if path != "chunked":
        raise ValueError(f"forward_loss_sum takes path 'chunked' or 'logits', not {path!r}")
    found: list[torch.Tensor] = []
    with _loss_at_head(model, batch["shift_labels"], found):
        outputs, _ = plan_forward(model, batch, explicit_mask=explicit_mask)
    if len(found) != 1:
        raise PlanMismatchError(f"the model called its output head {len(found)} times in one forward; use "
                                "loss='logits'")
    return outputs, found[0]


def microbatch_loss(model: torch.nn.Module, batch: dict[str, Any], num_items_in_batch: torch.Tensor | int, *,
                    path: str = "chunked", world_size: int = 1, explicit_mask: bool = False,
                    compute_loss_func: Callable | None = None) -> tuple[Any, torch.Tensor]:
    """(outputs, this microbatch's share of the update's token-mean loss x `world_size`) by `path` (see module
    docstring), or by `compute_loss_func` when given."""
    if path not in LOSS_PATHS:
        raise ValueError(f"unknown loss path {path!r}: choose one of {', '.join(LOSS_PATHS)}")
    count = plan_count(num_items_in_batch, batch["input_ids"].device)
    if compute_loss_func is not None:
        outputs, _ = plan_forward(model, batch, explicit_mask=explicit_mask)
        return outputs, compute_loss_func(outputs, batch["labels"], num_items_in_batch=count) * world_size
    if path == "model":
        outputs, _ = plan_forward(model, batch, explicit_mask=explicit_mask, labels=batch["labels"],
                                  shift_labels=batch["shift_labels"], num_items_in_batch=count)
        return outputs, outputs["loss"] * world_size
    outputs, loss_sum = forward_loss_sum(model, batch, path=path, explicit_mask=explicit_mask)
    return outputs, token_mean(loss_sum, num_items_in_batch, world_size=world_size)


__all__ = ["LOSS_PATHS", "forward_loss_sum", "microbatch_loss", "output_head", "plan_forward"]

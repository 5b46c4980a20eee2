"""Preference losses whose accumulated gradient is exactly the loss over the whole update (docs/preference.md).

A preference loss is a mean over an update's pairs (or, for KTO, its completions), not over tokens. Split over
micro-steps and ranks, a per-microbatch pair mean weighs each pair by how many others shared its microbatch; with
packing that count varies. Here each microbatch contributes `sum of its pairs' losses / N`, N the update's pair
count on every rank (`num_pairs_in_batch`, read from the plan: no collective), times the world size to undo DDP's
mean; summed over the update's micro-steps and ranks that is the gradient of the pair mean::

    policy = sequence_logps(model(**model_inputs(batch)).logits, batch)
    with torch.no_grad():
        reference = sequence_logps(ref_model(**model_inputs(batch)).logits, batch)
    preference_loss(policy, reference, batch, loss_type="sigmoid", beta=0.1, world_size=W).backward()

Per pair (log-probs summed over a completion's targets, `n` its target count; c chosen, r rejected; `rho` the
reference's; TRL's definitions):

    sigmoid (DPO)  -log sigmoid(beta * ((pi_c - rho_c) - (pi_r - rho_r)))
    hinge          relu(1 - beta * ((pi_c - rho_c) - (pi_r - rho_r)))
    ipo            ((pi_c - rho_c) / n_c - (pi_r - rho_r) / n_r - 1 / (2 beta))^2
    simpo          -log sigmoid(beta * (pi_c / n_c - pi_r / n_r) - gamma)         reference-free
    orpo           -beta * log sigmoid(log odds(pi_c / n_c) - log odds(pi_r / n_r)) reference-free, plus the NLL of
                   the chosen completions: -sum(pi_c) / the update's chosen targets (`num_chosen_items_in_batch`)

`simpo` takes `label_smoothing` (default 0) as TRL's CPO trainer does; `orpo`'s `beta` is TRL's ORPO `beta` (the
paper's lambda). KTO (unpaired data, per completion, z the KL reference point of the update: `kl_reference_point`):

    desirable      desirable_weight * (1 - sigmoid(beta * ((pi - rho) - z)))
    undesirable    undesirable_weight * (1 - sigmoid(beta * (z - (pi - rho))))

averaged over the update's completions (`num_desirable_in_batch + num_undesirable_in_batch`). Reference
log-probs are taken as constants (detached).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from plancc.core.plan_arrays import IGNORE_INDEX

LOSS_TYPES = ("sigmoid", "hinge", "ipo", "simpo", "orpo", "kto")
REFERENCE_FREE = ("simpo", "orpo")
_OPTIONS = {"simpo": {"gamma": 0.5, "label_smoothing": 0.0}, "kto": {"kl": 0.0, "desirable_weight": 1.0,
                                                                     "undesirable_weight": 1.0}}


def sequence_logps(logits: torch.Tensor, batch: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """(log-probs, targets) of every sequence of the batch, in batch order: the sum of its targets' log-probs
    (fp32, or the logits' dtype when wider) and how many targets it has, for every layout and shift (`batch["target_sequence"]` says whose target
    each position is)."""
    labels = batch["shift_labels"].to(logits.device).reshape(-1)
    owner = batch["target_sequence"].to(logits.device).reshape(-1)
    n = int(batch["num_sequences"])
    dtype = torch.promote_types(logits.dtype, torch.float32)  # fp32 at least
    per_token = -F.cross_entropy(logits.reshape(-1, logits.shape[-1]).to(dtype), labels, ignore_index=IGNORE_INDEX,
                                 reduction="none")
    keep = owner >= 0
    # summed in float64: a sequence's sum runs to thousands, where fp32's rounding of a long sum would move a DPO
    # margin (a difference of such sums) by more than its own last bit
    sums = torch.zeros(n, dtype=torch.float64, device=logits.device).index_add(0, owner[keep], per_token[keep].double())
    return sums.to(dtype), torch.bincount(owner[keep], minlength=n)


@dataclass(frozen=True)
class Terms:
    """One microbatch's share of a preference loss before normalization: `per_item` (each pair's loss, or each
    completion's for KTO), `nll` (ORPO: the chosen completions' summed NLL, else None) and `rewards` (per pair,
    chosen and rejected: what reward accuracy compares; per completion for KTO)."""

    per_item: torch.Tensor
    nll: torch.Tensor | None
    rewards: tuple[torch.Tensor, torch.Tensor]


def _options(loss_type: str, kw: dict[str, Any]) -> dict[str, Any]:
    if loss_type not in LOSS_TYPES:
        raise ValueError(f"loss_type {loss_type!r}: expected one of {', '.join(LOSS_TYPES)}")
    allowed = _OPTIONS.get(loss_type, {})
    unknown = sorted(set(kw) - set(allowed))
    if unknown:
        raise TypeError(f"preference_loss(loss_type={loss_type!r}) takes no option {unknown[0]!r}"
                        + (f" (options: {', '.join(allowed)})" if allowed else ""))
    return {**allowed, **kw}


def _log1mexp(x: torch.Tensor) -> torch.Tensor:
    """log(1 - exp(x)) for x < 0, stable on both sides of -log 2."""
    return torch.where(x < -0.6931471805599453, torch.log1p(-torch.exp(x)), torch.log(-torch.expm1(x)))


def preference_terms(policy: tuple[torch.Tensor, torch.Tensor], reference: tuple[torch.Tensor, torch.Tensor] | None,
                     batch: dict[str, Any], *, loss_type: str = "sigmoid", beta: float = 0.1, **kw: Any) -> Terms:
    """The unnormalized terms of `preference_loss` for one microbatch (module docstring)."""
    opts = _options(loss_type, kw)
    if reference is None and loss_type not in REFERENCE_FREE:
        raise ValueError(f"loss_type {loss_type!r} needs the reference model's sequence_logps")
    logps, counts = policy
    device = logps.device
    if loss_type == "kto":
        return _kto_terms(logps, reference[0].detach().to(device), batch, beta, opts)
    ci, ri = batch["chosen_index"].to(device), batch["rejected_index"].to(device)
    pc, pr = logps[ci], logps[ri]
    if loss_type in REFERENCE_FREE:
        nc, nr = counts[ci].clamp_min(1).float(), counts[ri].clamp_min(1).float()
        ac, ar = pc / nc, pr / nr
        if loss_type == "simpo":
            h = beta * (ac - ar) - opts["gamma"]
            per = -F.logsigmoid(h) * (1 - opts["label_smoothing"]) - F.logsigmoid(-h) * opts["label_smoothing"]
            return Terms(per, None, (beta * ac.detach(), beta * ar.detach()))
        log_odds = (ac - ar) - (_log1mexp(ac) - _log1mexp(ar))
        return Terms(-beta * F.logsigmoid(log_odds), -pc.sum(), (beta * ac.detach(), beta * ar.detach()))
    ref = reference[0].detach().to(device)
    dc, dr = pc - ref[ci], pr - ref[ri]
    if loss_type == "sigmoid":
        per = -F.logsigmoid(beta * (dc - dr))
    elif loss_type == "hinge":
        per = torch.relu(1 - beta * (dc - dr))
    else:  # ipo: per-target log-ratios, as TRL normalizes them
        per = (dc / counts[ci].clamp_min(1) - dr / counts[ri].clamp_min(1) - 1 / (2 * beta)) ** 2
    return Terms(per, None, (beta * dc.detach(), beta * dr.detach()))


def _kto_terms(logps: torch.Tensor, ref: torch.Tensor, batch: dict[str, Any], beta: float,
               opts: dict[str, Any]) -> Terms:
    """KTO's per-completion losses against the update's KL reference point `opts["kl"]` (a constant)."""
    desirable = batch["desirable"].to(logps.device)
    z = torch.as_tensor(opts["kl"], dtype=logps.dtype, device=logps.device).detach()
    ratio = logps - ref
    per = torch.where(desirable, opts["desirable_weight"] * (1 - torch.sigmoid(beta * (ratio - z))),
                      opts["undesirable_weight"] * (1 - torch.sigmoid(beta * (z - ratio))))
    rewards = beta * ratio.detach()
    return Terms(per, None, (rewards[desirable], rewards[~desirable]))


def _count(batch: dict[str, Any], *names: str) -> float:
    """The update's total of batch counts `names` (at least 1: an update without any gives loss 0, not NaN)."""
    return float(max(sum(int(batch[name]) for name in names), 1))


def preference_loss(policy: tuple[torch.Tensor, torch.Tensor], reference: tuple[torch.Tensor, torch.Tensor] | None,
                    batch: dict[str, Any], *, loss_type: str = "sigmoid", beta: float = 0.1, world_size: int = 1,
                    **kw: Any) -> torch.Tensor:
    """This microbatch's share of the update's preference loss (module docstring): its pairs' (or completions')
    losses summed, divided by the update's global count from the plan, times `world_size`. `policy` and
    `reference` are `sequence_logps` results (`reference` None for simpo and orpo); `kw`: simpo's `gamma` and
    `label_smoothing`, kto's `kl` (the update's `kl_reference_point`), `desirable_weight`, `undesirable_weight`."""
    terms = preference_terms(policy, reference, batch, loss_type=loss_type, beta=beta, **kw)
    if loss_type == "kto":
        loss = terms.per_item.sum() / _count(batch, "num_desirable_in_batch", "num_undesirable_in_batch")
    else:
        loss = terms.per_item.sum() / _count(batch, "num_pairs_in_batch")
    if terms.nll is not None:
        loss = loss + terms.nll / _count(batch, "num_chosen_items_in_batch")
    return loss * world_size


def kl_reference_point(policy_kl: list[torch.Tensor], reference_kl: list[torch.Tensor]) -> torch.Tensor:
    """KTO's KL reference point z of one update: the mean over the update's KL sequences on every rank of policy
    minus reference log-probs (`sequence_logps` of each micro-step's `batch["kl"]`, this rank's micro-steps in
    `policy_kl`/`reference_kl`), clamped at 0, as TRL estimates it, but over the whole update, so that every
    micro-step of every rank uses the same z. One all-reduce when torch.distributed runs."""
    import torch.distributed as dist

    device = policy_kl[0].device if policy_kl else torch.device("cpu")
    totals = torch.zeros(2, dtype=torch.float64, device=device)
    for p, r in zip(policy_kl, reference_kl, strict=True):
        totals[0] += (p.detach() - r.detach().to(device)).double().sum()
        totals[1] += p.shape[0]
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(totals)
    return (totals[0] / totals[1].clamp_min(1)).clamp_min(0).to(policy_kl[0].dtype if policy_kl else torch.float32)


__all__ = ["LOSS_TYPES", "REFERENCE_FREE", "Terms", "kl_reference_point", "preference_loss", "preference_terms",
           "sequence_logps"]

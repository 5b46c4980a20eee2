"""Preference tests' references: an update's loss computed the plain way, one sequence at a time, independently of
plancc's batches and losses, and the same update trained on the plan's microbatches with plancc's losses.

The reference takes an update's completions from the token store by sample id (pairs matched by the samples
table's pair ids, not by the collator's indexes), runs each completion through the model on its own, and writes
each loss out from its definition (TRL's), so a wrong count, index or normalization in the runtime shows as a
gradient that differs.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import torch
import torch.nn.functional as F

from plancc.runtime import model_inputs
from plancc.runtime.preference import kl_reference_point, preference_loss, sequence_logps

BETA = 0.1
OPTIONS = {"simpo": {"gamma": 0.5}, "kto": {"desirable_weight": 1.0, "undesirable_weight": 1.33}}


# ---------------------------------------------------------------- the independent reference


def shift_targets(targets: np.ndarray, shift: str) -> np.ndarray:
    """A sequence's target at each position (the next token's label), from the store's targets."""
    if shift == "none":
        return targets
    return np.append(targets[1:], -100)


def _sequence(tokens, sid: int, shift: str) -> tuple[np.ndarray, np.ndarray]:
    a, b = int(tokens.offsets[sid]), int(tokens.offsets[sid + 1])
    return np.asarray(tokens.input_ids[a:b]), shift_targets(np.asarray(tokens.targets[a:b]), shift)


def seq_logp(model, ids: np.ndarray, targets: np.ndarray) -> tuple[torch.Tensor, int]:
    """(sum of target log-probs, targets) of one sequence, run through `model` alone."""
    logits = model(input_ids=torch.as_tensor(ids, dtype=torch.long)[None]).logits[0]
    t = torch.as_tensor(targets, dtype=torch.long)
    keep = t != -100
    return torch.log_softmax(logits, -1)[torch.arange(t.shape[0])[keep], t[keep]].double().sum(), int(keep.sum())


def one_at_a_time(model, tokens, shift: str):
    """Log-probs of a sample id: its sequence run through `model` on its own."""
    return lambda sid: seq_logp(model, *_sequence(tokens, sid, shift))


def whole_update(model, batch: dict, ids: list[int], shift: str):
    """Log-probs of a sample id, from one forward of the whole update as one batch (`batch`: the update's
    microbatches merged and collated the SFT way, `ids` its sample ids in order), read off by position: a
    sequence is the positions from where its position ids restart, its targets the next tokens' labels."""
    logits = model(**model_inputs(batch)).logits
    logp = torch.log_softmax(logits, -1)
    pos, labels = batch["position_ids"].numpy(), batch["shift_labels"].numpy()
    out, k = {}, 0
    rows = batch["rows"]
    for r in range(pos.shape[0]):
        starts = [*np.flatnonzero(pos[r] == 0).tolist(), pos.shape[1]]
        for j in range(rows[r + 1] - rows[r]):
            a, b = starts[j], starts[j + 1]
            owned = range(a - 1 if shift == "row" and a > 0 else a, b - 1 if shift == "row" else b)
            keep = [t for t in owned if labels[r, t] != -100]
            tgt = torch.as_tensor(labels[r, keep], dtype=torch.long)
            out[ids[k]] = (logp[r, keep, tgt].double().sum(), len(keep))
            k += 1
    return out.__getitem__


def reference_pair_loss(logps, ref_logps, pairs: list[tuple[int, int]], loss_type: str) -> torch.Tensor:
    """The update's pair-mean loss over `pairs` (chosen, rejected sample ids); `logps`, `ref_logps`: a sample id's
    (log-prob sum, targets) under the policy and the reference."""
    losses, nll, chosen_targets = [], 0.0, 0
    for c, r in pairs:
        (pc, nc), (pr, nr) = logps(c), logps(r)
        if loss_type in ("simpo", "orpo"):
            ac, ar = pc / max(nc, 1), pr / max(nr, 1)
            if loss_type == "simpo":
                losses.append(-F.logsigmoid(BETA * (ac - ar) - OPTIONS["simpo"]["gamma"]))
            else:
                odds = (ac - ar) - (torch.log(-torch.expm1(ac)) - torch.log(-torch.expm1(ar)))
                losses.append(-BETA * F.logsigmoid(odds))
                nll, chosen_targets = nll - pc, chosen_targets + nc
            continue
        with torch.no_grad():
            (rc, _), (rr, _) = ref_logps(c), ref_logps(r)
        margin = (pc - rc) - (pr - rr)
        if loss_type == "sigmoid":
            losses.append(-F.logsigmoid(BETA * margin))
        elif loss_type == "hinge":
            losses.append(torch.relu(1 - BETA * margin))
        else:
            losses.append(((pc - rc) / max(nc, 1) - (pr - rr) / max(nr, 1) - 1 / (2 * BETA)) ** 2)
    loss = torch.stack(losses).mean()
    return loss + nll / chosen_targets if loss_type == "orpo" else loss


def _kl_pairs(tokens, batch_ids: list[int], shift: str, sequence_len: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """TRL's KL sequences of one microbatch: prompt j + completion j-1, cut to `sequence_len`."""
    parts = []
    for k in batch_ids:
        ids, targets = _sequence(tokens, k, shift)
        labels = np.concatenate([[-100], targets[:-1]])  # the token-level labels
        first = int(np.flatnonzero(labels != -100)[0])
        parts.append((ids[:first], ids[first:], labels[first:]))
    out = []
    for j, (head, _, _) in enumerate(parts):
        _, tail, tail_labels = parts[j - 1]
        ids = np.concatenate([head, tail])[:sequence_len]
        labels = np.concatenate([np.full(head.shape[0], -100), tail_labels])[:sequence_len]
        out.append((ids, np.append(labels[1:], -100)))
    return out


def reference_kto_loss(policy, ref, logps, ref_logps, tokens, microbatches: list[list[int]],
                       desirable: dict[int, bool], shift: str, sequence_len: int) -> torch.Tensor:
    """The update's KTO loss: the KL reference point over the update's KL sequences (each run on its own), then
    the mean over its completions."""
    with torch.no_grad():
        kl = [seq_logp(policy, *s)[0] - seq_logp(ref, *s)[0]
              for mb in microbatches for s in _kl_pairs(tokens, mb, shift, sequence_len)]
        z = torch.stack(kl).mean().clamp_min(0)
    losses = []
    for k in (k for mb in microbatches for k in mb):
        p, _ = logps(k)
        with torch.no_grad():
            r, _ = ref_logps(k)
        w = OPTIONS["kto"]
        losses.append(w["desirable_weight"] * (1 - torch.sigmoid(BETA * (p - r - z))) if desirable[k]
                      else w["undesirable_weight"] * (1 - torch.sigmoid(BETA * (z - (p - r)))))
    return torch.stack(losses).mean()


def grads(model) -> torch.Tensor:
    """The model's gradient as one flat vector (zeros where a parameter has none)."""
    return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                      for p in model.parameters()]).clone()


# ---------------------------------------------------------------- the plan's way


def by_update(batches: list[dict]) -> dict[int, list[dict]]:
    """Collated batches grouped by their plan update, in order."""
    out: dict[int, list[dict]] = defaultdict(list)
    for b in batches:
        out[b["plan"]["update"]].append(b)
    return out


def plan_update(policy, ref, batches: list[dict], loss_type: str, *, world_size: int = 1, sync=None,
                naive: bool = False) -> torch.Tensor:
    """Backward of one update's micro-steps with plancc's loss (or, `naive`, each microbatch's own pair mean
    averaged over the micro-steps), gradients left accumulated in `policy`; returns the update's summed loss."""
    inner = getattr(policy, "module", policy)
    kw = dict(OPTIONS.get(loss_type, {}))
    if loss_type == "kto":
        with torch.no_grad():
            kl = [(sequence_logps(inner(**model_inputs(b["kl"])).logits, b["kl"])[0],
                   sequence_logps(ref(**model_inputs(b["kl"])).logits, b["kl"])[0]) for b in batches]
        kw["kl"] = kl_reference_point([p for p, _ in kl], [r for _, r in kl])
    total = torch.zeros(())
    for i, b in enumerate(batches):
        context = sync(i == len(batches) - 1) if sync is not None else torch.enable_grad()
        with context:
            policy_out = sequence_logps(policy(**model_inputs(b)).logits, b)
            with torch.no_grad():
                reference = None if loss_type in ("simpo", "orpo") else sequence_logps(ref(**model_inputs(b)).logits, b)
            if naive:
                b = {**b, **_own_counts(b, policy_out[1], loss_type)}
                loss = preference_loss(policy_out, reference, b, loss_type=loss_type, beta=BETA, **kw) / len(batches)
            else:
                loss = preference_loss(policy_out, reference, b, loss_type=loss_type, beta=BETA,
                                       world_size=world_size, **kw)
            loss.backward()
        total = total + loss.detach()
    return total


def _own_counts(b: dict, counts: torch.Tensor, loss_type: str) -> dict:
    """The counts a per-microbatch mean divides by: the microbatch's own (the naive loop)."""
    if loss_type == "kto":
        d = b["desirable"]
        return {"num_desirable_in_batch": int(d.sum()), "num_undesirable_in_batch": int((~d).sum())}
    return {"num_pairs_in_batch": b["num_sequences"] // 2,
            "num_chosen_items_in_batch": int(counts[b["chosen_index"]].sum())}

"""Batches of a preference plan: which sequence of a batch is whose, and the update's counts a preference loss
divides by (docs/preference.md).

A preference plan's microbatch names each pair's chosen completion and then its rejected one, side by side
(`plancc.planner.units`), so a batch of `2k` sequences holds `k` pairs::

    sequences        c0  r0  c1  r1            (batch order: the microbatch's sample ids, row by row)
    chosen_index     [0, 2]        rejected_index [1, 3]
    target_sequence  the sequence each position's target belongs to (-1: no target), in the shape of input_ids

`PreferenceFields` adds these to `PlanCollator`'s batch (the collator `PlanCollator.from_plan` makes of a
preference plan carries it), with the totals of the microbatch's whole update on
every rank, read from the plan: `num_pairs_in_batch` and `num_chosen_items_in_batch` (the chosen completions'
targets), or for unpaired (KTO) data `desirable` per sequence, `num_desirable_in_batch` and
`num_undesirable_in_batch`, and `kl`: the batch's KL sequences, each sequence's prompt followed by the previous
sequence's completion (`kl_sequences`, TRL's KTO rotation within a batch), collated alike. A microbatch whose
sequences do not pair up as the plan says is refused (the data changed since compile).
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import torch

from plancc.core.choices import Shift
from plancc.core.plan_arrays import IGNORE_INDEX
from plancc.errors import PlanMismatchError
from plancc.runtime.data import TokenStore
from plancc.runtime.sampler import Microbatch
from plancc.store.plan import Plan
from plancc.store.schemas import PAIR_ROLES

PAIRED, UNPAIRED = "preference", "unpaired_preference"


def sequence_of_positions(position_ids: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Per position of the (rows, T) batch, the batch index of the sequence it belongs to; -1 on padding. A
    sequence (and a row's pad tail) starts where its position ids restart at 0 (the collator's rule)."""
    local = np.cumsum(position_ids == 0, axis=1) - 1
    per_row = np.diff(rows)[:, None]
    return np.where(local < per_row, rows[:-1, None] + local, -1)


def target_sequences(position_ids: np.ndarray, rows: np.ndarray, shift_labels: np.ndarray, shift: str) -> np.ndarray:
    """Per position, the sequence whose token its target is (-1 where there is no target): the position's own
    sequence, or under a plain row shift the next position's (a sequence's first label, predicted by the previous
    sequence's last token, is its own)."""
    seq = sequence_of_positions(position_ids, rows)
    if shift == Shift.ROW:
        seq = np.concatenate([seq[:, 1:], np.full((seq.shape[0], 1), -1, dtype=seq.dtype)], axis=1)
    return np.where(shift_labels != IGNORE_INDEX, seq, -1)


class PreferenceFields:
    """What a preference plan's batches add to `PlanCollator`'s (module docstring), as the collator's `fields`.
    `roles`: per sample id, 1 for a chosen completion and 0 for a rejected one (paired), or 1 for desirable and 0
    for undesirable (unpaired); `pair_ids`: per sample id, its pair (paired data)."""

    def __init__(self, *, kind: str, roles: np.ndarray, pair_ids: np.ndarray | None = None,
                 sequence_len: int | None = None):
        if kind not in (PAIRED, UNPAIRED):
            raise ValueError(f"unknown preference data kind {kind!r}")
        self.kind, self.roles, self.pair_ids, self.sequence_len = kind, roles, pair_ids, sequence_len

    @classmethod
    def of_plan(cls, plan: Plan) -> PreferenceFields:
        """The fields of a verified preference plan: its samples' pairs or labels."""
        from plancc.store.parquet import sample_arrays

        s = sample_arrays(plan.samples_table())
        size = int(s.sample_id.max()) + 1 if len(s) else 0
        roles = np.zeros(size, dtype=np.int8)
        roles[s.sample_id] = s.chosen if s.kind == PAIRED else s.desirable
        pair_ids = None
        if s.kind == PAIRED:
            pair_ids = np.full(size, -1, dtype=np.int64)
            pair_ids[s.sample_id] = s.pair_id
        return cls(kind=s.kind, roles=roles, pair_ids=pair_ids, sequence_len=plan.settings.sequence_len)

    def __call__(self, collator: Any, mb: Microbatch, tokens: TokenStore, batch: dict[str, Any]) -> dict[str, Any]:
        """The fields of microbatch `mb`, whose batch `collator` made as `batch`."""
        ids = np.asarray(mb, dtype=np.int64)
        rows = np.asarray(mb.rows, dtype=np.int64) if len(mb) else np.zeros(2, dtype=np.int64)
        out: dict[str, Any] = {"target_sequence": torch.from_numpy(target_sequences(
            batch["position_ids"].numpy(), rows, batch["shift_labels"].numpy(), collator.shift)),
            "num_sequences": int(ids.shape[0])}
        counts = mb.counts
        if self.kind == PAIRED:
            self._check_pairs(mb, ids)
            out["chosen_index"] = torch.arange(0, ids.shape[0], 2, dtype=torch.int64)
            out["rejected_index"] = torch.arange(1, max(ids.shape[0], 1), 2, dtype=torch.int64)
            out["num_pairs_in_batch"] = torch.tensor(counts.get("num_pairs", 0), dtype=torch.int64)
            out["num_chosen_items_in_batch"] = torch.tensor(counts.get("num_chosen_items", 0), dtype=torch.int64)
            return out
        out["desirable"] = torch.from_numpy(self.roles[ids].astype(bool))
        out["num_desirable_in_batch"] = torch.tensor(counts.get("num_desirable", 0), dtype=torch.int64)
        out["num_undesirable_in_batch"] = torch.tensor(counts.get("num_undesirable", 0), dtype=torch.int64)
        out["kl"] = self._kl_batch(collator, mb, ids, rows, tokens)
        return out

    def _check_pairs(self, mb: Microbatch, ids: np.ndarray) -> None:
        """Every pair's chosen completion followed by its rejected one, as the plan was compiled."""
        chosen, rejected = ids[0::2], ids[1::2]
        bad = (ids.shape[0] % 2 != 0 or not self.roles[chosen].all() or self.roles[rejected].any()
               or not np.array_equal(self.pair_ids[chosen], self.pair_ids[rejected]))
        if bad:
            raise PlanMismatchError(
                f"microbatch {mb.index} (epoch {mb.epoch}, update {mb.update}) does not hold whole pairs, each "
                f"{PAIR_ROLES[0]} then {PAIR_ROLES[1]}: the plan's samples table and this plan disagree; recompile")

    def _kl_batch(self, collator: Any, mb: Microbatch, ids: np.ndarray, rows: np.ndarray,
                  tokens: TokenStore) -> dict[str, Any]:
        """The batch's KL sequences (`kl_sequences`) collated in the microbatch's layout, with `target_sequence`
        (their targets are not the plan's: uncounted)."""
        twin = copy.copy(collator)
        twin.check_counts, twin.fields = False, None
        kl_mb = Microbatch(list(range(ids.shape[0])), epoch=mb.epoch, index=mb.index, update=mb.update,
                           micro_step=mb.micro_step, position=mb.position, last_in_update=mb.last_in_update,
                           rows=mb.rows, label_count=0, num_items=0)
        arrays = twin.arrays(kl_mb, kl_sequences(ids, tokens, collator.shift, self.sequence_len))
        arrays["target_sequence"] = target_sequences(arrays["position_ids"], rows, arrays["shift_labels"],
                                                     collator.shift)
        arrays["num_sequences"] = int(ids.shape[0])
        return {k: torch.from_numpy(v) if type(v) is np.ndarray else v for k, v in arrays.items()}


def _token_labels(targets: np.ndarray, shift: str) -> np.ndarray:
    """A sequence's labels per token (its own id where it is a target) from the store's targets, which are
    already shifted under `--shift none`."""
    if shift != Shift.NONE:
        return targets
    out = np.full_like(targets, IGNORE_INDEX)
    out[1:] = targets[:-1]
    return out


def kl_sequences(ids: np.ndarray, tokens: TokenStore, shift: str, sequence_len: int | None) -> TokenStore:
    """KTO's KL sequences of a batch (TRL's rotation): sequence j is sequence j's prompt followed by sequence
    j-1's completion (the last one's for j = 0), the completion supervised as it was; cut to `sequence_len`
    (its start kept, as TRL cuts them). A prompt is a sequence's tokens before its first target."""
    heads, tails = [], []
    for k in ids.tolist():
        a, b = int(tokens.offsets[k]), int(tokens.offsets[k + 1])
        x, y = np.asarray(tokens.input_ids[a:b]), _token_labels(np.asarray(tokens.targets[a:b]), shift)
        supervised = np.flatnonzero(y != IGNORE_INDEX)
        cut = int(supervised[0]) if supervised.size else b - a
        heads.append(x[:cut])
        tails.append((x[cut:], y[cut:]))
    input_ids, labels = [], []
    for j, head in enumerate(heads):
        x, y = tails[j - 1]
        input_ids.append(np.concatenate([head, x])[:sequence_len].astype(np.int32))
        seq_y = np.concatenate([np.full(head.shape[0], IGNORE_INDEX, dtype=y.dtype), y])[:sequence_len]
        labels.append(np.asarray(_shifted(seq_y, shift), dtype=np.int32))
    offsets = np.concatenate([[0], np.cumsum([x.shape[0] for x in input_ids])]).astype(np.int64)
    if not input_ids:
        return TokenStore(np.zeros(0, np.int32), np.zeros(0, np.int32), offsets)
    return TokenStore(np.concatenate(input_ids), np.concatenate(labels), offsets)


def _shifted(labels: np.ndarray, shift: str) -> np.ndarray:
    """Token labels as the store holds targets: as they are, or shifted left under `--shift none`."""
    if shift != Shift.NONE:
        return labels
    out = np.full_like(labels, IGNORE_INDEX)
    out[:-1] = labels[1:]
    return out


__all__ = ["PreferenceFields", "kl_sequences", "sequence_of_positions", "target_sequences"]

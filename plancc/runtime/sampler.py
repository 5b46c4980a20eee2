"""Replay a plan: one rank's microbatches of one epoch, in plan order, with exact resume and elastic replay.

The layout (which rank runs which microbatch, the positions each rank walks, the tail update, elastic replay on
`(W', G')` with `W'G' = WG`) is `plancc.core.layout`'s; this module turns positions into `Microbatch`es. A rank without
a microbatch at a tail micro-step gets an **empty placeholder** (`Microbatch.placeholder`, no samples): the
collator turns it into a one-token row with no target, so the loss is 0 and its gradient is zero, but every rank
still runs the same number of forward/backward passes and the DDP all-reduce stays in lockstep.

With `full_updates=True` the tail update is padded with placeholders to `G` micro-steps as well, so every update
has exactly `G` micro-steps: what a loop that steps the optimizer every `G` batches (the Hugging Face `Trainer`)
needs when it runs several epochs as one stream.

The sampler yields `Microbatch` objects: lists of sample ids (so it works as a `torch.utils.data` batch sampler)
carrying where they sit in the plan. `state_dict()` saves the plan's fingerprints, the replay shape and the
position; `load_state_dict()` resumes exactly, refuses another plan, a state whose position was recorded as
invalid, and one whose position contradicts its update and micro-step on the plan's layout. Across an elastic
change, resume is exact at update boundaries only.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from plancc.core import layout
from plancc.errors import PlanMismatchError
from plancc.store.plan import (
    EpochMicrobatches,
    Plan,
    check_epoch,
    check_rank,
    replay_grad_accum,
    verified_plan,
)

STATE_FORMAT = "plancc.sampler/1"
STRICT_FINGERPRINTS = ("config", "metadata", "plan", "schema")
# the fields of a saved state and their types; counts are non-negative, world_size and grad_accum positive
_STATE_FIELDS: dict[str, type] = {
    "fingerprints": dict, "plan_world_size": int, "plan_grad_accum": int, "world_size": int, "grad_accum": int,
    "rank": int, "epoch": int, "position": int, "update": int, "micro_step": int, "at_update_boundary": bool,
    "valid": bool,
}
_POSITIVE = ("plan_world_size", "plan_grad_accum", "world_size", "grad_accum")


def state_problem(state: Any) -> str | None:
    """What makes `state` no sampler state (`field: why`), or None: a saved file may be damaged or hand-edited, and
    a loader should name the field rather than fail on it with a KeyError or a ValueError."""
    if not isinstance(state, dict):
        return f"not an object but {type(state).__name__}"
    if state.get("format") != STATE_FORMAT:
        return f"format: {state.get('format')!r}, expected {STATE_FORMAT!r}"
    for key, kind in _STATE_FIELDS.items():
        if key not in state:
            return f"{key}: missing"
        value = state[key]
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            return f"{key}: {value!r} is not {'an integer' if kind is int else f'a {kind.__name__}'}"
        if kind is int and value < (1 if key in _POSITIVE else 0):
            return f"{key}: {value} is not {'positive' if key in _POSITIVE else 'a count (negative)'}"
    if not isinstance(state.get("full_updates", False), bool):
        return f"full_updates: {state['full_updates']!r} is not a bool"
    missing = [k for k in ("dataset", *STRICT_FINGERPRINTS) if k not in state["fingerprints"]]
    if missing:
        return f"fingerprints.{missing[0]}: missing"
    if not isinstance(state.get("invalid_reason"), str | None):
        return f"invalid_reason: {state['invalid_reason']!r} is not text"
    return None


class Microbatch(list):
    """The sample ids of one microbatch (flattened, plan order) and its place in the plan.

    `rows` are CSR bounds over the ids (one row per sample in padded mode, one or more packed rows otherwise).
    A placeholder (see module docstring) is empty, has `index == -1` and `label_count == 0`.
    """

    __slots__ = ("counts", "epoch", "index", "label_count", "last_in_update", "micro_step", "num_items",
                 "position", "rows", "update")

    def __init__(self, ids, *, epoch: int, index: int, update: int, micro_step: int, position: int,
                 last_in_update: bool, rows: np.ndarray, label_count: int, num_items: int,
                 counts: dict[str, int] | None = None):
        super().__init__(ids)
        self.epoch, self.index, self.update, self.micro_step = epoch, index, update, micro_step
        self.position, self.last_in_update, self.rows = position, last_in_update, rows
        self.label_count, self.num_items = label_count, num_items
        self.counts = counts or {}  # a preference plan's update totals (`RankEpoch.counts`): pairs, ...

    @property
    def placeholder(self) -> bool:
        """An empty stand-in that keeps the ranks in lockstep (see module docstring)."""
        return self.index < 0

    def __reduce__(self):  # picklable for DataLoader worker processes
        return (_rebuild, (list(self), {k: getattr(self, k) for k in self.__slots__}))

    def __repr__(self) -> str:
        kind = "placeholder" if self.placeholder else f"index={self.index}"
        return (f"Microbatch({kind}, epoch={self.epoch}, update={self.update}, micro_step={self.micro_step}, "
                f"samples={list(self)})")


def _rebuild(ids, attrs):
    return Microbatch(ids, **attrs)


def _rank_and_world(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """`rank` and `world_size`, each defaulting to the process group's (0 and 1 outside one)."""
    import torch.distributed as dist

    d_rank, d_world = (dist.get_rank(), dist.get_world_size()) if dist.is_available() and dist.is_initialized() \
        else (0, 1)
    return int(d_rank if rank is None else rank), int(d_world if world_size is None else world_size)


class PlanSampler:
    """Yields rank `rank`'s microbatches of the current epoch (see module docstring).

    Keyword arguments: `rank`/`world_size` default to torch.distributed's (else 0 and 1); `grad_accum` defaults to
    the plan's and must be given for an elastic replay (`world_size * grad_accum` equal to the plan's);
    `epoch` is the first epoch; `full_updates` pads the tail update to `grad_accum` micro-steps. Usable as `DataLoader(dataset, batch_sampler=sampler)` (see `PlanDataset`).
    Iterating again replays from the same start (the epoch's beginning, or a restored position), like any torch
    sampler; `set_epoch` moves to another epoch. `state_dict()` is the position of the last microbatch yielded,
    or of the last one reported by `mark_consumed` (what `PlanDataLoader` does for prefetching loaders).
    """

    def __init__(self, plan: str | Path | Plan, *, rank: int | None = None, world_size: int | None = None,
                 grad_accum: int | None = None, epoch: int = 0, full_updates: bool = False):
        self.plan = verified_plan(plan)
        self.full_updates = bool(full_updates)
        self.rank, self.world_size = _rank_and_world(rank, world_size)
        check_rank(self.rank, self.world_size)
        self.grad_accum = replay_grad_accum(self.plan.settings, self.world_size, grad_accum)
        self.epoch = int(epoch)
        check_epoch(self.plan.epochs, self.epoch)
        self._cache: EpochMicrobatches | None = None
        self._shapes: dict[int, layout.RankWalk] = {}
        self._start = 0  # position each new iterator starts from (0, or where a resumed state left off)
        self._yielded = 0  # position after the last microbatch yielded
        self._consumed: int | None = None  # position after the last microbatch the training loop reported
        self._pending_resume = False
        self._invalid: str | None = None

    # ------------------------------------------------------------ shape of the epoch
    def _epoch_data(self) -> EpochMicrobatches:
        if self._cache is None or self._cache.epoch != self.epoch:
            self._cache = self.plan.epoch(self.epoch, self.rank, world_size=self.world_size,
                                          grad_accum=self.grad_accum)
        return self._cache

    def _shape(self, epoch: int | None = None) -> layout.RankWalk:
        """The positions this rank walks through `epoch` (default: current), `layout.rank_walk`."""
        epoch = self.epoch if epoch is None else int(epoch)
        if epoch not in self._shapes:
            batches = self.plan.manifest.epochs[epoch].batches  # verified against the epoch's rows (`verify`)
            self._shapes[epoch] = layout.rank_walk(batches, self.world_size, self.grad_accum,
                                                   full_updates=self.full_updates)
        return self._shapes[epoch]

    def __len__(self) -> int:
        """Microbatches (placeholders included) a new iterator yields: the epoch's, minus a resumed position."""
        return self._shape().length - self._start

    @property
    def epoch_length(self) -> int:
        """Positions (micro-steps, placeholders included) of the current epoch on this rank."""
        return self._shape().length

    def epoch_lengths(self) -> list[int]:
        """Positions (micro-steps) of every epoch of the plan on this rank."""
        return [self._shape(e).length for e in self.plan.epochs]

    def updates_per_epoch(self, epoch: int | None = None) -> int:
        """Optimizer updates of `epoch` (default: current), the tail update included."""
        return self._shape(epoch).updates

    def locate(self, position: int, epoch: int | None = None) -> tuple[int, int]:
        """(update, micro_step) of a position; the end of the epoch is (updates, 0)."""
        update, micro_step, _ = layout.locate(position, self._shape(epoch), self.grad_accum)
        return update, micro_step

    def update_position(self, update: int, epoch: int | None = None) -> int:
        """The position where `update` of `epoch` (default: current) starts; past the last update, the end."""
        return layout.position_of_update(update, self._shape(epoch), self.grad_accum)

    # ------------------------------------------------------------ iteration
    def set_epoch(self, epoch: int) -> None:
        """Start `epoch` from its beginning; keeps a just-restored position of the same epoch (resume)."""
        epoch = int(epoch)
        if self._pending_resume and epoch == self.epoch:
            return
        check_epoch(self.plan.epochs, epoch)
        self.epoch = epoch
        self._start = self._yielded = 0
        self._consumed = None
        self._pending_resume = False
        self._invalid = None

    def microbatch(self, position: int) -> Microbatch:
        """The microbatch (or placeholder) at `position` of the current epoch on this rank."""
        ep = self._epoch_data()
        walk = self._shape()
        if not 0 <= position < walk.length:
            raise IndexError(f"position {position} outside the epoch's {walk.length} microbatches")
        update, micro_step, steps = layout.locate(position, walk, self.grad_accum)
        last = micro_step == steps - 1
        if position < len(ep):  # real microbatches are a prefix of the positions (see module docstring)
            r0, r1 = int(ep.batch_bounds[position]), int(ep.batch_bounds[position + 1])
            rows = ep.row_bounds[r0:r1 + 1]
            ids = ep.sample_ids[rows[0]:rows[-1]].tolist()
            return Microbatch(ids, epoch=self.epoch, index=int(ep.index[position]), update=update,
                              micro_step=micro_step, position=position, last_in_update=last,
                              rows=rows - rows[0], label_count=int(ep.label_count[position]),
                              num_items=int(ep.num_items[position]),
                              counts={k: int(v[position]) for k, v in ep.counts.items()})
        return Microbatch([], epoch=self.epoch, index=-1, update=update, micro_step=micro_step, position=position,
                          last_in_update=last, rows=np.zeros(1, dtype=np.int64), label_count=0,
                          num_items=ep.tail_num_items, counts=ep.tail_counts)

    def __iter__(self) -> Iterator[Microbatch]:
        self._pending_resume = False
        start, length = self._start, self._shape().length
        self._yielded = start
        self._consumed = None
        for position in range(start, length):
            mb = self.microbatch(position)
            self._yielded = position + 1
            yield mb

    def mark_consumed(self, batch_or_microbatch: Any) -> None:
        """Record that the training loop finished the given microbatch (or collated batch).

        Needed when something between the sampler and the loop prefetches (a DataLoader with workers): the
        sampler's own count is then ahead of training. `PlanDataLoader` calls it for you.
        """
        position = (batch_or_microbatch["plan"]["position"] if isinstance(batch_or_microbatch, dict)
                    else batch_or_microbatch.position)
        self._consumed = int(position) + 1

    def invalidate(self, reason: str) -> None:
        """Record that the current position cannot be trusted: saved states say so and refuse exact resume."""
        self._invalid = reason

    # ------------------------------------------------------------ state
    @property
    def position(self) -> int:
        """Microbatches of the current epoch consumed so far (what a checkpoint saves)."""
        return self._consumed if self._consumed is not None else self._yielded

    def state_dict(self) -> dict[str, Any]:
        """A JSON-able state: plan fingerprints, replay shape, epoch, position (microbatches consumed), validity."""
        return self.state_at(self.epoch, self.position, invalid=self._invalid)

    def state_at(self, epoch: int, position: int, *, invalid: str | None = None) -> dict[str, Any]:
        """The state of this sampler after `position` microbatches of `epoch` (what `state_dict` saves)."""
        update, micro_step = self.locate(position, epoch)
        return {
            "format": STATE_FORMAT,
            "fingerprints": {k: self.plan.fingerprints.get(k) for k in ("dataset", *STRICT_FINGERPRINTS)},
            "plan_world_size": self.plan.settings.world_size,
            "plan_grad_accum": self.plan.settings.grad_accum,
            "world_size": self.world_size,
            "grad_accum": self.grad_accum,
            "full_updates": self.full_updates,
            "rank": self.rank,
            "epoch": int(epoch),
            "position": int(position),
            "update": update,
            "micro_step": micro_step,
            "at_update_boundary": micro_step == 0,
            "valid": invalid is None,
            "invalid_reason": invalid,
        }

    def position_problem(self, state: dict[str, Any]) -> str | None:
        """What makes a well-formed state (`state_problem` None) of this plan no position on its layout (`field:
        why`), or None. A state of another plan has no position here to check (`load_state_dict` refuses it).

        A position is trusted only where it agrees with what is saved beside it: the replay shape replays the
        plan's updates, the epoch is the plan's, and on that shape's walk (`layout.rank_walk`) the position is the
        update and micro-step the state records. A position edited alone (a careful edit reseals the checkpoint
        file) would otherwise resume at other microbatches.
        """
        if any(state["fingerprints"].get(k) != self.plan.fingerprints.get(k) for k in STRICT_FINGERPRINTS):
            return None
        settings = self.plan.settings
        for key, ours in (("plan_world_size", settings.world_size), ("plan_grad_accum", settings.grad_accum)):
            if state[key] != ours:
                return f"{key}: {state[key]}, the plan's is {ours}"
        world, accum, epoch = state["world_size"], state["grad_accum"], state["epoch"]
        per_update = layout.batches_per_update(settings.world_size, settings.grad_accum)
        if layout.batches_per_update(world, accum) != per_update:
            return (f"grad_accum: {world} ranks x {accum} micro-steps cannot replay the plan's updates of "
                    f"{per_update} microbatches")
        if state["rank"] >= world:
            return f"rank: {state['rank']} is not a rank of {world}"
        if epoch not in self.plan.epochs:
            return f"epoch: {epoch} is not an epoch of the plan (it has {self.plan.epochs})"
        walk = layout.rank_walk(self.plan.manifest.epochs[epoch].batches, world, accum,
                                full_updates=bool(state.get("full_updates", False)))
        position, saved = state["position"], (state["update"], state["micro_step"])
        shape = f"{world} ranks x {accum} micro-steps"
        if position > walk.length:
            return f"position: {position} is past the end of epoch {epoch} ({walk.length} positions on {shape})"
        found = layout.locate(position, walk, accum)[:2]
        if found != saved:
            return (f"position: {position} is update {found[0]}, micro-step {found[1]} of epoch {epoch} on {shape}, "
                    f"but the state says update {saved[0]}, micro-step {saved[1]}")
        if state["at_update_boundary"] != (found[1] == 0):
            return f"at_update_boundary: {state['at_update_boundary']} contradicts micro-step {found[1]}"
        return None

    def resume_point(self, state: dict[str, Any], *, allow_dataset_change: bool = False) -> tuple[int, int]:
        """The (epoch, position) of this sampler where `state` resumes; changes nothing. Refuses (PlanMismatchError)
        a malformed state (naming the field), another plan, changed data unless allowed, a position that
        contradicts the plan's layout, an invalid position, another rank's state, a mid-update elastic change."""
        problem = state_problem(state)
        if problem is not None:
            raise PlanMismatchError(f"not a plancc sampler state: {problem}")
        saved, ours = state["fingerprints"], self.plan.fingerprints
        for key in STRICT_FINGERPRINTS:
            if saved.get(key) != ours.get(key):
                raise PlanMismatchError(
                    f"the saved sampler state belongs to another plan: its {key} fingerprint differs from "
                    f"{self.plan.path}'s; resume with the plan the checkpoint was trained on"
                )
        if saved.get("dataset") != ours.get("dataset") and not allow_dataset_change:
            raise PlanMismatchError("the saved sampler state was trained on different data: its dataset fingerprint "
                                    f"differs from {self.plan.path}'s; pass allow_dataset_change=True to resume anyway")
        problem = self.position_problem(state)
        if problem is not None:
            raise PlanMismatchError(f"the saved sampler state is no position of {self.plan.path}: {problem} (edited, "
                                    "or saved by another program)")
        if not state["valid"]:
            raise PlanMismatchError(
                f"the checkpoint's sampler position is invalid ({state.get('invalid_reason')}); exact resume is "
                "impossible. Resume from another checkpoint, or start the epoch over explicitly with set_epoch()"
            )
        epoch = state["epoch"]
        if (state["world_size"], state["grad_accum"], bool(state.get("full_updates", False))) \
                == (self.world_size, self.grad_accum, self.full_updates):
            if state["rank"] != self.rank:  # same shape: each rank walks its own positions
                raise PlanMismatchError(f"the saved sampler state is rank {state['rank']}'s; this is rank {self.rank}: "
                                        "each rank resumes from its own state")
            return epoch, state["position"]
        if state["at_update_boundary"]:
            return epoch, self.update_position(state["update"], epoch)
        raise PlanMismatchError(
            f"the checkpoint was saved mid-update (update {state['update']}, micro-step {state['micro_step']}) "
            f"by a run of world_size {state['world_size']} x grad_accum {state['grad_accum']}; this run is "
            f"{self.world_size} x {self.grad_accum}. Elastic resume is exact only at update boundaries: resume "
            "with the original world size, or from a checkpoint taken at an optimizer step"
        )

    def load_state_dict(self, state: dict[str, Any], *, allow_dataset_change: bool = False) -> None:
        """Resume where `state` left off (`resume_point` says where, or why not)."""
        epoch, position = self.resume_point(state, allow_dataset_change=allow_dataset_change)
        if state["fingerprints"].get("dataset") != self.plan.fingerprints.get("dataset"):
            warnings.warn("the saved sampler state was trained on different data: its dataset fingerprint differs "
                          f"from {self.plan.path}'s (allowed by allow_dataset_change=True)", stacklevel=2)
        self.epoch = epoch
        self._start = self._yielded = position
        self._consumed = None
        self._invalid = None
        self._pending_resume = True


class PlanEvalSampler:
    """Yields rank `rank`'s microbatches of the plan's eval plan, in its one fixed order (`plancc.planner.evaluation`).

    Eval microbatch `i` runs on rank `i % world_size`, so every eval sample is seen exactly once across the ranks
    whatever the world size; every rank yields `ceil(batches / world_size)` microbatches, placeholders (no
    samples, zero targets) where it runs short, so ranks stay in lockstep. Each carries the global eval target
    count as `num_items`: the sum of CE over every rank divided by it is the eval set's token-mean loss.
    `epoch` is -1 and `update` 0 (an eval pass has no updates). `rank`/`world_size` default as `PlanSampler`'s.
    """

    def __init__(self, plan: str | Path | Plan, *, rank: int | None = None, world_size: int | None = None):
        self.plan = verified_plan(plan)
        self.rank, self.world_size = _rank_and_world(rank, world_size)
        self.share = self.plan.eval(self.rank, self.world_size)

    def __len__(self) -> int:
        """Microbatches (placeholders included) each rank yields."""
        return layout.steps_per_rank(self.share.total_batches, self.world_size)

    def microbatch(self, position: int) -> Microbatch:
        """This rank's eval microbatch (or placeholder) at `position`."""
        share, last = self.share, position == len(self) - 1
        common = dict(epoch=-1, update=0, micro_step=position, position=position, last_in_update=last,
                      num_items=share.total_label_count, counts=share.counts)
        if position >= len(share):
            return Microbatch([], index=-1, rows=np.zeros(1, dtype=np.int64), label_count=0, **common)
        r0, r1 = int(share.batch_bounds[position]), int(share.batch_bounds[position + 1])
        rows = share.row_bounds[r0:r1 + 1]
        return Microbatch(share.sample_ids[rows[0]:rows[-1]].tolist(), index=int(share.index[position]),
                          rows=rows - rows[0], label_count=int(share.label_count[position]), **common)

    def __iter__(self) -> Iterator[Microbatch]:
        for position in range(len(self)):
            yield self.microbatch(position)


__all__ = ["Microbatch", "PlanEvalSampler", "PlanMismatchError", "PlanSampler", "state_problem"]

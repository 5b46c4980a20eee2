"""Where microbatch `i` of an epoch sits (SPEC 4): update, rank and micro-step, which updates are complete, and how
one rank walks its share, also when a plan compiled for (W, G) is replayed on (W', G') with W'G' = WG.

Update `u` is microbatches `[u*W*G, (u+1)*W*G)`; rank `r` takes every `W`-th microbatch, so micro-step `m` of
update `u` on rank `r` is microbatch `u*W*G + m*W + r`. numpy only: the compiler writes these columns, the store
and validate check them on read, and the runtime sampler replays them.

A rank walks *positions* `0, 1, ...`: `G` micro-steps per complete update, then the incomplete final update (the
tail, kept without `--drop-last`) with `ceil(tail / W)` micro-steps on every rank (or `G` when every update must
have `G`: `full_updates`); a rank without a microbatch at a tail micro-step gets a placeholder::

    W=2, G=2, 5 microbatches        rank 0: [0, 2] [4]       rank 1: [1, 3] [placeholder]
                                            update 0 | tail          update 0 | tail

Elastic replay keeps the global order and every update (same samples, same `num_items`); only the rank that runs
a microbatch changes (`i % W'`).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


def update_mapping(num_batches: int, world_size: int, grad_accum: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(update, rank, micro_step) of each global microbatch index: i = u*W*G + m*W + r."""
    i = np.arange(num_batches, dtype=np.int64)
    per_update = world_size * grad_accum
    return i // per_update, (i % world_size).astype(np.int32), ((i % per_update) // world_size).astype(np.int32)


def complete_updates(num_batches: int, world_size: int, grad_accum: int) -> int:
    """Updates holding all `W*G` microbatches; a remainder is the incomplete final update (the tail)."""
    return num_batches // (world_size * grad_accum)


def optimizer_updates(num_batches: int, world_size: int, grad_accum: int) -> int:
    """The optimizer steps a trainer runs over `num_batches`: the complete updates plus the incomplete tail (kept
    without `--drop-last`; a `--drop-last` plan has none). What plancc calls an epoch's `updates` everywhere."""
    return -(-num_batches // (world_size * grad_accum))


def rank_indices(num_batches: int, world_size: int, rank: int) -> np.ndarray:
    """Global indices of the microbatches `rank` of `world_size` runs, in order (every `W`-th, from `rank`)."""
    return np.arange(rank, num_batches, world_size, dtype=np.int64)


def elastic_grad_accum(batches_per_update: int, world_size: int) -> int | None:
    """The grad_accum that replays updates of `batches_per_update` microbatches on `world_size` ranks (W'G' = WG),
    or None when `world_size` does not divide it."""
    return batches_per_update // world_size if batches_per_update % world_size == 0 else None


class RankWalk(NamedTuple):
    """One rank's positions in an epoch: complete updates, micro-steps of the tail update, positions in all."""

    complete: int
    tail_steps: int
    length: int

    @property
    def updates(self) -> int:
        """Updates the rank steps through, the tail included (`optimizer_updates` of the epoch)."""
        return self.complete + (1 if self.tail_steps else 0)


def rank_walk(num_batches: int, world_size: int, grad_accum: int, *, full_updates: bool = False) -> RankWalk:
    """The positions every rank walks through an epoch of `num_batches` (the same on every rank: lockstep)."""
    complete = complete_updates(num_batches, world_size, grad_accum)
    tail = num_batches - complete * world_size * grad_accum
    tail_steps = (grad_accum if tail else 0) if full_updates else -(-tail // world_size)
    return RankWalk(complete, tail_steps, complete * grad_accum + tail_steps)


def locate(position: int, walk: RankWalk, grad_accum: int) -> tuple[int, int, int]:
    """(update, micro_step, micro-steps of that update) of a rank's `position`; the end is (updates, 0, 0)."""
    if position < walk.complete * grad_accum:
        return position // grad_accum, position % grad_accum, grad_accum
    if position >= walk.length:
        return walk.updates, 0, 0
    return walk.complete, position - walk.complete * grad_accum, walk.tail_steps


def position_of_update(update: int, walk: RankWalk, grad_accum: int) -> int:
    """The first position of `update` on every rank (the end of the epoch past the last update)."""
    return update * grad_accum if update <= walk.complete else walk.length

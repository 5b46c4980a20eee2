"""Where microbatch `i` of an epoch sits (docs/spec.md §4): update, rank and micro-step, which updates are complete,
the counts derived from them, and how one rank walks its share, also when a plan compiled for (W, G) is replayed
on (W', G') with W'G' = WG. Every module asks here instead of redoing the arithmetic (a test holds them to it).

Update `u` is microbatches `[u*W*G, (u+1)*W*G)`; rank `r` takes every `W`-th microbatch, so micro-step `m` of
update `u` on rank `r` is microbatch `u*W*G + m*W + r`. The complete updates come first; what is left (fewer than
`W*G` microbatches) is the incomplete final update, the tail (none in a `--drop-last` plan). numpy only: the
compiler writes these columns, the store and validate check them on read, and the runtime sampler replays them.

A rank walks *positions* `0, 1, ...`: `G` micro-steps per complete update, then the tail with `ceil(tail / W)`
micro-steps on every rank (or `G` when every update must have `G`: `full_updates`); a rank without a microbatch
at a tail micro-step gets a placeholder::

    W=2, G=2, 5 microbatches        rank 0: [0, 2] [4]       rank 1: [1, 3] [placeholder]
                                            update 0 | tail          update 0 | tail

Elastic replay keeps the global order and every update (same samples, same `num_items`); only the rank that runs
a microbatch changes (`i % W'`).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


def batches_per_update(world_size: int, grad_accum: int) -> int:
    """Microbatches of one update, `W*G` (fixed under elastic replay)."""
    return world_size * grad_accum


def complete_updates(num_batches: int, world_size: int, grad_accum: int) -> int:
    """Updates holding all `W*G` microbatches; a remainder is the incomplete final update (the tail)."""
    return num_batches // batches_per_update(world_size, grad_accum)


def complete_batches(num_batches: int, world_size: int, grad_accum: int) -> int:
    """Microbatches of the complete updates: where the tail starts (what balancing may touch, `--drop-last` keeps)."""
    return complete_updates(num_batches, world_size, grad_accum) * batches_per_update(world_size, grad_accum)


def tail_batches(num_batches: int, world_size: int, grad_accum: int) -> int:
    """Microbatches of the incomplete final update (0 when every update is complete)."""
    return num_batches - complete_batches(num_batches, world_size, grad_accum)


def optimizer_updates(num_batches: int, world_size: int, grad_accum: int) -> int:
    """The optimizer steps a trainer runs over `num_batches`: the complete updates plus the incomplete tail (kept
    without `--drop-last`; a `--drop-last` plan has none). What plancc calls an epoch's `updates` everywhere."""
    return -(-num_batches // batches_per_update(world_size, grad_accum))


def steps_per_rank(num_batches: int, world_size: int) -> int:
    """Micro-steps every rank takes when `num_batches` are dealt round-robin (`ceil(n / W)`): a rank that runs
    short fills them with placeholders (a tail update, or an eval pass)."""
    return -(-num_batches // world_size)


def ranks(num_batches: int, world_size: int) -> np.ndarray:
    """The rank of each global microbatch index, `i % W` (int32): training and eval plans alike."""
    return (np.arange(num_batches, dtype=np.int64) % world_size).astype(np.int32)


def update_mapping(num_batches: int, world_size: int, grad_accum: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(update, rank, micro_step) of each global microbatch index: i = u*W*G + m*W + r."""
    i = np.arange(num_batches, dtype=np.int64)
    per_update = batches_per_update(world_size, grad_accum)
    return i // per_update, ranks(num_batches, world_size), ((i % per_update) // world_size).astype(np.int32)


def in_complete_update(num_batches: int, world_size: int, grad_accum: int) -> np.ndarray:
    """Per microbatch, whether its update is complete (the plan's `complete_update` column)."""
    return np.arange(num_batches, dtype=np.int64) < complete_batches(num_batches, world_size, grad_accum)


def update_bounds(num_batches: int, world_size: int, grad_accum: int) -> np.ndarray:
    """CSR bounds of the updates over the microbatches, the tail included: `[0, WG, 2WG, ..., num_batches]`."""
    starts = np.arange(0, num_batches, batches_per_update(world_size, grad_accum), dtype=np.int64)
    return np.append(starts, np.int64(num_batches))


def num_items(label_count: np.ndarray, world_size: int, grad_accum: int) -> np.ndarray:
    """Per microbatch, the supervised targets of its whole update on all ranks (int64; the plan's `num_items`, what
    the loss divides by), from the microbatches' `label_count` in global order."""
    bounds = update_bounds(label_count.shape[0], world_size, grad_accum)
    csum = np.zeros(label_count.shape[0] + 1, dtype=np.int64)
    np.cumsum(label_count, out=csum[1:])
    return np.repeat(csum[bounds[1:]] - csum[bounds[:-1]], np.diff(bounds))


def update_grid(values: np.ndarray, world_size: int, grad_accum: int) -> np.ndarray:
    """The complete updates' values as a `(updates, G, W)` view: `[u, m, r]` is microbatch `u*W*G + m*W + r`
    (the tail left out: its smaller totals are no imbalance)."""
    n = complete_updates(values.shape[0], world_size, grad_accum)
    return values[: n * batches_per_update(world_size, grad_accum)].reshape(n, grad_accum, world_size)


def rank_indices(num_batches: int, world_size: int, rank: int) -> np.ndarray:
    """Global indices of the microbatches `rank` of `world_size` runs, in order (every `W`-th, from `rank`)."""
    return np.arange(rank, num_batches, world_size, dtype=np.int64)


def rank_counts(num_batches: int, world_size: int) -> np.ndarray:
    """Microbatches each rank runs of an epoch (int64 [W]): `ceil((n - r) / W)` for rank `r`."""
    r = np.arange(world_size, dtype=np.int64)
    return np.maximum(num_batches - r + world_size - 1, 0) // world_size


def rank_order_positions(indices: np.ndarray, num_batches: int, world_size: int) -> np.ndarray:
    """Where global microbatch `indices` sit among an epoch's rows stored by (rank, index), as the plan file stores
    them: rank `i % W`'s rows come after those of the ranks before it, and `i` is its `i // W`-th."""
    indices = np.asarray(indices, dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(rank_counts(num_batches, world_size))])
    return starts[indices % world_size] + indices // world_size


def elastic_grad_accum(per_update: int, world_size: int) -> int | None:
    """The grad_accum that replays updates of `per_update` microbatches on `world_size` ranks (W'G' = WG), or None
    when `world_size` does not divide it."""
    return per_update // world_size if per_update % world_size == 0 else None


def replay_problem(plan_world_size: int, plan_grad_accum: int, world_size: int, grad_accum: int | None, *,
                   flag: str = "grad_accum", sep: str = "=") -> str | None:
    """Why `world_size` ranks x `grad_accum` micro-steps cannot replay a plan compiled for (W, G), or None when
    they can (W'G' = WG; `grad_accum` None stands for the plan's own, on the plan's world size only). The one
    message every runtime gives, in the caller's own name for grad_accum: `flag` and `sep` spell `grad_accum=4`,
    `--grad-accum 4`, `gradient_accumulation_steps=4`."""
    per_update = batches_per_update(plan_world_size, plan_grad_accum)
    if grad_accum is None and world_size == plan_world_size:
        return None
    if grad_accum is not None and batches_per_update(world_size, grad_accum) == per_update:
        return None
    fits = elastic_grad_accum(per_update, world_size)
    given = f"without {flag}" if grad_accum is None else f"with {flag}{sep}{grad_accum}"
    recompile = f"recompile with --world-size {world_size}" + (f" --grad-accum {grad_accum}" if grad_accum else "")
    compiled = (f"the plan was compiled for world_size {plan_world_size} x grad_accum {plan_grad_accum} ({per_update} "
                f"microbatches per update) but this run has {world_size} process(es) {given}")
    if fits is None:
        return (f"{compiled}: {world_size} does not divide {per_update}, and elastic replay needs the same product; "
                f"run on a number of processes that divides {per_update}, or {recompile}")
    return (f"{compiled}: pass {flag}{sep}{fits} (elastic replay needs the same product: {world_size} x {fits} = "
            f"{per_update}), or {recompile}")


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
    tail = tail_batches(num_batches, world_size, grad_accum)
    tail_steps = (grad_accum if tail else 0) if full_updates else steps_per_rank(tail, world_size)
    return RankWalk(complete, tail_steps, complete * grad_accum + tail_steps)


def locate(position: int, walk: RankWalk, grad_accum: int) -> tuple[int, int, int]:
    """(update, micro_step, micro-steps of that update) of a rank's `position`; the end is (updates, 0, 0)."""
    if position < walk.complete * grad_accum:
        return position // grad_accum, position % grad_accum, grad_accum
    if position >= walk.length:
        return walk.updates, 0, 0
    return walk.complete, position - walk.complete * grad_accum, walk.tail_steps


def position_of_update(update: int, walk: RankWalk, grad_accum: int) -> int:
    """The first position of `update` on every rank (the end of the epoch past the last update): where a resume
    at an update boundary starts, whatever the world size that saved it."""
    return update * grad_accum if update <= walk.complete else walk.length

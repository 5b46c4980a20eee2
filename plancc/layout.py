"""Where microbatch `i` of an epoch sits (SPEC 4): update, rank and micro-step, and which updates are complete.

Update `u` is microbatches `[u*W*G, (u+1)*W*G)`; rank `r` takes every `W`-th microbatch, so micro-step `m` of
update `u` on rank `r` is microbatch `u*W*G + m*W + r`. numpy only: the compiler writes these columns, the store
checks them on read, and the runtime replays them.
"""

from __future__ import annotations

import numpy as np


def update_mapping(num_batches: int, world_size: int, grad_accum: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(update, rank, micro_step) of each global microbatch index: i = u*W*G + m*W + r."""
    i = np.arange(num_batches, dtype=np.int64)
    per_update = world_size * grad_accum
    return i // per_update, (i % world_size).astype(np.int32), ((i % per_update) // world_size).astype(np.int32)


def complete_updates(num_batches: int, world_size: int, grad_accum: int) -> int:
    """Updates holding all `W*G` microbatches; a remainder is the incomplete final update (the tail)."""
    return num_batches // (world_size * grad_accum)

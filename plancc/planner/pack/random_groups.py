"""Fixed-count grouping for `padded` and `flattened`: a seeded shuffle cut into groups of `micro_batch_size`.

No packing: every microbatch holds exactly `micro_batch_size` samples (the last may hold fewer). The balancer
(`plancc.planner.balance`) later regroups them to even out labels and cost without changing those counts.
"""

from __future__ import annotations

import numpy as np


def group_fixed(n: int, micro_batch_size: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(sample order, group bounds): a random permutation cut every `micro_batch_size` items."""
    order = rng.permutation(n).astype(np.int64)
    bounds = np.arange(0, n + micro_batch_size, micro_batch_size, dtype=np.int64)
    bounds[-1] = n
    if bounds.shape[0] >= 2 and bounds[-2] == n:
        bounds = bounds[:-1]
    return order, bounds

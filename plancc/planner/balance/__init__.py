"""Balancing stages (docs/spec.md §5), one per module: `(batches, samples, settings) -> batches`.

`stages(settings, rng)` lists the passes compile runs after the `before` plan, in order, each as (name, function).
A stage that draws random numbers takes the epoch's generator as a keyword (`rng=`), bound here, so the others do
not carry one they never use. A stage returns its input unchanged when it finds no improvement of its own
objective.

| stage | module | objective (never worsened) |
|---|---|---|
| `microbatch` (packed) | `microbatch` | microbatch label variance |
| `fixed_count` (padded, flattened) | `fixed_count` | label variance, with total/peak cost (and flattened token variance, padded cost CV) not raised |
| `accumulation` (W*G > 1) | `accumulation` | variance of update label totals |
| `within_update` | `within_update` | label variance inside each update (samples of the update kept; padded cost CV not raised) |
| `rank_order` (W > 1) | `rank_order` | rank spread of work (`--cost`): per micro-step (max and sum per update) and of the ranks' update totals; then the ranks' label totals (no update's work spread or slowest rank worse, mean rank work CV not raised) |
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import numpy as np

from plancc.config.settings import PlanSettings
from plancc.core.plan_arrays import Batches, SampleArrays

Stage = Callable[[Batches, SampleArrays, PlanSettings], Batches]


def stages(settings: PlanSettings, rng: np.random.Generator) -> list[tuple[str, Stage]]:
    """The balancing passes for these settings, drawing from the epoch's `rng`; none with `--no-balance`."""
    if not settings.balance:
        return []
    from plancc.planner.balance.accumulation import order_for_accumulation
    from plancc.planner.balance.fixed_count import balance_fixed_count
    from plancc.planner.balance.microbatch import balance_microbatches
    from plancc.planner.balance.rank_order import order_ranks
    from plancc.planner.balance.within_update import refine_updates

    out: list[tuple[str, Stage]] = []
    if settings.mode == "packed":
        out.append(("microbatch", partial(balance_microbatches, rng=rng)))
    else:
        out.append(("fixed_count", balance_fixed_count))
    if settings.batches_per_update > 1:
        out.append(("accumulation", order_for_accumulation))
        out.append(("within_update", refine_updates))
    if settings.world_size > 1:
        out.append(("rank_order", order_ranks))
    return out

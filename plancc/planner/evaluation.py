"""The eval plan: held-out samples in the training layout, once, in one fixed order for the whole run.

`eval_plan(eval_s, settings)` is a pure function of the eval samples' arrays and the plan settings, so any source
of eval ids (the `--val-set-size` draw of `plancc.planner.holdout`, or eval datasets) plugs into it. The samples are packed
(or grouped) like `pack.shuffled_batches` does for an epoch, with their own seeded order; no balancing (an eval
pass has no optimizer updates to even out). Microbatch `i` runs on rank `i % W`, so every eval sample is seen
exactly once across the ranks; a rank that runs short gets placeholders (the runtime's zero-target microbatches).
The eval loss is the exact token mean over the whole set: the sum of CE over every rank divided by the global
eval target count the plan stores (`eval.label_count` in the manifest).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from plancc.config.settings import PlanSettings
from plancc.core import layout
from plancc.core.plan_arrays import Batches, SampleArrays, batch_sums
from plancc.planner import pack
from plancc.planner.holdout import ORDER_STREAM, stream_rng
from plancc.planner.units import planning_units


@dataclass(frozen=True)
class EvalPlan:
    """The eval microbatches (positions in `samples`) in their one fixed order."""

    samples: SampleArrays
    batches: Batches


def eval_plan(eval_s: SampleArrays, settings: PlanSettings) -> EvalPlan:
    """The eval samples in the training layout (packed or grouped like `pack.shuffled_batches`), in one seeded
    order; see the module docstring."""
    units = planning_units(eval_s, settings)  # preference pairs stay together (`plancc.planner.units`)
    return EvalPlan(eval_s, units.expand(pack.shuffled_batches(units.facts, units.settings,
                                                               stream_rng(settings.seed, ORDER_STREAM))))


def eval_columns(ev: EvalPlan, settings: PlanSettings) -> dict[str, np.ndarray]:
    """One row per eval microbatch: index, rank, sample ids (CSR), tokens, targets and token slots."""
    b, n = ev.batches, ev.batches.num_batches
    sums = batch_sums(b, ev.samples, settings.shift, settings.mode, settings.pad_multiple)
    return {
        "index": np.arange(n, dtype=np.int64),
        "rank": layout.ranks(n, settings.world_size),
        "sample_ids": ev.samples.sample_id[b.samples],
        "row_bounds": b.row_bounds,
        "batch_bounds": b.batch_bounds,
        "tokens": sums.tokens,
        "label_count": sums.targets,
        "cost": sums.cost,
    }

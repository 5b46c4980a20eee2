"""Within-update refinement (docs/spec.md §5, stage 4): sample trades between microbatches of one update.

Uses the same pair trade as microbatch balance (`_exchange`), with windows that never cross an update (an update
of more than `balance_window` microbatches is cut into windows of that size). Every trade narrows the label gap of
two microbatches of one update, so each update keeps its samples and its label total while its within-update
label variance drops; rows, capacity, padded cost and peak obey the same rules as the microbatch stage.

`--cost attention` (packed, flattened): a trade must also not widen the pair's attention gap (sum of squared
sample lengths, what varlen attention spends), and its score weighs that gap by (labels / attention)^2, so the
microbatches of an update even out in attention work too (at capacity a long sample trades for two or three
shorter ones of the same total length), and the stage raises neither label nor attention variance: the
attention CV drops at a label CV all but unchanged (docs/benchmarks.md). (Flattened's token gap rule gives way to
it there.)

Flattened then trims the peak again (`_redeal.trim_peak`, see `fixed_count`): trades may lift a microbatch up to
the plan's peak, which the untouched tail can set.

Under `padded` a window's trades are kept only while the plan's cost CV stays at or below the input's, as in
stage 2 (`fixed_count.exchange_within_cost_cv`); there attention is the padded cost squared, and `--cost
attention` acts through rank ordering alone.

Why it stops: one pass of ROUNDS pairing rounds (ROUNDS_ATTENTION with `--cost attention`); the updates' windows
are small and the microbatch stage has done the heavy lifting. Cost: a kernel pass over the span.
"""

from __future__ import annotations

import numpy as np

from plancc.config.settings import PlanSettings
from plancc.core.plan_arrays import Batches, SampleArrays
from plancc.planner.balance import _common as common
from plancc.planner.balance._redeal import trim_peak
from plancc.planner.balance.fixed_count import exchange_within_cost_cv

ROUNDS = 2
ROUNDS_ATTENTION = 4  # the attention rule leaves fewer trades a round; two more rounds find them


def update_windows(n_span: int, per_update: int, window: int) -> tuple[np.ndarray, np.ndarray]:
    """Windows of at most `window` consecutive microbatches that never cross an update boundary."""
    starts = np.add.outer(np.arange(0, n_span, per_update), np.arange(0, per_update, window)).reshape(-1)
    return np.append(starts, n_span).astype(np.int64), np.arange(n_span, dtype=np.int64)


def refine_updates(batches: Batches, samples: SampleArrays, settings: PlanSettings) -> Batches:
    """Stage 4: pair trades inside each complete update's windows (module docstring)."""
    per_update = settings.batches_per_update
    if per_update < 2:
        return batches
    window = settings.balance_window
    if settings.mode == "padded":
        return exchange_within_cost_cv(batches, samples, settings,
                                       lambda labels, cost: update_windows(labels.shape[0], per_update, window),
                                       passes=1, rounds=ROUNDS)
    attention = settings.cost == "attention"
    new = common.exchange(batches, samples, settings,
                          windows=lambda pass_index, labels: update_windows(labels.shape[0], per_update, window),
                          passes=1, rounds=ROUNDS_ATTENTION if attention else ROUNDS, square=attention)
    return trim_peak(new, samples, settings) if settings.mode == "flattened" else new

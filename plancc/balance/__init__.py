"""Balancing stages (SPEC 5), one per module: `(batches, samples, settings, rng) -> batches`.

`stages(settings)` lists the passes compile runs after the `before` plan, in order, each as (name, function).
A stage returns its input unchanged when it finds no improvement of its own objective.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from plancc.config import PlanSettings
from plancc.plan import Batches, SampleArrays

Stage = Callable[[Batches, SampleArrays, PlanSettings, np.random.Generator], Batches]


def stages(settings: PlanSettings) -> list[tuple[str, Stage]]:
    """The balancing passes for these settings; none with `--no-balance`."""
    if not settings.balance:
        return []
    return []

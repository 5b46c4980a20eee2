"""What a plan materializes, checked against the machine before anything is planned.

Planning holds every planned sample of every epoch (positions, rows, the plan table's ids) until the plan is
written: 110-155 bytes each at peak, measured on compiles of 0.5-2 million planned samples; the bound takes
`PLANNED_SAMPLE_BYTES`, less, so that it refuses only what cannot fit (a plan just under it may still run out of
memory, which is one line too). A typo in a count-like setting
(`--mix chat=1e9x`, `samples_per_epoch = 1000000000000`, `--epochs 1024` over millions of samples) is refused here
in one line naming the setting and what fits, instead of ending in the kernel's out-of-memory killer.
"""

from __future__ import annotations

import numpy as np

from plancc.config.settings import MixEntry, PlanSettings
from plancc.core.choices import MixKind
from plancc.errors import SettingsError
from plancc.planner.mixture import epoch_sizes

PLANNED_SAMPLE_BYTES = 100  # peak bytes per planned sample (module docstring), rounded down
MOST_PLANNED = 2**40  # planned samples of a whole run, whatever the memory: counts stay far inside int64


def check_fits(sizes: np.ndarray | None, settings: PlanSettings, available: int | None, per_unit: int = 1) -> None:
    """Refuse a plan of more samples than fit in `available` bytes (None: unknown, only `MOST_PLANNED` holds), naming
    the setting that asks for them. `sizes`: the units of each mixture entry (or of the one source) each epoch
    draws on, `per_unit` samples each (a preference pair: 2); None before the data is loaded: one each, the least
    a dataset holds, so that what the settings alone ask for (a repeat of 1e9, `--samples-per-epoch`, `--epochs`)
    is refused before any work."""
    mixture = settings.mixture
    at_least = "at least " if sizes is None else ""
    if sizes is None:
        sizes = np.ones(max(len(mixture), 1), dtype=np.int64)
    targets = per_unit * (epoch_sizes(sizes, mixture, settings.samples_per_epoch) if mixture else
                          np.asarray(sizes, dtype=np.float64))
    per_epoch = float(targets.sum())
    planned = per_epoch * settings.epochs
    most = MOST_PLANNED if available is None else min(MOST_PLANNED, available // PLANNED_SAMPLE_BYTES)
    if planned <= most:
        return
    asks, setting, lower = _culprit(targets, mixture, settings, per_epoch <= most)
    room = "" if available is None else f"; this process can use {_gib(available)} (free memory, container limit, " \
                                        "`ulimit -v`)"
    raise SettingsError(f"{asks} makes {at_least}{_count(planned)} planned samples ({_count(per_epoch)} an epoch x "
                        f"{settings.epochs} epoch{'s' if settings.epochs != 1 else ''}), about {_gib(planned * PLANNED_SAMPLE_BYTES)} to plan{room}: "
                        f"at most {most:,} fit; {lower}", setting)


def _culprit(targets: np.ndarray, mixture: tuple[MixEntry, ...], settings: PlanSettings, epoch_fits: bool
             ) -> tuple[str, str | None, str]:
    """(what asks for the samples, the setting, what to do) of a plan that does not fit."""
    if epoch_fits:
        return f"--epochs {settings.epochs}", "epochs", "lower --epochs"
    if mixture:
        m = mixture[int(np.argmax(targets))]
        if m.kind == MixKind.REPEAT:
            return f"dataset {m.name!r} repeat {m.value:g}", "mixture", f"lower its repeat (--mix {m.name}=Nx)"
        if settings.samples_per_epoch is not None:
            return (f"--samples-per-epoch {settings.samples_per_epoch:,}", "samples_per_epoch",
                    "lower --samples-per-epoch")
    return (f"the data's {int(targets.sum()):,} samples an epoch", None,
            "compile part of it, or on a machine with more memory")


def _count(value: float) -> str:
    """A sample count, exact while it is one (a float of 1e300 samples is shown as such)."""
    return f"{int(value):,}" if value < 2**63 else f"{value:.3g}"


def _gib(n: float) -> str:
    return f"{n / 2**30:,.1f} GiB" if n < 2**70 else f"{n / 2**30:.3g} GiB"

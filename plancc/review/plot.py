"""Before-vs-after histograms of a plan (optional extra `plot`: `pip install plancc[plot]`).

One figure, one row of two panels per epoch: supervised labels per microbatch and global labels per optimizer
update, `before` (shuffled + packed) against `after` (balanced), both as compile stored them
(`plancc.review.inspect.before_counts`); for a plan that did not store `before` the panel shows `after` alone and says so.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from plancc.errors import PlanccError

if TYPE_CHECKING:
    from plancc.store.plan import Plan


def _matplotlib():
    try:
        import matplotlib

        matplotlib.use("Agg", force=True)
        import matplotlib.pyplot as plt
    except ImportError:
        raise PlanccError("--plot needs matplotlib: pip install 'plancc[plot]'") from None
    return plt


def _cv(x: np.ndarray) -> float:
    return float(x.std() / x.mean()) if x.size and x.mean() > 0 else 0.0


def _panel(ax, before: np.ndarray | None, after: np.ndarray, title: str, xlabel: str) -> None:
    data = [x for x in (before, after) if x is not None and x.size]
    if not data:
        ax.text(0.5, 0.5, "no complete data", ha="center", va="center", transform=ax.transAxes)
        ax.set_title(title)
        return
    lo = min(float(x.min()) for x in data)
    hi = max(float(x.max()) for x in data)
    if hi <= lo:
        hi = lo + 1
    bins = np.linspace(lo, hi, 41)
    if before is not None and before.size:
        ax.hist(before, bins=bins, alpha=0.55, color="tab:orange", label=f"before (CV {_cv(before):.3f})")
    ax.hist(after, bins=bins, histtype="step", linewidth=1.8, color="tab:blue", label=f"after (CV {_cv(after):.3f})")
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("count")
    ax.legend(fontsize=8)


def plot_metrics(plan_dir: str | Path | Plan, out: str | Path, epochs: list[int] | None = None) -> list[str]:
    """Write the PNG to `out`; returns one note per epoch (how `before` was obtained)."""
    from plancc.review.inspect import as_plan, before_counts

    plt = _matplotlib()
    out = Path(out)
    if out.suffix.lower() != ".png":
        raise PlanccError(f"--plot writes a PNG: give a file name ending in .png, got {out}")
    plan = as_plan(plan_dir)
    epochs = plan.epochs if epochs is None else epochs
    data = [before_counts(plan, e) for e in epochs]
    fig, axes = plt.subplots(len(data), 2, figsize=(11, 3.6 * len(data)), squeeze=False)
    for row, ba in zip(axes, data, strict=True):
        b = ba.before
        _panel(row[0], None if b is None else b.label_counts, ba.after.label_counts,
               f"epoch {ba.epoch}: labels per microbatch", "supervised labels")
        _panel(row[1], None if b is None else b.update_totals, ba.after.update_totals,
               f"epoch {ba.epoch}: labels per optimizer update", "global labels (num_items)")
        if b is None:
            row[0].annotate(ba.note, (0.01, 0.01), xycoords="figure fraction", fontsize=7)
    fig.suptitle(f"plancc plan {plan.path.name}: before vs after balancing")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    tmp.replace(out)
    return [f"epoch {ba.epoch}: {ba.note}" for ba in data]

"""Is a metric's change more than noise? The spread a plan's quality metrics show from seed to seed at its size.

A plan's label_cv, update_label_cv, packing_efficiency or padding_ratio is the outcome of a seeded shuffle and a
bounded search: another seed, or the same seed over a dataset with 20 more rows, gives another value although
nothing got worse (at 1,000 samples a packed plan's label_cv moves by several percent from seed to seed). So a
fixed relative tolerance either fires on noise for small plans or misses real regressions in large ones. The diff
measures the expected spread instead, the way the compiler meets it:

* a plan's epochs are already draws of one plan under different seeds (epoch e's generator is made from (seed, e)):
  the spread of their values costs nothing;
* when the two plans' epochs give fewer than `NOISE_DF` degrees of freedom, the new plan's first epoch is planned
  again with other seeds by the compiler's own function (`plancc.planner.pipeline.plan_epoch`, on the plan's own
  samples and settings) until they do. This runs only when some metric moved beyond the tolerance at all, and only
  for plans of at most `MAX_REPLAN_SAMPLES` samples (larger plans have small spreads; the tolerance rules them).

The pooled standard deviation σ of a metric is the noise of one plan's value; the difference of two plans has
σ·√2, and a change counts when it exceeds `NOISE_Z`·σ·√2 as well as the tolerance.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from plancc.core.numbers import padding_ratio
from plancc.planner.pipeline import plan_epoch
from plancc.review.diff_churn import MetricsByStage
from plancc.review.diff_rules import ABS_FLOOR, NOISE_Z, QUALITY_METRICS, REGRESSION_METRICS
from plancc.store import parquet
from plancc.store.parquet import sample_arrays
from plancc.store.plan import Plan

NOISE_DF = 4  # degrees of freedom of σ the diff wants before it trusts it
MAX_REPLAN_SAMPLES = 1_000_000


@dataclass(frozen=True)
class Spread:
    """σ of each quality metric between plans of this size that differ only by seed, and how it was measured."""

    sigma: dict[str, float]
    df: int  # degrees of freedom: the values used less one per plan
    epochs: int  # values that came from the plans' own epochs
    replans: int  # values from planning the new plan's samples with other seeds
    samples: int  # samples per epoch of the new plan
    why_not: str | None = None  # why there is no σ (then the tolerance alone rules)

    def limit(self, metric: str) -> float | None:
        """The largest change of `metric` that is still noise (None: unknown)."""
        s = self.sigma.get(metric)
        return None if s is None else NOISE_Z * s * math.sqrt(2)

    def to_json(self) -> dict[str, Any]:
        """As the report holds it."""
        return {"sigma": self.sigma, "df": self.df, "epochs": self.epochs, "replans": self.replans,
                "samples": self.samples, "z": NOISE_Z, "unmeasured": self.why_not}


def _after(metrics: MetricsByStage, plan: Plan) -> list[dict[str, Any]]:
    return [metrics[(e, "after")] for e in plan.epochs if (e, "after") in metrics]


def _replans(plan: Plan, count: int) -> list[dict[str, Any]]:
    """The after-stage metrics of the plan's first epoch planned again `count` times, with seeds seed+1, seed+2,
    ... (the epoch's samples, in id order, as one plain epoch of the plan's settings)."""
    s = sample_arrays(plan.files.read_samples())
    ids = parquet.nested_arrays(plan.files.read_epoch(0, ["index", "sample_ids"]).column("sample_ids"))[0]
    epoch = s.take(np.sort(np.searchsorted(s.sample_id, ids)))
    base = dataclasses.replace(plan.settings, mixture=(), samples_per_epoch=None, val_set_size=0, epochs=1)
    rows = []
    for k in range(count):
        seed = (plan.settings.seed + 1 + k) % 2**63
        row = dict(plan_epoch(epoch, dataclasses.replace(base, seed=seed), 0).metrics[-1][1])
        rows.append({**row, "padding_ratio": padding_ratio(row)})
    return rows


def _pooled_sigma(groups: list[list[dict[str, Any]]], metric: str) -> float | None:
    """The pooled standard deviation of `metric` over groups (each group: one plan's values)."""
    ss, df = 0.0, 0
    for rows in groups:
        x = np.array([r[metric] for r in rows if r.get(metric) is not None], dtype=np.float64)
        if x.size > 1 and np.isfinite(x).all():
            ss += float(((x - x.mean()) ** 2).sum())
            df += x.size - 1
    return math.sqrt(ss / df) if df else None


def measure(old: Plan, new: Plan, m_old: MetricsByStage, m_new: MetricsByStage) -> Spread:
    """The seed-to-seed spread of every quality metric (module docstring)."""
    groups = [_after(m_old, old), _after(m_new, new)]
    from_epochs = sum(len(g) for g in groups)
    df = sum(max(len(g) - 1, 0) for g in groups)
    samples = int(groups[1][0].get("samples") or 0) if groups[1] else 0
    replans, why_not = 0, None
    if df < NOISE_DF:
        if samples > MAX_REPLAN_SAMPLES:
            why_not = f"{samples:,} samples an epoch, more than the {MAX_REPLAN_SAMPLES:,} the diff replans"
        elif groups[1]:
            replans = NOISE_DF - df
            groups[1] = groups[1] + _replans(new, replans)
            df += replans
    if why_not is None and df == 0:
        why_not = "the plans have no epoch in common"
    sigma = {} if why_not else {m: s for m in QUALITY_METRICS if (s := _pooled_sigma(groups, m)) is not None}
    return Spread(sigma, df, from_epochs, replans, samples, why_not)


def tolerance_limit(old_value: float, tolerance: float) -> float:
    """The user's slack: max(ABS_FLOOR, tolerance x |old|)."""
    return max(ABS_FLOOR, tolerance * abs(old_value))


def candidates(m_old: MetricsByStage, m_new: MetricsByStage, epochs: list[int], tolerance: float) -> bool:
    """Whether some quality metric moved beyond the tolerance in an epoch of both plans (only then is the spread
    worth measuring)."""
    for e in epochs:
        a, b = m_old.get((e, "after")), m_new.get((e, "after"))
        for name in QUALITY_METRICS if a and b else ():
            x, y = a.get(name), b.get(name)
            if x is not None and y is not None and abs(y - x) > tolerance_limit(x, tolerance):
                return True
    return False


def judged(metric: str, old_value: float, new_value: float, tolerance: float, spread: Spread | None
           ) -> dict[str, Any]:
    """One quality metric's change against both limits: {allowed, tolerance_limit, noise_limit, sigma, beyond,
    worse} (beyond: the change exceeds both limits, either way; worse: and in the direction that is worse)."""
    delta = new_value - old_value
    tol = tolerance_limit(old_value, tolerance)
    noise = spread.limit(metric) if spread is not None else None
    allowed = max(tol, noise or 0.0)
    beyond = abs(delta) > allowed
    return {"allowed": allowed, "tolerance_limit": tol, "noise_limit": noise,
            "sigma": spread.sigma.get(metric) if spread is not None else None,
            "beyond": beyond, "worse": beyond and delta * QUALITY_METRICS[metric] > 0}


def why(metric: str, old_value: float, new_value: float, j: dict[str, Any], tolerance: float,
        spread: Spread | None) -> str:
    """Why a change counts, in one sentence: both limits it passed, and where the spread came from."""
    text = (f"{metric} {old_value:.4g} -> {new_value:.4g} ({new_value - old_value:+.3g}) passes the {tolerance:g} "
            f"tolerance ({j['tolerance_limit']:.3g})")
    if spread is None or j["noise_limit"] is None:
        reason = spread.why_not if spread is not None and spread.why_not else "not measured"
        return text + f"; the seed-to-seed spread is unknown ({reason}), so the tolerance alone rules"
    source = ", ".join(filter(None, [f"{spread.epochs} epochs" if spread.epochs else "",
                                     f"{spread.replans} replans" if spread.replans else ""]))
    return text + (f" and {NOISE_Z:g}x the seed-to-seed spread of two plans of {spread.samples:,} samples "
                   f"({j['noise_limit']:.3g}; σ {j['sigma']:.3g} from {source})")


def regressions(m_old: MetricsByStage, m_new: MetricsByStage, epochs: list[int], tolerance: float,
                spread: Spread | None) -> list[dict[str, Any]]:
    """The after-stage regression metrics that got worse beyond both limits, each with why."""
    out = []
    for e in epochs:
        a, b = m_old.get((e, "after")), m_new.get((e, "after"))
        for name in REGRESSION_METRICS if a and b else ():
            x, y = a.get(name), b.get(name)
            if x is None or y is None:
                continue
            j = judged(name, x, y, tolerance, spread)
            if j["worse"]:
                out.append({"epoch": e, "metric": name, "old": x, "new": y, "delta": y - x,
                            **{k: j[k] for k in ("allowed", "tolerance_limit", "noise_limit", "sigma")},
                            "why": why(name, x, y, j, tolerance, spread)})
    return out

"""What `plancc diff --fail-on` checks, as plain values: the CLI quotes them in its help, and importing this
module loads nothing (not numpy or pyarrow, which `plancc.review.diff` needs), so `plancc --help` stays fast."""

from __future__ import annotations

FAIL_ON = ("any", "config", "dataset", "metrics-regression")

DEFAULT_TOLERANCE = 0.02
ABS_FLOOR = 0.001
# metric -> direction in which it gets worse (+1: higher is worse, -1: lower is worse)
REGRESSION_METRICS: dict[str, int] = {
    "label_cv": +1,
    "update_label_cv": +1,
    "packing_efficiency": -1,
    "padding_ratio": +1,
}
REGRESSION_RULE = (
    "metrics-regression: in an epoch both plans have, an after-stage metric is worse than in OLD by more than "
    "max(0.001, TOL x |old value|), TOL = --tolerance (default 0.02, i.e. 2%). Checked: label_cv and "
    "update_label_cv (higher is worse), packing_efficiency (lower is worse) and padding_ratio = padding_tokens / "
    "total_batch_cost (higher is worse)."
)

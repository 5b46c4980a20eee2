"""What `plancc diff --fail-on` checks, as plain values: the CLI quotes them in its help, and importing this
module loads nothing (not numpy or pyarrow, which `plancc.review.diff` needs), so `plancc --help` stays fast."""

from __future__ import annotations

FAIL_ON = ("any", "config", "dataset", "masks", "metrics-regression")
FAIL_ON_HELP = (
    "any = the plans differ at all; config = a setting changed (any kind: plan, data, masks, mix); dataset = the "
    "data changed: rows added, removed or edited in a source, or a dataset added or removed (not samples that a "
    "settings change re-derived from unchanged sources); masks = what is trained or the template that renders it "
    "changed (roles_to_train, train_on_eos, train_on_inputs, train_on, chat_template by content, prompt_format, "
    "...);"
)

DEFAULT_TOLERANCE = 0.02
ABS_FLOOR = 0.001
NOISE_Z = 3.0  # a change is beyond noise when it exceeds NOISE_Z x the spread of a difference of two plans
# quality metric -> direction in which it gets worse (+1: higher is worse, -1: lower is worse); the first four are
# checked by metrics-regression, all are shown when they move beyond noise
QUALITY_METRICS: dict[str, int] = {
    "label_cv": +1,
    "update_label_cv": +1,
    "packing_efficiency": -1,
    "padding_ratio": +1,
    "max_naive_weight_skew": +1,
    "rank_cost_cv": +1,
}
REGRESSION_METRICS: dict[str, int] = {k: QUALITY_METRICS[k] for k in
                                      ("label_cv", "update_label_cv", "packing_efficiency", "padding_ratio")}
REGRESSION_RULE = (
    "metrics-regression = a quality metric got worse beyond noise: in an epoch both plans have, an after-stage "
    "metric is worse than in OLD by more than both "
    "max(0.001, TOL x |old value|), TOL = --tolerance (default 0.02, i.e. 2%), and 3 x the spread expected between "
    "two plans of this size from seed to seed alone (measured from the plans' own epochs and, when they are too "
    "few, by planning the new plan's samples again with other seeds). Checked: label_cv and update_label_cv "
    "(higher is worse), packing_efficiency (lower is worse) and padding_ratio = padding_tokens / total_batch_cost "
    "(higher is worse). The report says which limit each regression passed."
)


def rows_summary(rows: dict, noun: bool = False) -> str:
    """A dataset's row changes as people say them: `5 edited, 20 added, 3 removed` (the kinds that happened), with
    `noun`: `... removed rows` (`1 edited row`)."""
    parts = [f"{rows[k]:,} {k}" for k in ("edited", "added", "removed") if rows[k]]
    if not parts:
        return "no row changed"
    total = rows["edited"] + rows["added"] + rows["removed"]
    return ", ".join(parts) + ((" row" if total == 1 else " rows") if noun else "")

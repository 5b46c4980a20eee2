"""Stage summaries from plan arrays (docs/spec.md §6): what a plan does to labels, tokens, padding and updates.

Microbatch statistics cover every microbatch of the epoch, the partial tail included. `updates` is the optimizer
steps a trainer runs (the tail update included, `layout.optimizer_updates`). Update statistics (label totals, rank
spreads) cover the `complete_updates` only (`W*G` microbatches each): a tail's smaller total is not imbalance; its
microbatches are counted in `excluded_tail_microbatches`.
Standard deviations are population deviations. Every value is a plain int or float (None where it does not
apply: `rows_lower_bound` outside packed mode) so the table is JSON-able. `label_cv` and `update_label_cv` are
std/mean, the figures balancing is judged by.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from plancc.config.settings import PlanSettings
from plancc.core.choices import Mode
from plancc.core.layout import complete_updates, optimizer_updates, tail_batches, update_grid
from plancc.core.plan_arrays import Batches, SampleArrays, batch_sums, segment_sum
from plancc.planner.units import PAIRED, UNPAIRED, Units, capacity_settings


def _mean_std(x: np.ndarray) -> tuple[float, float]:
    if x.size == 0:
        return 0.0, 0.0
    x = x.astype(np.float64)
    return float(x.mean()), float(x.std())


def _cv(mean: float, std: float) -> float:
    return std / mean if mean > 0 else 0.0


def _rank_total_cv(grid: np.ndarray) -> float:
    """Mean over complete updates of the CV of the W ranks' totals in the update (what the ranks wait on at the
    update's gradient all-reduce); `grid` is `layout.update_grid`'s (updates, G, W)."""
    totals = grid.sum(axis=1).astype(np.float64)
    mean = totals.mean(axis=1)
    return float(np.where(mean > 0, totals.std(axis=1) / np.maximum(mean, 1e-300), 0.0).mean())


@dataclass(frozen=True)
class SourceDrops:
    """Samples of the source the scan left out (too long, nothing supervised) or cut to --sequence-len before
    planning; zero for a bare samples table, whose history is unknown."""

    dropped: int = 0
    truncated: int = 0


NO_DROPS = SourceDrops()


def summarize(b: Batches, s: SampleArrays, settings: PlanSettings,
              drops: SourceDrops = NO_DROPS) -> dict[str, int | float | None]:
    """One metrics row (without epoch/stage) for one epoch's microbatches; None where a metric does not apply.
    `dropped_samples` counts every source sample missing from the epoch: the scan's drops plus --drop-last's."""
    sums = batch_sums(b, s, settings.shift, settings.mode, settings.pad_multiple)
    labels, tokens, cost, attention, rtok = sums.targets, sums.tokens, sums.cost, sums.attention, sums.rows.tokens
    (mean_l, std_l), (mean_t, std_t), (mean_c, std_c), (mean_a, std_a) = map(_mean_std, (labels, tokens, cost,
                                                                                         attention))
    total_tokens = int(tokens.sum())
    capacity = settings.row_capacity
    slots = b.num_rows * capacity if settings.mode == Mode.PACKED else int(cost.sum())

    W, G = settings.world_size, settings.grad_accum
    n_upd = complete_updates(b.num_batches, W, G)
    label_grid = update_grid(labels, W, G)
    update_totals = label_grid.sum(axis=(1, 2))
    mean_u, std_u = _mean_std(update_totals)
    skew = _naive_weight_skew(label_grid, update_totals, n_upd)
    rank, rank_cv = _rank_spreads(cost, labels, attention, W, G, n_upd)

    return {
        "samples": int(b.samples.shape[0]),
        "dropped_samples": drops.dropped + len(s) - int(b.samples.shape[0]),
        "tail_dropped_samples": len(s) - int(b.samples.shape[0]),
        "truncated_samples": drops.truncated,
        "batches": b.num_batches,
        "packed_rows": b.num_rows,
        "mean_packed_length": float(rtok.mean()) if rtok.size else 0.0,
        "mean_label_count": mean_l,
        "std_label_count": std_l,
        "label_cv": _cv(mean_l, std_l),
        "total_label_count": int(labels.sum()),
        "total_tokens": total_tokens,
        "mean_unpadded_length": mean_t,
        "std_unpadded_length": std_t,
        "max_unpadded_length": int(tokens.max()) if tokens.size else 0,
        "mean_batch_cost": mean_c,
        "std_batch_cost": std_c,
        "max_batch_cost": int(cost.max()) if cost.size else 0,
        "total_batch_cost": int(cost.sum()),
        "padding_tokens": int(cost.sum()) - total_tokens,
        "packing_efficiency": total_tokens / slots if slots else 0.0,
        "rows_lower_bound": math.ceil(total_tokens / capacity) if settings.mode == Mode.PACKED else None,
        "updates": optimizer_updates(b.num_batches, W, G),
        "complete_updates": n_upd,
        "mean_global_update_labels": mean_u,
        "std_global_update_labels": std_u,
        "update_label_cv": _cv(mean_u, std_u),
        "excluded_tail_microbatches": tail_batches(b.num_batches, W, G),
        "mean_rank_cost_spread": rank[0],
        "max_rank_cost_spread": rank[1],
        "mean_rank_label_spread": rank[2],
        "max_rank_label_spread": rank[3],
        "rank_cost_cv": rank_cv[0],
        "attention_cv": _cv(mean_a, std_a),
        "mean_rank_attention_spread": rank[4],
        "max_rank_attention_spread": rank[5],
        "rank_attention_cv": rank_cv[1],
        "max_naive_weight_skew": skew,
    }


def _naive_weight_skew(label_grid: np.ndarray, update_totals: np.ndarray, n_upd: int) -> float:
    """How much a mean-of-means loop over-weights a token: the largest ratio of an update's mean microbatch label
    count to a microbatch's own (docs/spec.md)."""
    if not n_upd:
        return 0.0
    per_update = label_grid.reshape(n_upd, -1)
    means = update_totals / per_update.shape[1]
    return float((means[:, None] / np.maximum(per_update, 1)).max())


def _rank_spreads(cost: np.ndarray, labels: np.ndarray, attention: np.ndarray, W: int, G: int, n_upd: int
                  ) -> tuple[list, list[float]]:
    """(mean and max of the max - min across ranks per (update, micro-step) of cost, labels and attention; the
    CV of the ranks' cost and attention totals), zeros for one rank or no complete update."""
    if W <= 1 or not n_upd:
        return [0.0, 0, 0.0, 0, 0.0, 0], [0.0, 0.0]
    spread = [by_step.max(axis=1) - by_step.min(axis=1) for by_step in
              (update_grid(x, W, G).reshape(-1, W) for x in (cost, labels, attention))]
    rank = [f(x) for x in spread for f in (lambda v: float(v.mean()), lambda v: int(v.max()))]
    return rank, [_rank_total_cv(update_grid(x, W, G)) for x in (cost, attention)]


def summarize_plan(b: Batches, s: SampleArrays, settings: PlanSettings,
                   drops: SourceDrops = NO_DROPS) -> dict[str, int | float | None]:
    """`summarize` of a plan's microbatches of samples with the capacity its rows have, plus the pair (or label)
    figures of preference data (`plancc.planner.units`)."""
    row = summarize(b, s, capacity_settings(settings, s.kind), drops)
    if s.kind == PAIRED:
        chosen = s.chosen[b.samples]
        row.update(_pair_summary(_per_batch(b, chosen), _per_batch(b, entry_targets(b, s, settings.shift) * chosen),
                                 settings))
    elif s.kind == UNPAIRED:
        desirable = s.desirable[b.samples]
        row.update(_label_summary(_per_batch(b, desirable), _per_batch(b, ~desirable), settings))
    return row


def summarize_units(units: Units, b: Batches, settings: PlanSettings,
                    drops: SourceDrops = NO_DROPS) -> dict[str, int | float | None]:
    """`summarize_plan` of unit microbatches `b` (`plancc.planner.units`) as the plan holds them: expanded."""
    return summarize_plan(units.expand(b), units.samples, settings, drops)


def _per_batch(b: Batches, per_entry: np.ndarray) -> np.ndarray:
    """Per microbatch, the sum of a value given for each entry of `b.samples`."""
    return segment_sum(segment_sum(per_entry.astype(np.int64), b.row_bounds), b.batch_bounds)


def _update_cv(values: np.ndarray, settings: PlanSettings) -> tuple[float, float]:
    """(mean, CV) of the complete updates' totals of a per-microbatch value."""
    mean, std = _mean_std(update_grid(values, settings.world_size, settings.grad_accum).sum(axis=(1, 2)))
    return mean, _cv(mean, std)


def _pair_summary(pairs: np.ndarray, chosen_targets: np.ndarray, settings: PlanSettings) -> dict[str, int | float]:
    """Pairs per microbatch and per update, and the CV of the updates' chosen-completion targets."""
    mean, std = _mean_std(pairs)
    mean_u, cv_u = _update_cv(pairs, settings)
    return {"pairs": int(pairs.sum()), "mean_pairs": mean, "pair_cv": _cv(mean, std),
            "mean_global_update_pairs": mean_u, "update_pair_cv": cv_u,
            "update_chosen_label_cv": _update_cv(chosen_targets, settings)[1]}


def _label_summary(desirable: np.ndarray, undesirable: np.ndarray, settings: PlanSettings) -> dict[str, int | float]:
    """Desirable and undesirable completions in all and their CV per update."""
    mean_d, cv_d = _update_cv(desirable, settings)
    return {"desirable": int(desirable.sum()), "undesirable": int(undesirable.sum()),
            "mean_global_update_desirable": mean_d, "update_desirable_cv": cv_d,
            "update_undesirable_cv": _update_cv(undesirable, settings)[1]}


def entry_targets(b: Batches, s: SampleArrays, shift: str) -> np.ndarray:
    """Supervised targets of each entry of `b.samples`, as the collator counts them (docs/spec.md §3): under `row` shift
    only a row's first sample loses its first label."""
    from plancc.core.choices import Shift

    count, first_label = s.label_count[b.samples].astype(np.int64), s.first_label_supervised[b.samples]
    if shift == Shift.NONE:
        return count
    if shift == Shift.ROW:
        starts = np.zeros(b.samples.shape[0], dtype=bool)
        starts[b.row_bounds[:-1][np.diff(b.row_bounds) > 0]] = True
        first_label = first_label & starts
    return count - first_label


def dataset_rows(epoch: int, stage: str, names: list[str], dataset: np.ndarray, length: np.ndarray,
                 targets: np.ndarray, chosen: np.ndarray | None = None) -> list[dict[str, int | float | str]]:
    """A recipe's per-dataset metrics of one epoch and stage: samples, tokens and label tokens of each dataset
    (entries given by their `dataset` index, `length` and `targets`) and its share of the epoch's. Pairs (`chosen`
    given) add `pairs`: a pair's unit is two samples, and a pair drawn twice counts twice, as it trains twice."""
    k = len(names)
    totals = [np.bincount(dataset, weights=w, minlength=k) for w in (None, length, targets)]
    pairs = None if chosen is None else np.bincount(dataset, weights=chosen, minlength=k)
    whole = [float(t.sum()) for t in totals]
    return [{"epoch": epoch, "stage": stage, "dataset": name, "samples": int(totals[0][d]),
             **({} if pairs is None else {"pairs": int(pairs[d])}),
             "tokens": int(totals[1][d]), "label_tokens": int(totals[2][d]),
             **{f"{what}_share": (float(totals[i][d]) / whole[i] if whole[i] else 0.0)
                for i, what in enumerate(("sample", "token", "label"))}}
            for d, name in enumerate(names)]

"""What a plan's rows must add up to, counted again from the samples table with plain numpy: each microbatch's
tokens, supervised targets and cost (docs/spec.md §3), each epoch's summary figures (§6) and a recipe's
per-dataset counts. Written from the spec, not with the compiler's code (`plancc.core.plan_arrays`,
`plancc.planner.metrics`): a bug there makes `validate` disagree with the plan instead of agreeing with it. The
update layout is `plancc.core.layout`'s, the one spec every side shares.

The figures recounted are the counts, totals, means, deviations and the update-level label figures. The rank
spreads, attention and skew figures (what balancing is judged by, not what training relies on) are checked
against the plan's metrics checksum only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from plancc.config.settings import PlanSettings
from plancc.core import layout
from plancc.core.choices import Mode, Shift
from plancc.core.plan_arrays import SampleArrays

FIGURES = ("samples", "dropped_samples", "tail_dropped_samples", "truncated_samples", "batches", "packed_rows",
           "mean_packed_length", "mean_label_count", "std_label_count", "label_cv", "total_label_count",
           "total_tokens", "mean_unpadded_length", "std_unpadded_length", "max_unpadded_length", "mean_batch_cost",
           "std_batch_cost", "max_batch_cost", "total_batch_cost", "padding_tokens", "packing_efficiency",
           "rows_lower_bound", "updates", "complete_updates", "mean_global_update_labels",
           "std_global_update_labels", "update_label_cv", "excluded_tail_microbatches")


@dataclass(frozen=True)
class Rows:
    """Plan rows as positions into the samples: entry k is sample `pos[k]`, row r holds the entries
    `row_bounds[r]:row_bounds[r+1]`, microbatch i the rows `batch_bounds[i]:batch_bounds[i+1]`."""

    pos: np.ndarray
    row_bounds: np.ndarray
    batch_bounds: np.ndarray

    @property
    def num_batches(self) -> int:
        """Microbatches."""
        return int(self.batch_bounds.size - 1)

    @property
    def num_rows(self) -> int:
        """Rows (packed rows, padded samples or flattened rows)."""
        return int(self.row_bounds.size - 1)


def sums(values: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    """Sums of `values` over the segments `bounds` (offsets; empty segments sum to 0)."""
    running = np.concatenate([[0], np.cumsum(values, dtype=np.int64)])
    return running[bounds[1:]] - running[bounds[:-1]]


def entry_targets(rows: Rows, s: SampleArrays, shift: str) -> np.ndarray:
    """Supervised targets of each entry as the collator feeds the loss: a sample's label count, less its first
    label when it starts a sequence (`sample`: every sample does; `row`: only the first of its row; `none`: the
    labels are shifted already)."""
    count = s.label_count[rows.pos].astype(np.int64)
    if shift == Shift.NONE:
        return count
    first = s.first_label_supervised[rows.pos].astype(np.int64)
    if shift == Shift.ROW:
        starts = np.zeros(rows.pos.size, dtype=np.int64)
        nonempty = rows.row_bounds[:-1][np.diff(rows.row_bounds) > 0]
        starts[nonempty] = 1
        first = first * starts
    return count - first


@dataclass(frozen=True)
class Microbatches:
    """Per microbatch: unpadded tokens, supervised targets and token slots (rows x its longest row, rounded up to
    `pad_multiple`); per row: unpadded tokens."""

    tokens: np.ndarray
    label_count: np.ndarray
    cost: np.ndarray
    row_tokens: np.ndarray


def microbatches(rows: Rows, s: SampleArrays, settings: PlanSettings) -> Microbatches:
    """What each microbatch of `rows` holds (see `Microbatches`)."""
    row_tokens = sums(s.length[rows.pos], rows.row_bounds)
    targets = sums(entry_targets(rows, s, settings.shift), rows.row_bounds)
    longest = _longest(row_tokens, rows.batch_bounds)
    padded = -(-longest // settings.pad_multiple) * settings.pad_multiple
    return Microbatches(sums(row_tokens, rows.batch_bounds), sums(targets, rows.batch_bounds),
                        np.diff(rows.batch_bounds) * padded, row_tokens)


def _longest(values: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    """The largest of the non-negative `values` in each segment of `bounds` (0 for an empty one)."""
    out = np.zeros(bounds.size - 1, dtype=np.int64)
    nonempty = np.diff(bounds) > 0
    if nonempty.any():
        out[nonempty] = np.maximum.reduceat(values, bounds[:-1][nonempty])
    return out


def _mean_std(x: np.ndarray) -> tuple[float, float]:
    return (float(x.mean()), float(x.std())) if x.size else (0.0, 0.0)


def epoch_figures(rows: Rows, mb: Microbatches, held: int, settings: PlanSettings, dropped: int,
                  truncated: int) -> dict[str, int | float | None]:
    """The epoch's summary figures (`FIGURES`) from its microbatches; `held`: the samples the epoch should
    hold, `dropped`/`truncated`: the scan's."""
    n, W, G = rows.num_batches, settings.world_size, settings.grad_accum
    update_labels = layout.update_grid(mb.label_count, W, G).sum(axis=(1, 2))  # the complete updates' totals
    total_tokens, total_cost = int(mb.tokens.sum()), int(mb.cost.sum())
    packed, capacity = settings.mode == Mode.PACKED, settings.row_capacity
    slots = rows.num_rows * capacity if packed else total_cost
    (ml, sl), (mt, st), (mc, sc), (mu, su) = (_mean_std(x.astype(np.float64)) for x in (
        mb.label_count, mb.tokens, mb.cost, update_labels))
    return {
        "samples": int(rows.pos.size), "dropped_samples": dropped + held - int(rows.pos.size),
        "tail_dropped_samples": held - int(rows.pos.size), "truncated_samples": truncated, "batches": n,
        "packed_rows": rows.num_rows, "mean_packed_length": _mean_std(mb.row_tokens.astype(np.float64))[0],
        "mean_label_count": ml, "std_label_count": sl, "label_cv": sl / ml if ml > 0 else 0.0,
        "total_label_count": int(mb.label_count.sum()), "total_tokens": total_tokens,
        "mean_unpadded_length": mt, "std_unpadded_length": st, "max_unpadded_length": int(mb.tokens.max(initial=0)),
        "mean_batch_cost": mc, "std_batch_cost": sc, "max_batch_cost": int(mb.cost.max(initial=0)),
        "total_batch_cost": total_cost, "padding_tokens": total_cost - total_tokens,
        "packing_efficiency": total_tokens / slots if slots else 0.0,
        "rows_lower_bound": math.ceil(total_tokens / capacity) if packed else None,
        "updates": layout.optimizer_updates(n, W, G), "complete_updates": layout.complete_updates(n, W, G),
        "mean_global_update_labels": mu, "std_global_update_labels": su, "update_label_cv": su / mu if mu > 0 else 0.0,
        "excluded_tail_microbatches": layout.tail_batches(n, W, G),
    }


def differs(stored: int | float | None, recounted: int | float | None) -> bool:
    """Whether a stored figure is not the recounted one (floats to within rounding of the summation order)."""
    if stored is None or recounted is None:
        return stored is not recounted
    if isinstance(stored, float) or isinstance(recounted, float):
        return not math.isclose(float(stored), float(recounted), rel_tol=1e-9, abs_tol=1e-9)
    return stored != recounted


def dataset_figures(epoch: int, names: list[str], dataset: np.ndarray, length: np.ndarray,
                    targets: np.ndarray, chosen: np.ndarray | None = None) -> list[dict[str, int | float | str]]:
    """A recipe epoch's per-dataset figures (samples, tokens, label tokens and their shares of the epoch's; pairs,
    the chosen completions, where `chosen` is given) from its entries' `dataset` (position in the mixture), `length`
    and supervised `targets`."""
    k = len(names)
    counts = np.bincount(dataset, minlength=k)
    tokens = np.array([int(length[dataset == d].sum()) for d in range(k)], dtype=np.int64)
    labels = np.array([int(targets[dataset == d].sum()) for d in range(k)], dtype=np.int64)
    out: list[dict[str, int | float | str]] = []
    for d, name in enumerate(names):
        row: dict[str, int | float | str] = {"epoch": epoch, "stage": "after", "dataset": name,
                                             "samples": int(counts[d]), "tokens": int(tokens[d]),
                                             **({} if chosen is None else {"pairs": int(chosen[dataset == d].sum())}),
                                             "label_tokens": int(labels[d])}
        for what, values in (("sample", counts), ("token", tokens), ("label", labels)):
            whole = int(values.sum())
            row[f"{what}_share"] = int(values[d]) / whole if whole else 0.0
        out.append(row)
    return out

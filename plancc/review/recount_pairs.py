"""A preference plan's own counts, recounted from its rows and samples table with plain numpy (docs/preference.md),
as `recount` does for every plan: written from the spec, not with the planner's code.

A pair's completions sit side by side, chosen first: entries `2j` and `2j + 1` of the plan's flat sample list, in
one row (packed, flattened) or in two rows of one microbatch (padded). Each microbatch stores its update's global
pair and chosen-target counts (unpaired data: desirable and undesirable completions); a preference row holds
`micro_batch_size` pairs of two completions of `sequence_len` (padded rows: one completion).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from plancc.config.settings import PlanSettings
from plancc.core import layout
from plancc.core.choices import Mode
from plancc.core.plan_arrays import SampleArrays
from plancc.review.recount import Rows, entry_targets, sums
from plancc.store import redraw

PAIRED, UNPAIRED = "preference", "unpaired_preference"


def row_settings(settings: PlanSettings, kind: str) -> PlanSettings:
    """`settings` with the row capacity a plan of `kind` has: a pair's two completions in every packed or flattened
    row's share of `sequence_len`."""
    if kind != PAIRED or settings.mode == Mode.PADDED:
        return settings
    return dataclasses.replace(settings, sequence_len=2 * settings.sequence_len)


def pair_problems(where: str, rows: Rows, s: SampleArrays, mode: str) -> list[str]:
    """Every pair whole and side by side: its chosen completion, then its rejected one, in one row (or two adjacent
    rows of one padded microbatch)."""
    pos = rows.pos
    chosen, rejected = pos[0::2], pos[1::2]
    if pos.size % 2:
        return [f"{where}: {pos.size} completions, not whole pairs"]
    bad = np.flatnonzero(~s.chosen[chosen] | s.chosen[rejected] | (s.pair_id[chosen] != s.pair_id[rejected]))
    if bad.size:
        at = int(2 * bad[0])
        row = int(np.searchsorted(rows.row_bounds[rows.batch_bounds], at, side="right") - 1)
        return [f"{where} row {row}: sample_id {int(s.sample_id[pos[at]])} is not a chosen completion followed by its "
                "pair's rejected one: a pair was split or reordered"]
    bounds = rows.row_bounds[rows.batch_bounds] if mode == Mode.PADDED else rows.row_bounds
    odd = np.flatnonzero(bounds % 2)
    if odd.size:
        unit = "microbatch" if mode == Mode.PADDED else "row"
        return [f"{where}: a pair straddles two {unit}s (at {unit} {int(odd[0])})"]
    return []


def _per_batch(rows: Rows, per_entry: np.ndarray) -> np.ndarray:
    return sums(sums(per_entry.astype(np.int64), rows.row_bounds), rows.batch_bounds)


def counts(rows: Rows, s: SampleArrays, settings: PlanSettings) -> dict[str, np.ndarray]:
    """Per microbatch, the counts a preference loss divides by (pairs and chosen targets, or desirable and
    undesirable completions), each its own microbatch's."""
    if s.kind == PAIRED:
        chosen = s.chosen[rows.pos]
        return {"num_pairs": _per_batch(rows, chosen),
                "num_chosen_items": _per_batch(rows, entry_targets(rows, s, settings.shift) * chosen)}
    if s.kind == UNPAIRED:
        desirable = s.desirable[rows.pos]
        return {"num_desirable": _per_batch(rows, desirable), "num_undesirable": _per_batch(rows, ~desirable)}
    return {}


def update_counts(own: dict[str, np.ndarray], settings: PlanSettings) -> dict[str, np.ndarray]:
    """The plan table's columns: each microbatch's `counts` totalled over its whole update."""
    return {name: layout.num_items(v, settings.world_size, settings.grad_accum) for name, v in own.items()}


def _update_mean_cv(values: np.ndarray, settings: PlanSettings) -> tuple[float, float]:
    totals = layout.update_grid(values, settings.world_size, settings.grad_accum).sum(axis=(1, 2))
    if totals.size == 0:
        return 0.0, 0.0
    mean, std = float(totals.astype(np.float64).mean()), float(totals.astype(np.float64).std())
    return mean, std / mean if mean > 0 else 0.0


def figures(own: dict[str, np.ndarray], settings: PlanSettings) -> dict[str, int | float]:
    """An epoch's preference figures (docs/preference.md) from its microbatches' `counts`."""
    if "num_pairs" in own:
        pairs = own["num_pairs"]
        mean = float(pairs.astype(np.float64).mean()) if pairs.size else 0.0
        std = float(pairs.astype(np.float64).std()) if pairs.size else 0.0
        update_mean, update_cv = _update_mean_cv(pairs, settings)
        return {"pairs": int(pairs.sum()), "mean_pairs": mean, "pair_cv": std / mean if mean > 0 else 0.0,
                "mean_global_update_pairs": update_mean, "update_pair_cv": update_cv,
                "update_chosen_label_cv": _update_mean_cv(own["num_chosen_items"], settings)[1]}
    if "num_desirable" in own:
        desirable, undesirable = own["num_desirable"], own["num_undesirable"]
        mean, cv = _update_mean_cv(desirable, settings)
        return {"desirable": int(desirable.sum()), "undesirable": int(undesirable.sum()),
                "mean_global_update_desirable": mean, "update_desirable_cv": cv,
                "update_undesirable_cv": _update_mean_cv(undesirable, settings)[1]}
    return {}


def eval_ids(s: SampleArrays, settings: PlanSettings, index: np.ndarray | None) -> np.ndarray:
    """The held-out draw (`redraw.eval_ids`) as preference data makes it: of whole pairs, drawn by their `pair_id`
    (one id a pair), both completions of each held out."""
    if s.kind != PAIRED:
        return redraw.eval_ids(s.sample_id, settings, index)
    return redraw.pair_eval_ids(s.sample_id, s.pair_id, s.chosen, settings, index)

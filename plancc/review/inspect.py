"""The read side for humans: a plan's metrics per epoch and stage, and its layout as a trainer rank will see it.

* `read_metrics(plan_dir)`: the metrics table as rows `{epoch, stage, metric...}` (plus `padding_ratio`).
* `plan_view(plan_dir, epoch=, update=, rank=, micro_step=, limit=)`: microbatches in global order (epoch, index) - which is
  (update, micro_step, rank) order - with their rows' sample ids, tokens, labels, cost and the update's global
  label total. Filters are pushed into the Parquet read (row groups are skipped on their statistics) and only
  the first `limit` matching microbatches have their sample ids decoded, so a 10M-sample plan answers fast.
* `before_counts(plan_dir, epoch)`: per-microbatch label counts and per-update totals of the `before` stage
  next to the `after` ones, read from what compile stored (`before.parquet`; nothing is recomputed). A plan of an
  older plancc that did not store them shows `after` only and says so.
* `eval_sizes(plan_dir)`: the eval plan's samples, tokens, label tokens and batches (None without one).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from plancc.core.layout import optimizer_updates, update_grid
from plancc.errors import PlanccError
from plancc.store import parquet, schemas
from plancc.store.plan import Plan

SCALAR_COLUMNS = ["epoch", "index", "update", "rank", "micro_step", "tokens", "label_count", "cost", "num_items",
                  "complete_update"]


def read_metrics(plan_dir: str | Path | Plan, epoch: int | None = None) -> list[dict[str, Any]]:
    """The metrics rows `{epoch, stage, metric..., padding_ratio}` of every epoch (or one), as stored."""
    return as_plan(plan_dir).metrics(epoch)


def as_plan(plan: str | Path | Plan) -> Plan:
    """`plan` itself when already open, else the plan directory opened."""
    return plan if isinstance(plan, Plan) else Plan(plan)


def eval_sizes(plan_dir: str | Path | Plan) -> dict[str, Any] | None:
    """The eval plan's sizes as compile recorded them (samples, tokens, label_count: the targets the eval loss
    divides by, batches, batches_per_rank, cost), or None for a plan without one."""
    plan = as_plan(plan_dir)
    ev = plan.manifest.eval
    return {"val_set_size": plan.settings.val_set_size, **ev.to_json()} if ev is not None else None


def read_dataset_metrics(plan_dir: str | Path, epoch: int | None = None) -> list[dict[str, Any]]:
    """A recipe plan's per-dataset metrics `{epoch, stage, dataset, samples, tokens, label_tokens, *_share}`
    (stages `before`: the mixture as drawn, `after`: what the plan holds); an error for a one-source plan."""
    plan = Plan(plan_dir)
    recipe = plan.manifest.recipe
    if not recipe:
        raise PlanccError(f"{plan_dir} was compiled from one source: --by dataset needs a recipe (several sources "
                          "or a config listing datasets)")
    rows = [r for r in recipe["metrics"] if epoch is None or r["epoch"] == epoch]
    if epoch is not None and not rows:
        raise PlanccError(f"--epoch {epoch}: the plan has no such epoch (epochs: {plan.epochs})")
    return rows


# ---------------------------------------------------------------- plan layout


@dataclass
class PlanView:
    """What `plancc inspect plan` shows: the matching microbatches (the first `limit` with their sample ids) and
    totals over all of them."""

    settings: dict[str, Any]
    fingerprints: dict[str, Any]
    matching: int  # microbatches matching the filters
    tokens: int
    labels: int
    rows: list[dict[str, Any]]  # the first `limit` of them

    def to_json(self) -> dict[str, Any]:
        """The view as `inspect plan --json` prints it."""
        return {"settings": self.settings, "fingerprints": self.fingerprints, "matching_microbatches": self.matching,
                "shown": len(self.rows), "tokens": self.tokens, "labels": self.labels, "microbatches": self.rows}


def _filters(plan: Plan, epoch: int | None, update: int | None, rank: int | None,
             micro_step: int | None) -> list[tuple]:
    """Parquet filters for the given values; a value outside the plan's range is an error naming the range. The
    updates are the optimizer steps a trainer runs (the incomplete tail included), from each epoch's microbatches."""
    epochs = plan.epochs
    W, G = plan.settings.world_size, plan.settings.grad_accum
    updates = [optimizer_updates(e.batches, W, G) for e in plan.manifest.epochs if epoch is None or e.epoch == epoch]
    ranges = {  # name: (value, how many there are, what has that many)
        "epoch": (epoch, None, f"epochs {epochs}"),
        "update": (update, max(updates, default=0), "updates" + ("" if epoch is None else f" in epoch {epoch}")),
        "rank": (rank, W, "ranks (world size)"),
        "micro_step": (micro_step, G, "micro-steps (grad accum)"),
    }
    f = []
    for name, (v, count, what) in ranges.items():
        if v is None:
            continue
        flag = "--" + name.replace("_", "-")
        if name == "epoch" and v not in epochs:
            raise PlanccError(f"{flag} {v}: the plan has {what}")
        if count is not None and not 0 <= v < count:
            valid = f"0..{count - 1}" if count else "none"
            raise PlanccError(f"{flag} {v} is out of range: the plan has {count:,} {what} ({valid})")
        f.append((name, "=", int(v)))
    return f


def plan_view(plan_dir: str | Path, *, epoch: int | None = None, update: int | None = None,
              rank: int | None = None, micro_step: int | None = None, limit: int = 20) -> PlanView:
    """The matching microbatches in global order; only the first `limit` (0: all) carry their sample ids."""
    plan = Plan(plan_dir)
    if limit < 0:
        raise PlanccError(f"--limit must be >= 0, got {limit}")
    filters = _filters(plan, epoch, update, rank, micro_step) or None
    scalar = SCALAR_COLUMNS + plan.files.kind_columns  # a preference plan's update totals too (pairs, ...)
    head = plan.files.read_rows(scalar, filters)
    head = head.take(pc.sort_indices(head, [("epoch", "ascending"), ("index", "ascending")]))
    matching = head.num_rows
    tokens = int(pc.sum(head.column("tokens")).as_py() or 0)
    labels = int(pc.sum(head.column("label_count")).as_py() or 0)
    shown = head if limit == 0 else head.slice(0, limit)
    rows: list[dict[str, Any]] = []
    if shown.num_rows:
        ep = shown.column("epoch").to_numpy().astype(np.int64)
        ix = shown.column("index").to_numpy()
        wanted = ep * (1 << 40) + ix
        f2 = [*(filters or []), ("epoch", ">=", int(ep.min())), ("epoch", "<=", int(ep.max())),
              ("index", ">=", int(ix.min())), ("index", "<=", int(ix.max()))]
        full = plan.files.read_rows(["epoch", "index", "sample_ids"], f2)
        key = full.column("epoch").to_numpy().astype(np.int64) * (1 << 40) + full.column("index").to_numpy()
        order = np.argsort(key, kind="stable")
        at = order[np.searchsorted(key[order], wanted)]
        ids_col = full.column("sample_ids").take(pa.array(at))
        flat, row_bounds, batch_bounds = parquet.nested_arrays(ids_col)
        scalars = shown.to_pydict()
        for i in range(shown.num_rows):
            r0, r1 = int(batch_bounds[i]), int(batch_bounds[i + 1])
            sample_rows = [flat[row_bounds[r]: row_bounds[r + 1]].tolist() for r in range(r0, r1)]
            rows.append({**{k: scalars[k][i] for k in scalar}, "rows": r1 - r0,
                         "samples": int(row_bounds[r1] - row_bounds[r0]), "sample_ids": sample_rows})
    return PlanView(plan.settings.to_dict(), plan.fingerprints, matching, tokens, labels, rows)


# ---------------------------------------------------------------- before vs after counts


@dataclass
class StageCounts:
    """Supervised targets per microbatch of one stage, and their totals per complete update."""

    label_counts: np.ndarray  # per microbatch
    update_totals: np.ndarray  # per complete update


@dataclass
class BeforeAfter:
    """One epoch's counts before and after balancing (what `inspect metrics --plot` draws)."""

    epoch: int
    before: StageCounts | None  # None for a plan that did not store its before stage
    after: StageCounts
    note: str


def _stage(labels: np.ndarray, world_size: int, grad_accum: int) -> StageCounts:
    return StageCounts(labels, update_grid(labels, world_size, grad_accum).sum(axis=(1, 2)))


def before_counts(plan_dir: str | Path | Plan, epoch: int) -> BeforeAfter:
    """The `before` and `after` label counts of `epoch`, as compile stored them (see module doc)."""
    plan = as_plan(plan_dir)
    if epoch not in plan.epochs:
        raise PlanccError(f"--epoch {epoch}: the plan has epochs {plan.epochs}")
    W, G = plan.settings.world_size, plan.settings.grad_accum
    after = _stage(parquet.column(plan.files.read_epoch(epoch, ["index", "label_count"]), "label_count"), W, G)
    labels = plan.files.before_labels(epoch)
    if labels is None:
        return BeforeAfter(epoch, None, after, "before stage not stored (a plan of an older plancc): after only")
    return BeforeAfter(epoch, _stage(labels, W, G), after, f"before as compiled ({schemas.BEFORE_FILE})")

"""The read side for humans: a plan's metrics per epoch and stage, and its layout as a trainer rank will see it.

* `read_metrics(plan_dir)`: the metrics table as rows `{epoch, stage, metric...}` (plus `padding_ratio`).
* `plan_view(plan_dir, epoch=, update=, rank=, micro_step=, limit=)`: microbatches in global order (epoch, index) - which is
  (update, micro_step, rank) order - with their rows' sample ids, tokens, labels, cost and the update's global
  label total. Filters are pushed into the Parquet read (row groups are skipped on their statistics) and only
  the first `limit` matching microbatches have their sample ids decoded, so a 10M-sample plan answers fast.
* `before_counts(plan_dir, epoch)`: per-microbatch label counts and per-update totals of the `before` stage.
  The plan stores only the final (`after`) layout; the `before` layout is recomputed from the plan's own samples
  table and settings by the compile pipeline's own first step (`pipeline.before_batches`), which is
  deterministic. The recomputation is checked against the stored `before` metrics;
  when they disagree (a plan written by another plancc version) it is reported as not reproduced.
* `metrics_tables(rows)`: rich tables, one per epoch, metrics down, stages across.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from plancc import store
from plancc.errors import PlanccError

SCALAR_COLUMNS = ["epoch", "index", "update", "rank", "micro_step", "tokens", "label_count", "cost", "num_items",
                  "complete_update"]

# metrics shown first (and in this order) in the human table; the rest follow in METRIC_COLUMNS order
HEADLINE = ("samples", "batches", "updates", "label_cv", "update_label_cv", "packing_efficiency", "padding_ratio",
            "max_naive_weight_skew")


def _plan_dir(plan_dir: str | Path) -> Path:
    p = Path(plan_dir)
    if p.is_file() and p.name == store.PLAN_FILE:
        p = p.parent
    if not p.is_dir():
        raise store.StoreError(f"{plan_dir} is not a plan directory" + ("" if p.exists() else " (it does not exist)"))
    if not (p / store.PLAN_FILE).exists():
        raise store.StoreError(f"{plan_dir} is not a plan directory (no {store.PLAN_FILE}); write one with "
                               "`plancc compile SOURCE -o PLAN_DIR`")
    meta = store.read_file_meta(p / store.PLAN_FILE)
    if meta.get("kind") != "plan":
        raise store.StoreError(f"{p / store.PLAN_FILE} is a plancc '{meta.get('kind')}' file, not a plan")
    return p


def plan_meta(plan_dir: str | Path) -> dict[str, Any]:
    return store.read_file_meta(_plan_dir(plan_dir) / store.PLAN_FILE)


def read_metrics(plan_dir: str | Path, epoch: int | None = None) -> list[dict[str, Any]]:
    p = _plan_dir(plan_dir)
    rows = store.read_table(p / store.METRICS_FILE, store.metrics_schema()).to_pylist()
    out = []
    for r in rows:
        if epoch is not None and r["epoch"] != epoch:
            continue
        cost, pad = r.get("total_batch_cost"), r.get("padding_tokens")
        r["padding_ratio"] = (pad / cost if cost else 0.0) if cost is not None and pad is not None else None
        out.append(r)
    if epoch is not None and not out:
        raise PlanccError(f"--epoch {epoch}: the plan has no such epoch "
                          f"(epochs: {sorted({r['epoch'] for r in rows})})")
    return out


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4f}" if abs(v) < 1e6 else f"{v:.4g}"
    return f"{v:,}" if isinstance(v, int) else str(v)


def metrics_tables(rows: list[dict[str, Any]], compact: bool = False):
    """One rich Table per epoch: metrics down, stages across (before, balancing stages, after); `compact`: only
    the headline metrics and the before and after stages (fits 80 columns)."""
    from rich.table import Table

    from plancc.metric_columns import METRIC_COLUMNS

    names = list(HEADLINE) + ([] if compact else [n for n, _ in METRIC_COLUMNS if n not in HEADLINE])
    tables = []
    for e in sorted({r["epoch"] for r in rows}):
        stages = [r for r in rows if r["epoch"] == e and (not compact or r["stage"] in ("before", "after"))]
        t = Table(title=f"epoch {e}", title_justify="left")
        t.add_column("metric")
        for r in stages:
            t.add_column(r["stage"], justify="right")
        for n in names:
            values = [r.get(n) for r in stages]
            if all(v is None for v in values):
                continue
            t.add_row(n, *(_fmt(v) for v in values))
        tables.append(t)
    return tables


# ---------------------------------------------------------------- plan layout


@dataclass
class PlanView:
    settings: dict[str, Any]
    fingerprints: dict[str, Any]
    matching: int  # microbatches matching the filters
    tokens: int
    labels: int
    rows: list[dict[str, Any]]  # the first `limit` of them

    def to_json(self) -> dict[str, Any]:
        return {"settings": self.settings, "fingerprints": self.fingerprints, "matching_microbatches": self.matching,
                "shown": len(self.rows), "tokens": self.tokens, "labels": self.labels, "microbatches": self.rows}


def _filters(plan_dir: Path, meta: dict[str, Any], epoch: int | None, update: int | None, rank: int | None,
             micro_step: int | None) -> list[tuple]:
    """Parquet filters for the given values; a value outside the plan's range is an error naming the range."""
    settings = meta["settings"]
    epochs = sorted(int(e) for e in meta["fingerprints"].get("plan", {}))
    updates = [e["updates"] for e in store.read_manifest(plan_dir).get("epochs", [])
               if epoch is None or e["epoch"] == epoch] if update is not None else []
    ranges = {  # name: (value, how many there are, what has that many)
        "epoch": (epoch, None, f"epochs {epochs}"),
        "update": (update, max(updates, default=0), "updates" + ("" if epoch is None else f" in epoch {epoch}")),
        "rank": (rank, settings.get("world_size", 1), "ranks (world size)"),
        "micro_step": (micro_step, settings.get("grad_accum", 1), "micro-steps (grad accum)"),
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
    p = _plan_dir(plan_dir)
    meta = store.read_file_meta(p / store.PLAN_FILE)
    settings = meta["settings"]
    if limit < 0:
        raise PlanccError(f"--limit must be >= 0, got {limit}")
    path = p / store.PLAN_FILE
    filters = _filters(p, meta, epoch, update, rank, micro_step) or None
    head = store.read_table(path, store.PLAN_SCHEMA, columns=SCALAR_COLUMNS, filters=filters)
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
        full = store.read_table(path, store.PLAN_SCHEMA, columns=["epoch", "index", "sample_ids"], filters=f2)
        key = full.column("epoch").to_numpy().astype(np.int64) * (1 << 40) + full.column("index").to_numpy()
        order = np.argsort(key, kind="stable")
        at = order[np.searchsorted(key[order], wanted)]
        ids_col = full.column("sample_ids").take(pa.array(at))
        flat, row_bounds, batch_bounds = store.nested_arrays(ids_col)
        scalars = shown.to_pydict()
        for i in range(shown.num_rows):
            r0, r1 = int(batch_bounds[i]), int(batch_bounds[i + 1])
            sample_rows = [flat[row_bounds[r]: row_bounds[r + 1]].tolist() for r in range(r0, r1)]
            rows.append({**{k: scalars[k][i] for k in SCALAR_COLUMNS}, "rows": r1 - r0,
                         "samples": int(row_bounds[r1] - row_bounds[r0]), "sample_ids": sample_rows})
    return PlanView(settings, meta["fingerprints"], matching, tokens, labels, rows)


def format_ids(sample_rows: list[list[int]], max_ids: int) -> str:
    """Rows separated by ' | ', at most `max_ids` ids in all (0: all), ' …' when cut."""
    out: list[str] = []
    left = max_ids if max_ids > 0 else None
    cut = False
    for row in sample_rows:
        if left is not None and left <= 0:
            cut = True
            break
        part = row if left is None else row[:left]
        if left is not None:
            left -= len(part)
        cut = cut or len(part) < len(row)
        out.append(",".join(str(i) for i in part))
    return " | ".join(out) + (" …" if cut else "")


def console():
    """A rich console on stdout; when piped (CI logs, files) wide enough that tables do not wrap."""
    from rich.console import Console

    c = Console()
    return c if c.is_terminal else Console(width=200)


def plan_table(view: PlanView, max_ids: int = 8):
    from rich.table import Table

    t = Table()
    for name in ("epoch", "update", "step", "rank", "index", "rows", "samples", "tokens", "labels", "cost",
                 "upd labels"):
        t.add_column(name, justify="right", no_wrap=True)
    t.add_column("sample ids (rows split by |)", overflow="fold")
    for r in view.rows:
        t.add_row(*(str(r[k]) for k in ("epoch", "update", "micro_step", "rank", "index", "rows", "samples",
                                         "tokens", "label_count", "cost", "num_items")),
                  format_ids(r["sample_ids"], max_ids))
    return t


# ---------------------------------------------------------------- before vs after counts


@dataclass
class StageCounts:
    label_counts: np.ndarray  # per microbatch
    update_totals: np.ndarray  # per complete update


@dataclass
class BeforeAfter:
    epoch: int
    before: StageCounts | None  # None when the before plan could not be reproduced
    after: StageCounts
    note: str


def _update_totals(labels: np.ndarray, per_update: int) -> np.ndarray:
    n = labels.shape[0] // per_update
    return labels[: n * per_update].reshape(n, per_update).sum(axis=1)


def before_counts(plan_dir: str | Path, epoch: int) -> BeforeAfter:
    """Recompute the `before` stage of `epoch` from the plan's samples table and settings (see module doc)."""
    from plancc.build import sample_arrays
    from plancc.config import PlanSettings
    from plancc.metrics import summarize
    from plancc.pipeline import before_batches
    from plancc.plan import batch_targets

    p = _plan_dir(plan_dir)
    meta = store.read_file_meta(p / store.PLAN_FILE)
    if str(epoch) not in meta["fingerprints"].get("plan", {}):
        raise PlanccError(f"--epoch {epoch}: the plan has epochs "
                          f"{sorted(int(e) for e in meta['fingerprints'].get('plan', {}))}")
    try:
        settings = PlanSettings(**meta["settings"])
    except TypeError as exc:
        raise store.StoreError(f"{p / store.PLAN_FILE}: settings this plancc does not know ({exc})") from None
    per_update = settings.batches_per_update
    after_labels = store.read_plan(p, epoch=epoch, columns=["index", "label_count"])
    after_labels = after_labels.take(pc.sort_indices(after_labels, [("index", "ascending")]))
    a = after_labels.column("label_count").to_numpy()
    after = StageCounts(a, _update_totals(a, per_update))

    s = sample_arrays(store.read_samples(p / store.SAMPLES_FILE))
    b, _ = before_batches(s, settings, epoch)
    stored = {r["stage"]: r for r in read_metrics(p, epoch)}.get("before")
    again = summarize(b, s, settings)
    keys = ("batches", "total_label_count", "std_label_count", "std_global_update_labels")
    if stored is None or any(
        stored.get(k) is None or not np.isclose(float(stored[k]), float(again[k]), rtol=1e-9, atol=1e-9) for k in keys
    ):
        return BeforeAfter(epoch, None, after, "before stage not reproduced by this plancc version: after only")
    labels = batch_targets(b, s, settings.shift)
    before = StageCounts(labels, _update_totals(labels, per_update))
    return BeforeAfter(epoch, before, after, "before recomputed from samples.parquet + settings (verified)")

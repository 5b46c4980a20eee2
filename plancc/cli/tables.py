"""The rich tables `plancc inspect` prints: metrics per epoch and stage, per dataset, the eval plan's sizes, and the
plan's microbatches; presentation only, from what `plancc.api` returns."""

from __future__ import annotations

from typing import Any

from plancc.core.metric_columns import KIND_METRIC_COLUMNS, METRIC_COLUMNS
from plancc.core.numbers import format_number

# metrics shown first (and in this order) in the human table; the rest follow in METRIC_COLUMNS order
HEADLINE = ("samples", "batches", "updates", "label_cv", "update_label_cv", "packing_efficiency", "padding_ratio",
            "max_naive_weight_skew")
# a preference plan's headline: pairs (or labels) per microbatch and update, shown after HEADLINE when present
KIND_HEADLINE = ("pairs", "pair_cv", "update_pair_cv", "update_chosen_label_cv", "desirable", "update_desirable_cv",
                 "update_undesirable_cv")
DATASET_METRICS = ("samples", "sample_share", "tokens", "token_share", "label_tokens", "label_share")


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


def plan_table(view: Any, max_ids: int = 8):
    """A rich Table of a `plancc.api.plan_layout` view's microbatches, at most `max_ids` sample ids each (0: all)."""
    from rich.table import Table

    t = Table()
    pairs = bool(view.rows) and "num_pairs" in view.rows[0]  # a preference plan: pairs side by side, chosen first
    for name in ("epoch", "update", "step", "rank", "index", "rows", "samples", "tokens", "labels", "cost",
                 "upd labels", *(("pairs", "upd pairs") if pairs else ())):
        t.add_column(name, justify="right", no_wrap=True)
    t.add_column("sample ids (rows split by |" + ("; pairs chosen,rejected" if pairs else "") + ")", overflow="fold")
    for r in view.rows:
        t.add_row(*(str(r[k]) for k in ("epoch", "update", "micro_step", "rank", "index", "rows", "samples",
                                         "tokens", "label_count", "cost", "num_items")),
                  *((str(r["samples"] // 2), str(r["num_pairs"])) if pairs else ()),
                  format_ids(r["sample_ids"], max_ids))
    return t


def eval_table(sizes: dict[str, Any]):
    """A rich Table of the eval plan's sizes (`plancc.api.eval_sizes`)."""
    from rich.table import Table

    t = Table(title="eval plan (held out, seen once per evaluation)", title_justify="left")
    t.add_column("metric")
    t.add_column("eval", justify="right")
    for name in ("val_set_size", "samples", "tokens", "label_count", "batches", "batches_per_rank", "cost"):
        t.add_row(name, format_number(sizes[name]))
    return t


def metrics_tables(rows: list[dict[str, Any]], compact: bool = False):
    """One rich Table per epoch: metrics down, stages across (before, balancing stages, after); `compact`: only
    the headline metrics and the before and after stages (fits 80 columns)."""
    from rich.table import Table

    kinds = [n for cols in KIND_METRIC_COLUMNS.values() for n, _ in cols]
    names = [*HEADLINE, *KIND_HEADLINE] + ([] if compact else [n for n, _ in METRIC_COLUMNS if n not in HEADLINE]
                                           + [n for n in kinds if n not in KIND_HEADLINE])
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
            t.add_row(n, *(format_number(v) for v in values))
        tables.append(t)
    return tables


def dataset_tables(rows: list[dict[str, Any]]):
    """One rich Table per epoch: datasets down, each metric before -> after across."""
    from rich.table import Table

    tables = []
    for e in sorted({r["epoch"] for r in rows}):
        by = {(r["dataset"], r["stage"]): r for r in rows if r["epoch"] == e}
        t = Table(title=f"epoch {e} by dataset", title_justify="left")
        t.add_column("dataset")
        names = ("pairs", *DATASET_METRICS) if any("pairs" in r for r in rows) else DATASET_METRICS
        for name in names:
            t.add_column(name, justify="right")
        for dataset in dict.fromkeys(r["dataset"] for r in rows if r["epoch"] == e):
            before, after = by[(dataset, "before")], by[(dataset, "after")]
            t.add_row(dataset, *(format_number(after[n]) if before[n] == after[n] else
                                 f"{format_number(before[n])} → {format_number(after[n])}" for n in names))
        tables.append(t)
    return tables

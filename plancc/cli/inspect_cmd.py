"""`plancc inspect metrics|plan PLAN_DIR`: parse, call `plancc.api`, print (`plancc.cli.tables`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from plancc.cli.common import JsonOpt, QuietOpt, app, fail_on_errors, print_json

inspect_app = typer.Typer(
    name="inspect",
    help="Look inside a plan: metrics per epoch and stage, or the microbatch layout a trainer rank will see."
         "\n\nExample:\n\n    plancc inspect metrics plans/chat --plot chat.png",
    no_args_is_help=True,
)
app.add_typer(inspect_app, name="inspect")

PlanArg = Annotated[Path, typer.Argument(help="Plan directory (written by `plancc compile`).")]
EpochOpt = Annotated[int | None, typer.Option("--epoch", help="Only this epoch.", show_default="all")]


@inspect_app.command(
    "metrics",
    help="Before/after metrics per epoch and stage (label CV, update CV, packing efficiency, padding, rank "
         "spread, naive weight skew...), and the eval plan's sizes (samples, tokens, label tokens, batches). --plot FILE.png draws histograms of labels per microbatch and per update, "
         "before vs after balancing, both as compile stored them (before.parquet)."
         "\n\nExample:\n\n    plancc inspect metrics plans/chat --epoch 0 --plot chat.png",
)
def metrics_cmd(
    plan_dir: PlanArg,
    epoch: EpochOpt = None,
    plot: Annotated[Path | None, typer.Option("--plot", help="Write before/after histograms to this PNG "
                                                             "(needs the `plot` extra: matplotlib).",
                                              show_default="none")] = None,
    compact: Annotated[bool, typer.Option("--compact", help="Only the headline metrics, before and after.")
                       ] = False,
    by: Annotated[str | None, typer.Option("--by", help="dataset: a recipe's samples, tokens and label tokens per "
                                                        "dataset and their shares of each epoch, before -> after.",
                                           show_default="none: the whole plan")] = None,
    quiet: QuietOpt = False,
    json: JsonOpt = False,
) -> None:
    """`plancc inspect metrics`: the stored metrics as tables or JSON, and the optional before/after plot."""
    from plancc import api
    from plancc.cli import tables

    if by is not None:
        _by_dataset(plan_dir, by, epoch, quiet, json)
        return
    with fail_on_errors():
        plan = api.open_plan(plan_dir)  # opened once: the metrics, eval sizes and plot are of one plan
        rows = api.metrics(plan, epoch)
        sizes = api.eval_sizes(plan)
        notes = [] if plot is None else api.plot_metrics(plan, plot, None if epoch is None else [epoch])
    if json:
        out: dict = {"plan_dir": str(plan_dir), "metrics": rows, "eval": sizes}
        if plot is not None:
            out["plot"] = {"file": str(plot), "notes": notes}
        print_json(out)
        return
    if quiet:
        return
    console = tables.console()
    for table in tables.metrics_tables(rows, compact=compact):
        console.print(table)
    if sizes is not None:
        console.print(tables.eval_table(sizes))
    if plot is not None:
        console.print(f"wrote {plot}")
        for n in notes:
            console.print(f"  {n}")


def _by_dataset(plan_dir: Path, by: str, epoch: int | None, quiet: bool, json: bool) -> None:
    """`inspect metrics --by dataset`: a recipe's per-dataset metrics."""
    from plancc import api
    from plancc.cli import tables
    from plancc.errors import SettingsError

    with fail_on_errors():
        if by != "dataset":
            raise SettingsError(f"--by {by}: expected dataset")
        rows = api.dataset_metrics(plan_dir, epoch)
    if json:
        print_json({"plan_dir": str(plan_dir), "by": "dataset", "metrics": rows})
    elif not quiet:
        console = tables.console()
        for table in tables.dataset_tables(rows):
            console.print(table)


@inspect_app.command(
    "plan",
    help="The plan's layout in global order (update, micro-step, rank): rows, sample ids, tokens, labels, cost "
         "and the update's global label total, filtered by --epoch/--update/--rank/--micro-step (a value out of "
         "the plan's range is an error naming the range). Only the first --limit "
         "microbatches are decoded and shown (0: all); totals cover every matching one."
         "\n\nExample:\n\n    plancc inspect plan plans/chat --epoch 0 --rank 1 --update 3",
)
def plan_cmd(
    plan_dir: PlanArg,
    epoch: EpochOpt = None,
    update: Annotated[int | None, typer.Option("--update", help="Only this optimizer update (the last may be the "
                                                "incomplete final update: it trains too unless --drop-last).",
                                               show_default="all")] = None,
    rank: Annotated[int | None, typer.Option("--rank", help="Only what this data-parallel rank sees.",
                                             show_default="all")] = None,
    micro_step: Annotated[int | None, typer.Option("--micro-step", help="Only this accumulation step of each "
                                                                        "update.", show_default="all")] = None,
    limit: Annotated[int, typer.Option("--limit", help="Show at most this many microbatches (0: all).")] = 20,
    ids: Annotated[int, typer.Option("--ids", help="Sample ids shown per microbatch in the table (0: all; "
                                                   "--json always has all).")] = 8,
    quiet: QuietOpt = False,
    json: JsonOpt = False,
) -> None:
    """`plancc inspect plan`: the filtered microbatches as a table or JSON."""
    from plancc import api
    from plancc.cli import tables

    with fail_on_errors():
        view = api.plan_layout(plan_dir, epoch=epoch, update=update, rank=rank, micro_step=micro_step, limit=limit)
    if json:
        print_json({"plan_dir": str(plan_dir), **view.to_json()})
        return
    if quiet:
        return
    s = view.settings
    console = tables.console()
    console.print(f"{plan_dir}: mode {s.get('mode')}, micro_batch_size {s.get('micro_batch_size')}, sequence_len "
                  f"{s.get('sequence_len')}, world_size {s.get('world_size')}, grad_accum {s.get('grad_accum')}, "
                  f"epochs {s.get('epochs')}")
    console.print(f"{view.matching:,} matching microbatches, {view.tokens:,} tokens, {view.labels:,} labels; "
                  f"showing {len(view.rows):,}")
    if view.rows:
        console.print(tables.plan_table(view, ids))
    if len(view.rows) < view.matching:
        console.print(f"… {view.matching - len(view.rows):,} more (narrow with --epoch/--update/--rank/--micro-step "
                      "or raise "
                      "--limit)")

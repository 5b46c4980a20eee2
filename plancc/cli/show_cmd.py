"""`plancc show PLAN_OR_SCAN --sample ID` (`plancc.api.sample`) or `--dropped` (`plancc.api.dropped`): parse,
call, print."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from plancc.cli.common import JsonOpt, QuietOpt, app, fail_on_errors, print_json

OPEN, CLOSE = "[[", "]]"  # supervised text without colour
STYLE = "bold green"


@app.command(
    "show",
    help="One sample as the model will see it: the decoded text with the supervised tokens (the targets of the "
         f"loss) highlighted, or between {OPEN} {CLOSE} when not a terminal or with --no-color; its length, label "
         "count and first-label flag; --ids lists token ids, pieces and labels side by side. Decodes with the "
         "tokenizer the scan recorded. --dropped lists every row the scan dropped, with why, and the rows it "
         "truncated.\n\nExample:\n\n    plancc show plans/chat --sample 3 --ids",
)
def show_cmd(
    directory: Annotated[Path, typer.Argument(help="Plan or scan directory.")],
    sample: Annotated[int | None, typer.Option("--sample", help="Sample id (the source row).",
                                               show_default="none: give --sample or --dropped")] = None,
    dropped: Annotated[bool, typer.Option("--dropped", help="List the rows the scan dropped (with why) and "
                                                            "truncated, instead of a sample.")] = False,
    ids: Annotated[bool, typer.Option("--ids", help="Also a table: position, id, piece, label.")] = False,
    no_color: Annotated[bool, typer.Option("--no-color", help=f"Mark supervised text with {OPEN} {CLOSE}, no "
                                                              "colours.")] = False,
    tokenizer: Annotated[str | None, typer.Option("--tokenizer", help="Where the recorded tokenizer is now.",
                                                  show_default="where it was at scan")] = None,
    quiet: QuietOpt = False,
    json: JsonOpt = False,
) -> None:
    """`plancc show`: one sample decoded, supervised text marked, optionally token by token."""
    from plancc import api

    if dropped:
        _dropped(directory, quiet, json)
        return
    with fail_on_errors():
        if sample is None:
            from plancc.errors import InputError

            raise InputError("plancc show: give --sample ID (one sample) or --dropped (the dropped rows)")
        view = api.sample(directory, sample, tokenizer)
    if json:
        print_json({"dir": str(directory), **view.to_json()})
        return
    if quiet:
        return
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = Console(highlight=False, no_color=no_color)
    styled = console.is_terminal and not no_color
    origin = f" (dataset {view.dataset}, row {view.row})" if view.dataset is not None else ""
    label = "" if view.desirable is None else f", {'desirable' if view.desirable else 'undesirable'}"
    console.print(f"sample {view.sample_id}{origin}{label}: {view.length:,} tokens, {view.label_count:,} labels, "
                  f"{int(view.supervised.sum()):,} supervised tokens, first label supervised: "
                  f"{'yes' if view.first_label_supervised else 'no'}\ntokenizer {view.tokenizer}"
                  + (f"\ntrained: {view.trained}" if view.trained else ""), markup=False,
                  soft_wrap=True)
    if view.partner is None:
        console.print(_marked(view, styled), soft_wrap=True)
    else:
        console.print(_pair_table(view, styled))
    if ids:
        t = Table("pos", "id", "piece", "label", "supervised")
        for i, (tid, piece, label, sup) in enumerate(zip(view.input_ids, view.pieces, view.labels, view.supervised,
                                                         strict=True)):
            t.add_row(str(i), str(tid), Text(repr(piece)[1:-1]), str(label),
                      "yes" if sup else "", style=STYLE if sup and styled else None)
        console.print(t)


def _marked(view, styled: bool):
    """The view's decoded text, its supervised runs styled (or between OPEN and CLOSE)."""
    from rich.text import Text

    text = Text()
    for part, supervised in view.segments:
        if supervised and styled:
            text.append(part, style=STYLE)
        else:
            text.append(f"{OPEN}{part}{CLOSE}" if supervised else part)
    return text


def _dropped(directory: Path, quiet: bool, json: bool) -> None:
    """`show --dropped`: one line a dropped row, then the truncated count."""
    from plancc import api

    with fail_on_errors():
        listed = api.dropped(directory)
    if json:
        print_json({"dir": str(directory), **listed})
        return
    if quiet:
        return
    for r in listed["dropped"]:
        where = f" (dataset {r['dataset']}, row {r['dataset_row']})" if "dataset" in r else ""
        typer.echo(f"row {r['row']}{where}: {r['reason']} ({r['tokens']:,} tokens)")
    t = listed["truncated"]
    firsts = ", ".join(map(str, t["first_rows"])) + (", ..." if t["count"] > len(t["first_rows"]) else "")
    typer.echo(f"{len(listed['dropped']):,} rows dropped; {t['count']:,} truncated" + (f" (rows {firsts})"
                                                                                      if t["count"] else ""))


def _pair_table(view, styled: bool):
    """A preference pair: its chosen and its rejected completion side by side."""
    from rich.table import Table

    pair = sorted((view, view.partner), key=lambda v: v.pair_role != "chosen")
    t = Table(title=f"pair {view.pair_id}", title_justify="left", show_lines=True)
    for v in pair:
        t.add_column(f"{v.pair_role}: sample {v.sample_id} ({v.length:,} tokens, "
                     f"{int(v.supervised.sum()):,} supervised)", overflow="fold", ratio=1)
    t.add_row(*(_marked(v, styled) for v in pair))
    return t

"""`plancc diff OLD NEW`: parse, call `plancc.api.diff`, render (`plancc.cli.diff_render`), choose the exit code."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from plancc.cli.common import QuietOpt, app, fail_on_errors, print_json
from plancc.errors import PlanccError
from plancc.review.diff_rules import DEFAULT_TOLERANCE, FAIL_ON, FAIL_ON_HELP, REGRESSION_RULE

_HELP = (
    "Compare two plan directories, the way a reviewer reads a pull request: what changed (rows added, removed and "
    "edited per dataset, with example rows; every changed setting by name with both values, per dataset where it "
    "applies), what it does to training (samples, tokens, updates, label tokens and label shares), and whether a "
    "quality metric got worse beyond noise. Details: fingerprints, metric deltas, membership churn.\n\n"
    "Exit codes: 0 no failure (identical plans say so), 1 a change selected by --fail-on, 2 unreadable or "
    "foreign input.\n\n"
    "--fail-on (repeatable or comma-separated): " + FAIL_ON_HELP + " " + REGRESSION_RULE + "\n\n"
    "Example:\n\n"
    "    plancc diff base-plan/ pr-plan/ --format markdown --fail-on dataset,masks,metrics-regression > comment.md"
)


@app.command("diff", help=_HELP)
def diff_cmd(
    old: Annotated[Path, typer.Argument(help="The reference plan directory (e.g. the base branch's).")],
    new: Annotated[Path, typer.Argument(help="The plan directory to compare with it.")],
    format: Annotated[str, typer.Option("--format", "-f", help="text|json|markdown (markdown: a compact CI "
                                                               "comment).")] = "text",
    fail_on: Annotated[list[str] | None, typer.Option("--fail-on", help="|".join(FAIL_ON) + "; repeat or "
                                                                         "comma-separate.",
                                                  show_default="none, report only")] = None,
    tolerance: Annotated[float, typer.Option("--tolerance", help="Relative slack of metrics-regression (the "
                                                                 "seed-to-seed spread is allowed besides).")
                         ] = DEFAULT_TOLERANCE,
    rows: Annotated[bool, typer.Option("--rows", help="Name every added, removed and edited row (else the first "
                                                      "10 of each kind per dataset).")] = False,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Also write the rendered diff to this "
                                                                       "file.", show_default="none")] = None,
    quiet: QuietOpt = False,
    json: Annotated[bool, typer.Option("--json", help="Same as --format json.")] = False,
) -> None:
    """`plancc diff`: compare, render in the chosen format, exit 1 on a `--fail-on` change."""
    from plancc import api
    from plancc.cli import diff_render

    format = "json" if json else format
    with fail_on_errors():
        if format not in ("text", "json", "markdown"):
            raise PlanccError(f"--format must be one of text, json, markdown; got {format!r}")
        report = api.diff(old, new, fail_on=fail_on, tolerance=tolerance, rows=rows)
        failed = report["failed"]
        if format == "json":
            text = None
            if not quiet:
                print_json(report)
        else:
            render = diff_render.render_markdown if format == "markdown" else diff_render.render_text
            text = render(report, failed)
            if not quiet:
                typer.echo(text, nl=False)
        if output is not None:
            if text is None:
                import orjson

                output.write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS) + b"\n")
            else:
                output.write_text(text, encoding="utf-8")
    if failed:
        if format != "text" or quiet:
            typer.echo("diff failed: " + "; ".join(failed), err=True)
        raise typer.Exit(1)

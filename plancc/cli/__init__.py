"""`plancc` commands: parse options, call one library function, print. No planning logic lives here.

`compile` and `scan` hand their options to `plancc.api` by name (the same keywords a Python caller uses); the
options they share are declared once (`plancc.cli.options`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from plancc.cli.common import (
    JsonOpt,
    QuietOpt,
    SourceCommand,
    app,
    fail_on_errors,
    print_json,
    reporter,
    warn,
)
from plancc.cli.options import (
    GROUP,
    PLAN_FLAGS,
    SCAN_FLAGS,
    CacheOpt,
    ConfigFormatOpt,
    ConfigOpt,
    Flags,
    Opt,
    OverwriteOpt,
    ProcOpt,
    SamplesPerEpochOpt,
    ScanOutputOpt,
    grouped,
)

_EXAMPLE = ("\n\nExample:\n\n    plancc compile examples/data/chat.jsonl -o plans/chat --tokenizer builtin "
            "--chat-template chatml --grad-accum 4")


_RECIPE_HELP = ("\n\nSeveral SOURCEs (or a --config listing `datasets`, then no SOURCE) make a recipe: each source is "
                "a dataset named by its file stem, mixed per epoch by --mix NAME=Nx (repeat: N times an epoch, 0.5x "
                "a seeded half) or NAME=W (weight: its share of the epoch's samples).")


def config_note(note: str | None) -> None:
    """Say, on stderr, how an Axolotl or TRL config was read and which of its keys only training reads: also under
    --quiet and --json (it is about the data, not progress)."""
    if note:
        typer.echo(note, err=True)


@app.command("compile", help="Tokenize + scan SOURCE (or reuse the cache), pack, balance and write a plan."
             + _RECIPE_HELP + _EXAMPLE + "\n\n    plancc compile chat.jsonl alpaca.json -o plans/mix --tokenizer "
             "tok/ --mix chat=2x,alpaca=0.5x")
@grouped(scan_flags=SCAN_FLAGS, plan_flags=PLAN_FLAGS)
def compile_cmd(
    output: Annotated[Path, Opt("--output", "-o", help="Plan directory to write: absent, empty, or a plan to "
                                                        "replace atomically with --overwrite.")],
    sources: Annotated[list[str] | None, typer.Argument(metavar="SOURCE",
                                                        help="File, glob, save_to_disk dir, Hub id, or a samples "
                                                              "table; several make a recipe.",
                                                         show_default="the config's datasets")] = None,
    overwrite: OverwriteOpt = False,
    config: ConfigOpt = None,
    config_format: ConfigFormatOpt = "auto",
    scan_flags: Flags = GROUP,
    plan_flags: Flags = GROUP,
    mix: Annotated[list[str] | None, Opt("--mix", help="A recipe's mixture (repeatable, comma-separated): NAME=Nx "
                                                       "repeats dataset NAME N times an epoch (2x twice, 0.5x a "
                                                       "seeded half), NAME=W gives it weight W (its share of the "
                                                       "weighted datasets' samples).",
                                         show_default="each dataset once (repeat 1x)")] = None,
    samples_per_epoch: SamplesPerEpochOpt = None,
    num_proc: ProcOpt = None,
    cache_dir: CacheOpt = None,
    quiet: QuietOpt = False,
    json: JsonOpt = False,
) -> None:
    """`plancc compile`: flags to settings by name, `plancc.api.compile`, the summary."""
    from plancc import api

    with fail_on_errors(output, "plan"):
        resolved = api.resolve(sources[0] if sources and len(sources) == 1 else sources or None, config=config,
                               config_format=config_format, num_proc=num_proc, mix=mix,
                               samples_per_epoch=samples_per_epoch, **scan_flags, **plan_flags)
        config_note(resolved.note)
        with reporter(quiet or json) as progress:
            plan = api.compile(None, output, resolved=resolved, overwrite=overwrite, cache_dir=cache_dir,
                               progress=progress)
        warn(plan.warnings)
        if json:
            print_json({"plan_dir": str(output), **plan.manifest.to_json(), "warnings": list(plan.warnings)})
        elif not quiet:
            from plancc.cli.summary import compile_summary

            typer.echo("\n".join(compile_summary(str(output), plan.manifest.to_json(), plan.metrics())))


@app.command("scan", cls=SourceCommand, help="Tokenize + scan SOURCE only: write the samples table and the tokenized dataset."
                          "\n\nExample:\n\n    plancc scan data/train.jsonl -o scans/train --tokenizer tok/")
@grouped(scan_flags=SCAN_FLAGS)
def scan_cmd(
    source: Annotated[str, typer.Argument(help="File, glob, save_to_disk dir or Hub id.")],
    output: ScanOutputOpt,
    overwrite: OverwriteOpt = False,
    config: ConfigOpt = None,
    config_format: ConfigFormatOpt = "auto",
    scan_flags: Flags = GROUP,
    num_proc: ProcOpt = None,
    engine: Annotated[str, Opt("--engine", help="local (this process and --num-proc tokenizer processes) or ray "
                                                "(Ray Data: a local Ray of --num-proc CPUs, or a cluster's); "
                                                "the result is the same.")] = "local",
    ray_address: Annotated[str | None, Opt("--ray-address", help="--engine ray: the Ray cluster to run on ('auto': "
                                                                 "the one this machine belongs to).",
                                           show_default="a local Ray started for the scan")] = None,
    cache_dir: CacheOpt = None,
    shard: Annotated[str | None, Opt("--shard", help="Scan only shard I of N of the rows (I from 0; e.g. a Slurm "
                                                     "array task) into a partial scan; `plancc merge` joins them.",
                                     show_default="none: the whole source")] = None,
    shard_rows: Annotated[int | None, Opt("--shard-rows", help="Rows per shard: memory and what a "
                                                               "resumed scan reuses (the result is the same for "
                                                               "any value; on Ray, the unit of work).",
                                          show_default="65536; 16384 with --engine ray")] = None,
    quiet: QuietOpt = False,
    json: JsonOpt = False,
) -> None:
    """`plancc scan`: flags to scan options by name, `plancc.api.scan`, the summary."""
    from plancc import api

    with fail_on_errors(output, "scan"), reporter(quiet or json) as progress:
        resolved = api.scan_settings(config=config, config_format=config_format, num_proc=num_proc, **scan_flags)
        config_note(resolved.note)
        report = api.scan(source, output, resolved=resolved, overwrite=overwrite, cache_dir=cache_dir,
                          progress=progress, shard=shard, shard_rows=shard_rows, engine=engine,
                          ray_address=ray_address)
    _print_scan(output, report, quiet, json)


def _print_scan(output: Path, report: dict, quiet: bool, json: bool) -> None:
    """What `scan` and `merge` print: warnings, then the report as JSON or the summary."""
    warn(report.get("warnings") or [])
    if json:
        print_json({"scan_dir": str(output), **report})
    elif not quiet:
        from plancc.cli.summary import scan_summary

        typer.echo("\n".join(scan_summary(str(output), report)))


@app.command("merge", help="Join the partial scans of `plancc scan --shard I/N` into one scan, after checking they "
                           "fit (same source, options, tokenizer and template; every row exactly once). Token data "
                           "is hard-linked, never copied.\n\nExample:\n\n    plancc merge scans/part-* -o "
                           "scans/train")
def merge_cmd(
    parts: Annotated[list[Path], typer.Argument(help="Partial scan directories (any order).")],
    output: ScanOutputOpt,
    overwrite: OverwriteOpt = False,
    quiet: QuietOpt = False,
    json: JsonOpt = False,
) -> None:
    """`plancc merge`: join partial scans (`plancc scan --shard I/N`) into one scan directory."""
    from plancc import api

    with fail_on_errors(output, "scan"):
        report = api.merge(parts, output, overwrite=overwrite)
    _print_scan(output, report, quiet, json)


@app.command("validate", help="Re-check every invariant and fingerprint of a plan on disk; exit 1 on any "
                              "violation.\n\nExample:\n\n    plancc validate plans/chat --dataset data/train.jsonl")
def validate_cmd(
    plan_dir: Annotated[Path, typer.Argument(help="Plan directory.")],
    dataset: Annotated[str | None, Opt("--dataset", help="The plan's data moved or was rebuilt: a plan, scan or "
                                                          "token store folder is checked chunk by chunk and sample "
                                                          "by sample against the plan; any other source is rescanned "
                                                          "with the plan's scan options and its content fingerprint "
                                                          "compared.", show_default="none")] = None,
    tokenizer: Annotated[str | None, Opt("--tokenizer", help="With --dataset: where the plan's tokenizer is now.",
                                         show_default="where it was at compile")] = None,
    fast: Annotated[bool, Opt("--fast", help="Check the token store's header, file sizes and fingerprints "
                                             "only, not its content (the full check hashes every chunk and every "
                                             "planned sample).")] = False,
    num_proc: ProcOpt = None,
    cache_dir: CacheOpt = None,
    quiet: QuietOpt = False,
    json: JsonOpt = False,
) -> None:
    """`plancc validate`: every violation `plancc.api.validate` finds, exit 1 when there is one."""
    from plancc import api

    with fail_on_errors():
        result = api.validate(plan_dir, dataset=dataset, tokenizer=tokenizer, fast=fast, num_proc=num_proc,
                              cache_dir=cache_dir)
    problems = list(result.problems)
    if json:
        print_json({"plan_dir": str(plan_dir), "ok": not problems, "violations": problems,
                    "skipped": list(result.skipped)})
    elif problems:
        for p in problems:
            typer.echo(f"violation: {p}", err=True)
    elif not quiet:
        checked = ("coverage, capacity, mapping, counts, fingerprints, metrics, manifest"
                   + ("" if result.skipped else ", token data " + ("metadata" if fast else "content"))
                   + (f", dataset content of {dataset}" if dataset else "")
                   + (_EVAL_CHECKED[bool(result.notes)] if result.has_eval else ""))
        warn(result.notes)
        typer.echo(f"{plan_dir}: ok ({checked})")
    if not json and not quiet:
        for s in result.skipped:
            typer.echo(f"skipped: {s}", err=True)
    raise typer.Exit(1 if problems else 0)


# what `validate` says of an eval plan: its tokens compared with training's too (True: some are a training sample's)
_EVAL_CHECKED = {False: ", eval plan (held-out set once each, none trained on, none a training sample's tokens)",
                 True: ", eval plan (held-out set once each, none trained on; some have a training sample's tokens, "
                       "as the warning says)"}


from plancc.cli import diff_cmd, inspect_cmd, show_cmd  # noqa: E402,F401  (registers commands)

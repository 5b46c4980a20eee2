"""`plancc` commands: parse options, call one library function, print. No planning logic lives here."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated, Any

import typer

from plancc.cli.common import app, fail_on_errors, print_json, reporter
from plancc.config import PlanSettings, ScanOptions, SettingsError, load_config_file

_EXAMPLE = ("\n\nExample:\n\n    plancc compile examples/data/chat.jsonl -o plans/chat --tokenizer builtin "
            "--chat-template chatml --grad-accum 4")

Opt = typer.Option


def _settings(config: Path | None, flags: dict[str, Any]) -> tuple[ScanOptions, PlanSettings, int, set[str]]:
    """Defaults < config file < explicit flags; returns (scan options, plan settings, num_proc, names set)."""
    merged: dict[str, Any] = load_config_file(config) if config else {}
    merged.update({k: v for k, v in flags.items() if v is not None})
    given = set(merged)
    num_proc = int(merged.pop("num_proc", 1))
    if num_proc <= 0:
        raise SettingsError(f"--num-proc must be a positive integer, got {num_proc}")
    scan_names = {f.name for f in dataclasses.fields(ScanOptions)}
    plan_names = {f.name for f in dataclasses.fields(PlanSettings)}
    try:
        scan = ScanOptions(**{k: v for k, v in merged.items() if k in scan_names})
        plan = PlanSettings(**{k: v for k, v in merged.items() if k in plan_names})
    except TypeError as exc:
        raise SettingsError(f"invalid setting: {exc}") from None
    return scan, plan, num_proc, given


def _warn(report: dict[str, Any]) -> None:
    """The scan's warnings (drops, template markers, the split used), one line each on stderr."""
    for line in report.get("warnings") or []:
        typer.echo(f"warning: {line}", err=True)


ConfigOpt = Annotated[Path | None, Opt("--config", help="TOML or YAML file of settings; flags override it.")]
FormatOpt = Annotated[str | None, Opt("--format", help="auto, tokenized, prompt_completion, alpaca, "
                                                       "messages or text (default auto).")]
TokenizerOpt = Annotated[str | None, Opt("--tokenizer", help="The model's tokenizer.json or HF tokenizer dir, or "
                                                             "'builtin' (byte level). Required unless the source is "
                                                             "already tokenized.")]
TemplateOpt = Annotated[str | None, Opt("--chat-template", help="Chat data: a .jinja file or a built-in name "
                                                                "(chatml, llama3). Default: the tokenizer dir's own; "
                                                                "none is an error.")]
ColumnsOpt = Annotated[str | None, Opt("--columns", help="Map source fields onto format roles, e.g. "
                                                         "prompt=question,completion=answer or messages=dialog.")]
SplitOpt = Annotated[str | None, Opt("--split", help="Split of a dataset dict directory or Hub id (default "
                                                     "train, said on stderr).")]
MaxDroppedOpt = Annotated[float | None, Opt("--max-dropped", help="Largest share of samples the scan may drop; "
                                                                  "more is an error (default 0.05).")]
SeqOpt = Annotated[int | None, Opt("--sequence-len", help="Max tokens per sample / per row (default 4096).")]
LongOpt = Annotated[str | None, Opt("--long", help="Over-long samples: truncate|drop|error (default drop).")]
ShiftOpt = Annotated[str | None, Opt("--shift", help="Label shift: sample|row|none (default sample).")]
ProcOpt = Annotated[int | None, Opt("--num-proc", help="Tokenizer processes (results identical for any count).")]
CacheOpt = Annotated[Path | None, Opt("--cache-dir", help="Scan cache (default $PLANCC_CACHE or ~/.cache/plancc).")]
QuietOpt = Annotated[bool, Opt("--quiet", "-q", help="No progress output.")]
JsonOpt = Annotated[bool, Opt("--json", help="Print a machine-readable result.")]


@app.command("compile", help="Tokenize + scan SOURCE (or reuse the cache), pack, balance and write a plan." + _EXAMPLE)
def compile_cmd(
    source: Annotated[str, typer.Argument(help="File, glob, save_to_disk dir, Hub id, or a samples table.")],
    output: Annotated[Path, Opt("--output", "-o", help="Plan directory to write (replaced atomically).")],
    config: ConfigOpt = None,
    format: FormatOpt = None,
    tokenizer: TokenizerOpt = None,
    chat_template: TemplateOpt = None,
    columns: ColumnsOpt = None,
    split: SplitOpt = None,
    sequence_len: SeqOpt = None,
    long: LongOpt = None,
    max_dropped: MaxDroppedOpt = None,
    shift: ShiftOpt = None,
    mode: Annotated[str | None, Opt("--mode", help="packed|padded|flattened (default packed).")] = None,
    micro_batch_size: Annotated[int | None, Opt("--micro-batch-size", help="Samples (or packed sequences) per "
                                                                          "microbatch.")] = None,
    real_batches: Annotated[bool | None, Opt("--real-batches/--one-row", help="Packed: micro_batch_size rows of "
                                                                             "sequence_len per microbatch.")] = None,
    pad_multiple: Annotated[int | None, Opt("--pad-multiple", help="Collator pads lengths to this multiple.")] = None,
    world_size: Annotated[int | None, Opt("--world-size", help="Data-parallel ranks.")] = None,
    grad_accum: Annotated[int | None, Opt("--grad-accum", help="Microbatches per rank per optimizer step.")] = None,
    drop_last: Annotated[bool | None, Opt("--drop-last/--keep-last", help="Drop the incomplete final "
                                                                         "update.")] = None,
    seed: Annotated[int | None, Opt("--seed")] = None,
    epochs: Annotated[int | None, Opt("--epochs")] = None,
    balance: Annotated[bool | None, Opt("--balance/--no-balance", help="Label balancing (default on).")] = None,
    balance_window: Annotated[int | None, Opt("--balance-window", help="Microbatches per window (<= 64).")] = None,
    balance_passes: Annotated[int | None, Opt("--balance-passes", help="Bounded passes per window.")] = None,
    cost: Annotated[str | None, Opt("--cost", help="What rank ordering evens out: tokens (padded slots; the "
                                                   "default) or attention (sum of squared sample lengths).")] = None,
    num_proc: ProcOpt = None,
    cache_dir: CacheOpt = None,
    quiet: QuietOpt = False,
    json: JsonOpt = False,
) -> None:
    from plancc.build import compile_to_dir

    with fail_on_errors():
        flags = {k: v for k, v in locals().items() if k not in ("source", "output", "config", "cache_dir", "quiet",
                                                                "json")}
        scan, plan, procs, given = _settings(config, flags)
        with reporter(quiet or json) as progress:
            manifest = compile_to_dir(source, scan, plan, output, num_proc=procs, cache_dir=cache_dir,
                                      progress=progress, given=given)
        _warn(manifest)
        if json:
            print_json({"plan_dir": str(output), **manifest})
        elif not quiet:
            _print_compile_summary(output, manifest)


def _print_compile_summary(output: Path, manifest: dict[str, Any]) -> None:
    from plancc import store

    metrics = store.read_table(output / store.METRICS_FILE, store.metrics_schema()).to_pylist()
    by = {(m["epoch"], m["stage"]): m for m in metrics}
    template = (manifest.get("chat_template") or {}).get("name")
    typer.echo(f"wrote {output}: {manifest['samples']} samples of {manifest['rows_read']} ("
               f"{manifest['dropped_samples']} dropped, {manifest['truncated_samples']} truncated), "
               f"{len(manifest['epochs'])} epoch(s)")
    if manifest.get("tokenizer"):
        typer.echo(f"  tokenizer {manifest['tokenizer']['name']}" + (f", chat template {template}" if template else ""))
    for e in manifest["epochs"]:
        before, after = by[(e["epoch"], "before")], by[(e["epoch"], "after")]
        typer.echo(
            f"  epoch {e['epoch']}: {after['batches']} microbatches, {after['updates']} updates, "
            f"label CV {before['label_cv']:.3f} -> {after['label_cv']:.3f}, update CV "
            f"{before['update_label_cv']:.3f} -> {after['update_label_cv']:.3f}, "
            f"packing efficiency {after['packing_efficiency']:.4f}"
        )
    typer.echo(f"  plan fingerprints: {', '.join(f'{k}={v}' for k, v in manifest['fingerprints']['plan'].items())}")


@app.command("scan", help="Tokenize + scan SOURCE only: write the samples table and the tokenized dataset."
                          "\n\nExample:\n\n    plancc scan data/train.jsonl -o scans/train --tokenizer tok/")
def scan_cmd(
    source: Annotated[str, typer.Argument(help="File, glob, save_to_disk dir or Hub id.")],
    output: Annotated[Path, Opt("--output", "-o", help="Scan directory to write.")],
    config: ConfigOpt = None,
    format: FormatOpt = None,
    tokenizer: TokenizerOpt = None,
    chat_template: TemplateOpt = None,
    columns: ColumnsOpt = None,
    split: SplitOpt = None,
    sequence_len: SeqOpt = None,
    long: LongOpt = None,
    max_dropped: MaxDroppedOpt = None,
    shift: ShiftOpt = None,
    num_proc: ProcOpt = None,
    cache_dir: CacheOpt = None,
    quiet: QuietOpt = False,
    json: JsonOpt = False,
) -> None:
    from plancc import scan as scan_mod

    with fail_on_errors():
        flags = {"format": format, "tokenizer": tokenizer, "chat_template": chat_template, "columns": columns,
                 "split": split, "sequence_len": sequence_len, "long": long, "max_dropped": max_dropped,
                 "shift": shift, "num_proc": num_proc}
        options, _, procs, _ = _settings(config, flags)
        with reporter(quiet or json) as progress:
            result = scan_mod.scan(source, options, num_proc=procs, cache_dir=cache_dir, progress=progress)
            scan_mod.write_scan(result, output)
        _warn(result.report)
        if json:
            print_json({"scan_dir": str(output), **result.report})
        elif not quiet:
            r = result.report
            template = (r.get("chat_template") or {}).get("name")
            typer.echo(f"wrote {output}: {r['retained']} samples retained of {r['rows_read']} rows, "
                       f"{r['dropped_samples']} dropped, {r['truncated_samples']} truncated ({r['format']}, "
                       f"tokenizer {r['tokenizer']}{f', chat template {template}' if template else ''})")
            for what in ("dropped_long", "truncated", "dropped_all_masked"):
                if r[what]["count"]:
                    rows = ", ".join(map(str, r[what]["first_rows"]))
                    typer.echo(f"  {what.replace('_', ' ')}: {r[what]['count']} (first rows: {rows})")


@app.command("validate", help="Re-check every invariant and fingerprint of a plan on disk; exit 1 on any "
                              "violation.\n\nExample:\n\n    plancc validate plans/chat --dataset data/train.jsonl")
def validate_cmd(
    plan_dir: Annotated[Path, typer.Argument(help="Plan directory.")],
    dataset: Annotated[str | None, Opt("--dataset", help="Rescan this source with the plan's scan options and "
                                                          "compare its content fingerprint.")] = None,
    tokenizer: Annotated[str | None, Opt("--tokenizer", help="With --dataset: where the plan's tokenizer is now "
                                                              "(default: where it was at compile).")] = None,
    fast: Annotated[bool, Opt("--fast", help="Check the tokenized data's metadata and size only, not its "
                                             "content (the full check hashes every planned sample).")] = False,
    num_proc: ProcOpt = None,
    cache_dir: CacheOpt = None,
    json: JsonOpt = False,
) -> None:
    from plancc import store
    from plancc.validate import validate_plan

    with fail_on_errors():
        dataset_fp = None
        if dataset is not None:
            from plancc import scan as scan_mod
            options = scan_mod.options_from_report(store.PlanDir(plan_dir).meta["scan"], tokenizer)
            result = scan_mod.scan(dataset, options, num_proc=num_proc or 1, cache_dir=cache_dir)
            dataset_fp = store.samples_fingerprints(result.samples)["dataset"]
        problems, _ = validate_plan(str(plan_dir), dataset_fp, fast=fast)
    if json:
        print_json({"plan_dir": str(plan_dir), "ok": not problems, "violations": problems})
    elif problems:
        for p in problems:
            typer.echo(f"violation: {p}", err=True)
    else:
        checked = ("coverage, capacity, mapping, counts, fingerprints, metrics, manifest, tokenized data "
                   + ("metadata" if fast else "content") + (", dataset content" if dataset else ""))
        typer.echo(f"{plan_dir}: ok ({checked})")
    raise typer.Exit(1 if problems else 0)
from plancc.cli import diff_cmd, inspect_cmd  # noqa: E402,F401  (registers commands)

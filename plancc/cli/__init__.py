"""`plancc` commands: parse options, call one library function, print. No planning logic lives here.

`compile` and `scan` hand their options to `plancc.api` by name (the same keywords a Python caller uses).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated, Any

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
from plancc.config import PlanSettings, ScanOptions

_EXAMPLE = ("\n\nExample:\n\n    plancc compile examples/data/chat.jsonl -o plans/chat --tokenizer builtin "
            "--chat-template chatml --grad-accum 4")

Opt = typer.Option


def _default(name: str) -> str:
    """The dataclass default of a setting, for --help: the flags default to None so that a config file can set
    them, and the real default lives in one place, `plancc.config`."""
    for cls in (PlanSettings, ScanOptions):
        for f in dataclasses.fields(cls):
            if f.name == name:
                return str(f.default)
    raise KeyError(name)


def _setting(flag: str, help: str, shown: str | None = None) -> Any:
    """An option for the setting named like `flag` whose help shows the setting's default."""
    return Opt(flag, help=help, show_default=shown or _default(flag.split("/")[0].lstrip("-").replace("-", "_")))


ConfigOpt = Annotated[Path | None, Opt("--config", help="TOML or YAML file of settings; flags override it.",
                                       show_default="none")]
ConfigFormatOpt = Annotated[str, Opt("--config-format", help="auto|plancc|axolotl|trl: an Axolotl or TRL YAML is read "
                                                             "as it is (its data settings; the rest listed in a "
                                                             "note).", show_default="auto: by the file's keys")]
FormatOpt = Annotated[str | None, _setting("--format", "auto|tokenized|prompt_completion|alpaca|messages|text")]
TokenizerOpt = Annotated[str | None, Opt("--tokenizer", help="The model's tokenizer.json or HF tokenizer dir, a Hub "
                                                             "id in the local HF cache, or 'builtin' (byte level).",
                                         show_default="none: required unless the source is already tokenized")]
TemplateOpt = Annotated[str | None, Opt("--chat-template", help="Chat data: a .jinja file or a built-in name "
                                                                "(chatml, llama3).",
                                        show_default="the tokenizer dir's own; none is an error")]
ColumnsOpt = Annotated[str | None, Opt("--columns", help="Map source fields onto format roles, e.g. "
                                                         "prompt=question,completion=answer or messages=dialog.",
                                       show_default="none")]
SplitOpt = Annotated[str | None, Opt("--split", help="Split of a dataset dict directory or Hub id.",
                                     show_default="train, said on stderr")]
PromptFormatOpt = Annotated[str | None, Opt("--prompt-format", help="Alpaca: the prompt, with {instruction} and "
                                                                    "{input}.", show_default="the Alpaca one")]
NoInputFormatOpt = Annotated[str | None, Opt("--no-input-format", help="Alpaca rows with an empty input: the prompt, "
                                                                       "with {instruction}.",
                                             show_default="--prompt-format, else the Alpaca one")]
SeparatorOpt = Annotated[str | None, Opt("--separator", help="prompt_completion: text between prompt and completion "
                                                             "(not supervised).", show_default="none")]
MessageFieldsOpt = Annotated[str | None, Opt("--message-fields", help="Messages whose keys differ, e.g. "
                                                                      "role=speaker,content=text.",
                                             show_default="role/content or from/value")]
MaxDroppedOpt = Annotated[float | None, _setting("--max-dropped", "Largest share of samples the scan may drop; "
                                                                  "more is an error.")]
SeqOpt = Annotated[int | None, _setting("--sequence-len", "Max tokens per sample / per row.")]
LongOpt = Annotated[str | None, _setting("--long", "Over-long samples: truncate|drop|error.")]
ShiftOpt = Annotated[str | None, _setting("--shift", "Label shift: sample|row|none.")]
ProcOpt = Annotated[int | None, Opt("--num-proc", help="Tokenizer processes (results identical for any count).",
                                    show_default="1")]
RolesOpt = Annotated[str | None, _setting("--roles-to-train", "Chat: roles whose turns are trained, comma-separated "
                                                               "(system, user, assistant, tool).", "assistant")]
EosOpt = Annotated[str | None, _setting("--train-on-eos", "End of turn / EOS trained: turn (each trained turn's), "
                                                          "last (the last trained turn's), all (every turn's), none.")]
InputsOpt = Annotated[bool | None, _setting("--train-on-inputs/--no-train-on-inputs", "Alpaca, prompt_completion: "
                                            "train on the prompt too.", "no-train-on-inputs")]
TrainOnOpt = Annotated[str | None, _setting("--train-on", "Chat: all_turns, or last_turn (only the last trained "
                                                          "turn).")]
EosOnlyOpt = Annotated[bool | None, _setting("--drop-eos-only/--keep-eos-only", "Drop samples whose supervised part "
                                             "is only the end of turn (an empty completion or reply).",
                                             "keep-eos-only")]
DateOpt = Annotated[str | None, _setting("--template-date", "YYYY-MM-DD the chat template's strftime_now reads "
                                                            "(never the clock: same inputs, same plan any day).")]
CacheOpt = Annotated[Path | None, Opt("--cache-dir", help="Scan cache.",
                                      show_default="$PLANCC_CACHE or ~/.cache/plancc")]


OverwriteOpt = Annotated[bool, Opt("--overwrite", help="Replace an existing plancc plan/scan at -o whole (one holding "
                                                       "anything plancc did not write, and any other folder, is "
                                                       "never touched).")]


_RECIPE_HELP = ("\n\nSeveral SOURCEs (or a --config listing `datasets`, then no SOURCE) make a recipe: each source is "
                "a dataset named by its file stem, mixed per epoch by --mix NAME=Nx (repeat: N times an epoch, 0.5x "
                "a seeded half) or NAME=W (weight: its share of the epoch's samples).")


def config_note(config: Path | None, config_format: str, quiet: bool) -> None:
    """Say, on stderr, which keys of an Axolotl or TRL config plancc does not use."""
    if config is None or quiet:
        return
    from plancc import config_import
    from plancc.config import read_config_file

    note = config_import.translate(read_config_file(config), config, config_format).note(config)
    if note:
        typer.echo(note, err=True)


@app.command("compile", help="Tokenize + scan SOURCE (or reuse the cache), pack, balance and write a plan."
             + _RECIPE_HELP + _EXAMPLE + "\n\n    plancc compile chat.jsonl alpaca.json -o plans/mix --tokenizer "
             "tok/ --mix chat=2x,alpaca=0.5x")
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
    format: FormatOpt = None,
    tokenizer: TokenizerOpt = None,
    chat_template: TemplateOpt = None,
    columns: ColumnsOpt = None,
    split: SplitOpt = None,
    prompt_format: PromptFormatOpt = None,
    no_input_format: NoInputFormatOpt = None,
    separator: SeparatorOpt = None,
    message_fields: MessageFieldsOpt = None,
    sequence_len: SeqOpt = None,
    long: LongOpt = None,
    max_dropped: MaxDroppedOpt = None,
    shift: ShiftOpt = None,
    roles_to_train: RolesOpt = None,
    train_on_eos: EosOpt = None,
    train_on_inputs: InputsOpt = None,
    train_on: TrainOnOpt = None,
    drop_eos_only: EosOnlyOpt = None,
    template_date: DateOpt = None,
    mode: Annotated[str | None, _setting("--mode", "packed|padded|flattened.")] = None,
    micro_batch_size: Annotated[int | None, _setting("--micro-batch-size", "Samples (or packed sequences) per "
                                                                          "microbatch.")] = None,
    real_batches: Annotated[bool | None, _setting("--real-batches/--one-row", "Packed: micro_batch_size rows of "
                                                  "sequence_len per microbatch.", shown="one-row")] = None,
    pad_multiple: Annotated[int | None, _setting("--pad-multiple", "Collator pads lengths to this multiple.")] = None,
    world_size: Annotated[int | None, _setting("--world-size", "Data-parallel ranks.")] = None,
    grad_accum: Annotated[int | None, _setting("--grad-accum", "Microbatches per rank per optimizer step.")] = None,
    drop_last: Annotated[bool | None, _setting("--drop-last/--keep-last", "Drop the incomplete final update.",
                                               shown="keep-last")] = None,
    seed: Annotated[int | None, _setting("--seed", "Seed of every random choice (same seed, same plan).")] = None,
    epochs: Annotated[int | None, _setting("--epochs", "Epochs to plan (each reshuffled from seed and epoch).")
                      ] = None,
    balance: Annotated[bool | None, _setting("--balance/--no-balance", "Label balancing.", shown="balance")] = None,
    balance_window: Annotated[int | None, _setting("--balance-window", "Microbatches per window (<= 64).")] = None,
    balance_passes: Annotated[int | None, _setting("--balance-passes", "Bounded passes per window.")] = None,
    cost: Annotated[str | None, _setting("--cost", "What rank ordering and within-update trades even out: tokens "
                                                   "(padded slots) or attention (sum of squared sample lengths).")
                    ] = None,
    val_set_size: Annotated[float | None, _setting("--val-set-size", "Hold out samples for evaluation: a fraction "
                                                   "in (0, 1) or a count; a seeded draw, never trained on, "
                                                   "planned once as the eval plan.", shown="0: none")] = None,
    mix: Annotated[list[str] | None, Opt("--mix", help="A recipe's mixture (repeatable, comma-separated): NAME=Nx "
                                                       "repeats dataset NAME N times an epoch (2x twice, 0.5x a "
                                                       "seeded half), NAME=W gives it weight W (its share of the "
                                                       "weighted datasets' samples).",
                                         show_default="each dataset once (repeat 1x)")] = None,
    samples_per_epoch: Annotated[int | None, Opt("--samples-per-epoch", help="Samples an epoch draws from the "
                                                                             "weighted datasets.",
                                                 show_default="the largest weighted dataset's size")] = None,
    num_proc: ProcOpt = None,
    cache_dir: CacheOpt = None,
    quiet: QuietOpt = False,
    json: JsonOpt = False,
) -> None:
    """`plancc compile`: flags to settings by name, `plancc.api.compile`, the summary."""
    from plancc import api

    with fail_on_errors(output, "plan"):
        config_note(config, config_format, quiet or json)
        with reporter(quiet or json) as progress:
            plan = api.compile(
                sources[0] if sources and len(sources) == 1 else sources or None, output, overwrite=overwrite,
                config=config, config_format=config_format, num_proc=num_proc, cache_dir=cache_dir, progress=progress,
                mix=mix,
                samples_per_epoch=samples_per_epoch,
                format=format, tokenizer=tokenizer, chat_template=chat_template, columns=columns, split=split,
                prompt_format=prompt_format, no_input_format=no_input_format, separator=separator,
                message_fields=message_fields, sequence_len=sequence_len, long=long, max_dropped=max_dropped, shift=shift, mode=mode,
                micro_batch_size=micro_batch_size, real_batches=real_batches, pad_multiple=pad_multiple,
                world_size=world_size, grad_accum=grad_accum, drop_last=drop_last, seed=seed, epochs=epochs,
                balance=balance, balance_window=balance_window, balance_passes=balance_passes, cost=cost,
                val_set_size=val_set_size,
                roles_to_train=roles_to_train, train_on_eos=train_on_eos,
                train_on_inputs=train_on_inputs, train_on=train_on, drop_eos_only=drop_eos_only,
                template_date=template_date,
            )
        warn(plan.warnings)
        if json:
            print_json({"plan_dir": str(output), **plan.manifest, "warnings": list(plan.warnings)})
        elif not quiet:
            from plancc.cli.summary import compile_summary

            typer.echo("\n".join(compile_summary(str(output), plan.manifest, plan.metrics())))


@app.command("scan", cls=SourceCommand, help="Tokenize + scan SOURCE only: write the samples table and the tokenized dataset."
                          "\n\nExample:\n\n    plancc scan data/train.jsonl -o scans/train --tokenizer tok/")
def scan_cmd(
    source: Annotated[str, typer.Argument(help="File, glob, save_to_disk dir or Hub id.")],
    output: Annotated[Path, Opt("--output", "-o", help="Scan directory to write: absent, empty, or a scan to "
                                                        "replace atomically with --overwrite.")],
    overwrite: OverwriteOpt = False,
    config: ConfigOpt = None,
    config_format: ConfigFormatOpt = "auto",
    format: FormatOpt = None,
    tokenizer: TokenizerOpt = None,
    chat_template: TemplateOpt = None,
    columns: ColumnsOpt = None,
    split: SplitOpt = None,
    prompt_format: PromptFormatOpt = None,
    no_input_format: NoInputFormatOpt = None,
    separator: SeparatorOpt = None,
    message_fields: MessageFieldsOpt = None,
    sequence_len: SeqOpt = None,
    long: LongOpt = None,
    max_dropped: MaxDroppedOpt = None,
    shift: ShiftOpt = None,
    roles_to_train: RolesOpt = None,
    train_on_eos: EosOpt = None,
    train_on_inputs: InputsOpt = None,
    train_on: TrainOnOpt = None,
    drop_eos_only: EosOnlyOpt = None,
    template_date: DateOpt = None,
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
        config_note(config, config_format, quiet or json)
        report = api.scan(source, output, overwrite=overwrite, config=config, config_format=config_format,
                          num_proc=num_proc,
                          cache_dir=cache_dir, progress=progress, shard=shard, shard_rows=shard_rows,
                          engine=engine, ray_address=ray_address,
                          format=format, tokenizer=tokenizer, chat_template=chat_template, columns=columns,
                          split=split, sequence_len=sequence_len, long=long, max_dropped=max_dropped, shift=shift,
                          prompt_format=prompt_format, no_input_format=no_input_format, separator=separator,
                          message_fields=message_fields,
                          roles_to_train=roles_to_train, train_on_eos=train_on_eos,
                          train_on_inputs=train_on_inputs, train_on=train_on, drop_eos_only=drop_eos_only,
                          template_date=template_date)
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
    output: Annotated[Path, Opt("--output", "-o", help="Scan directory to write: absent, empty, or a scan to "
                                                        "replace atomically with --overwrite.")],
    overwrite: OverwriteOpt = False,
    quiet: QuietOpt = False,
    json: JsonOpt = False,
) -> None:
    """`plancc merge`: join partial scans (`plancc scan --shard I/N`) into one scan directory."""
    from plancc import api

    with fail_on_errors(output, "scan"):
        report = api.merge(parts, output, overwrite=overwrite)
    warn(report.get("warnings") or [])
    if json:
        print_json({"scan_dir": str(output), **report})
    elif not quiet:
        from plancc.cli.summary import scan_summary

        typer.echo("\n".join(scan_summary(str(output), report)))


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
    """`plancc validate`: every violation `plancc.review.validate.validate_plan` finds, exit 1 when there is one."""
    from plancc.review.validate import validate_plan
    from plancc.store import plan_files, schemas, token_store
    from plancc.store.plan import Plan

    with fail_on_errors():
        dataset_fp, tokens_dir = None, None
        for candidate in ([Path(dataset) / schemas.TOKENS_DIR, Path(dataset)] if dataset is not None else []):
            if tokens_dir is None and token_store.is_store(candidate):
                tokens_dir = candidate  # a plan, scan or token store folder: check its store, no rescan
        if dataset is not None and tokens_dir is None:
            from plancc.errors import InputError
            from plancc.scan import scanner as scan_mod
            if Plan(plan_dir).settings.mixture:
                raise InputError(f"--dataset {dataset}: {plan_dir} is a recipe of several datasets, one source "
                                 "cannot be rescanned for it; give a plan, scan or token store folder")
            options = scan_mod.options_from_report(Plan(plan_dir).scan, tokenizer)
            result = scan_mod.scan(dataset, options, num_proc=num_proc or 1, cache_dir=cache_dir)
            dataset_fp = plan_files.samples_fingerprints(result.samples)["dataset"]
        problems, meta = validate_plan(str(plan_dir), dataset_fp, fast=fast, tokens_dir=tokens_dir)
    if json:
        print_json({"plan_dir": str(plan_dir), "ok": not problems, "violations": problems})
    elif problems:
        for p in problems:
            typer.echo(f"violation: {p}", err=True)
    elif not quiet:
        checked = ("coverage, capacity, mapping, counts, fingerprints, metrics, manifest, token data "
                   + ("metadata" if fast else "content")
                   + (f", dataset content of {dataset}" if dataset else "")
                   + (", eval plan (held-out set once each, none trained on)" if "eval" in meta else ""))
        typer.echo(f"{plan_dir}: ok ({checked})")
    raise typer.Exit(1 if problems else 0)


from plancc.cli import diff_cmd, inspect_cmd, show_cmd  # noqa: E402,F401  (registers commands)

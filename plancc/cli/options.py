"""The options `compile` and `scan` share, declared once: each is an `Annotated` type (flag, help, shown default),
`flags` makes a group of them (`SCAN_FLAGS`, `PLAN_FLAGS`) and `grouped` makes a group one parameter of a command
(a dict of the values), so both commands list them in the same order with the same help.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import types
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Any

import typer

from plancc.config.settings import FORMATS, PlanSettings, ScanOptions

Opt = typer.Option


def _default(name: str) -> str:
    """The dataclass default of a setting, for --help: the flags default to None so that a config file can set
    them, and the real default lives in one place, `plancc.config.settings`."""
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
FormatOpt = Annotated[str | None, _setting("--format", "|".join(FORMATS))]
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

ScanOutputOpt = Annotated[Path, Opt("--output", "-o", help="Scan directory to write: absent, empty, or a scan to "
                                                           "replace atomically with --overwrite.")]


def flags(**annotations: Any) -> tuple[inspect.Parameter, ...]:
    """Options as command parameters (`name=Annotated type`), each defaulting to None ("not given", so that a
    config file can set it)."""
    return tuple(inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None, annotation=a)
                 for name, a in annotations.items())


SCAN_FLAGS = flags(format=FormatOpt, tokenizer=TokenizerOpt, chat_template=TemplateOpt, columns=ColumnsOpt,
                   split=SplitOpt, prompt_format=PromptFormatOpt, no_input_format=NoInputFormatOpt,
                   separator=SeparatorOpt, message_fields=MessageFieldsOpt, sequence_len=SeqOpt, long=LongOpt,
                   max_dropped=MaxDroppedOpt, shift=ShiftOpt, roles_to_train=RolesOpt, train_on_eos=EosOpt,
                   train_on_inputs=InputsOpt, train_on=TrainOnOpt, drop_eos_only=EosOnlyOpt,
                   template_date=DateOpt)
"""How a source is read and tokenized: `compile` and `scan` both take these."""

PLAN_FLAGS = flags(
    mode=Annotated[str | None, _setting("--mode", "packed|padded|flattened.")],
    micro_batch_size=Annotated[int | None, _setting("--micro-batch-size", "Samples (or packed sequences) per "
                                                                         "microbatch.")],
    real_batches=Annotated[bool | None, _setting("--real-batches/--one-row", "Packed: micro_batch_size rows of "
                                                 "sequence_len per microbatch.", shown="one-row")],
    pad_multiple=Annotated[int | None, _setting("--pad-multiple", "Collator pads lengths to this multiple.")],
    world_size=Annotated[int | None, _setting("--world-size", "Data-parallel ranks.")],
    grad_accum=Annotated[int | None, _setting("--grad-accum", "Microbatches per rank per optimizer step.")],
    drop_last=Annotated[bool | None, _setting("--drop-last/--keep-last", "Drop the incomplete final update.",
                                              shown="keep-last")],
    seed=Annotated[int | None, _setting("--seed", "Seed of every random choice (same seed, same plan).")],
    epochs=Annotated[int | None, _setting("--epochs", "Epochs to plan (each reshuffled from seed and epoch).")],
    balance=Annotated[bool | None, _setting("--balance/--no-balance", "Label balancing.", shown="balance")],
    balance_window=Annotated[int | None, _setting("--balance-window", "Microbatches per window (<= 64).")],
    balance_passes=Annotated[int | None, _setting("--balance-passes", "Bounded passes per window.")],
    cost=Annotated[str | None, _setting("--cost", "What rank ordering and within-update trades even out: tokens "
                                                  "(padded slots) or attention (sum of squared sample lengths).")],
    val_set_size=Annotated[float | None, _setting("--val-set-size", "Hold out samples for evaluation: a fraction "
                                                  "in (0, 1) or a count; a seeded draw, never trained on, planned "
                                                  "once as the eval plan.", shown="0: none")],
)
"""How the samples are planned: `compile` only."""


Flags = Mapping[str, Any]
GROUP: Flags = types.MappingProxyType({})  # a group parameter's placeholder default: `grouped` always fills it


def grouped(**groups: tuple[inspect.Parameter, ...]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A command whose parameter `name` (for each `name=group`) stands for the group's options: typer sees and
    lists them in its place, and the command receives them as one dict `{setting: value}` under `name`."""

    def wrap(func: Callable[..., Any]) -> Callable[..., Any]:
        signature = inspect.signature(func, eval_str=True)
        params = [q for p in signature.parameters.values() for q in groups.get(p.name, (p,))]

        @functools.wraps(func)
        def command(**kwargs: Any) -> Any:
            for name, group in groups.items():
                kwargs[name] = {p.name: kwargs.pop(p.name) for p in group}
            return func(**kwargs)

        command.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
        command.__annotations__ = {p.name: p.annotation for p in params}
        return command

    return wrap

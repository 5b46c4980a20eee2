"""The options `compile` and `scan` share, made from the settings' declarations (`plancc.config.registry`): each
setting's flag, help and shown default come from its `Setting`; `SCAN_FLAGS` and `PLAN_FLAGS` list a stage's flags
in declaration order, and `grouped` makes a group one parameter of a command (a dict of the values), so both
commands list them in the same order with the same help.
"""

from __future__ import annotations

import functools
import inspect
import types
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Any

import typer

from plancc.config.registry import SETTINGS, flagged

Opt = typer.Option


def option(name: str) -> Any:
    """Setting `name`'s flag as an `Annotated` type: its flag(s), help and shown default (the flag itself defaults
    to None, "not given", so that a config file can set it; the real default lives in the declaration)."""
    setting = SETTINGS[name].setting
    return Annotated[setting.check.cli | None, Opt(setting.flags(name), help=setting.help,
                                                   show_default=setting.shown_default(name))]


ConfigOpt = Annotated[Path | None, Opt("--config", help="TOML or YAML file of settings; flags override it.",
                                       show_default="none")]
ConfigFormatOpt = Annotated[str, Opt("--config-format", help="auto|plancc|axolotl|trl: an Axolotl or TRL YAML is read "
                                                             "as it is (its data settings; the rest listed in a "
                                                             "note).", show_default="auto: by the file's keys")]
ProcOpt = option("num_proc")
SamplesPerEpochOpt = option("samples_per_epoch")
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


SCAN_FLAGS = flags(**{d.name: option(d.name) for d in flagged("scan")})
"""How a source is read and tokenized: `compile` and `scan` both take these."""

PLAN_FLAGS = flags(**{d.name: option(d.name) for d in flagged("plan")})
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

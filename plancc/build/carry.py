"""The one step between resolving a compile's settings and using them: a stored scan's values win.

A scan (or plan) directory compiled again, or a scan's samples.parquet compiled on its own (its metadata records
its options), only means what it means under the scan's `sequence_len` (samples were dropped or cut to it),
`shift` (label counts depend on it), tokenizer, chat template and long policy. So `settle` takes the scan's values
of the settings of both stages (`plancc.config.registry.BOTH`) into the resolved settings, before anything is
scanned or planned: a recipe's raw datasets are then scanned with them, and the plan made with them. A flag or
config key that says otherwise is refused with both values named, and so are two stored datasets of a recipe that
disagree, instead of silently producing a plan that does not match its tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from plancc.build.samples import Samples
from plancc.config import registry
from plancc.config.fields import flag
from plancc.config.resolve import Resolved
from plancc.config.settings import ScanOptions
from plancc.errors import SettingsError
from plancc.store.scan_record import ScanRecord


@dataclass(frozen=True)
class Stored:
    """A dataset read from disk: its name in the recipe (None: the one source), how messages name it, its samples
    and the scan options it would be scanned with (what the given tokenizer and template are checked against)."""

    name: str | None
    where: str
    samples: Samples
    options: ScanOptions


def _contradiction(name: str, given: Any, recorded: Any, where: str) -> SettingsError:
    return SettingsError(f"{flag(name)} {given} contradicts {where}, which was scanned with {name} {recorded}: "
                         f"leave {flag(name)} out to use the scan's, or rescan the source with it")


def _made_with(name: str, options: ScanOptions, recorded: str | None) -> bool:
    """Whether `options`' tokenizer (or chat template) is the one a scan recorded as `recorded`."""
    from plancc.scan.sources import templates
    from plancc.scan.sources.tokenizer import scan_tokenizer

    tok = scan_tokenizer(options)
    if name == "tokenizer":
        return tok.made(recorded) if tok else recorded is None
    template = templates.resolve(options.chat_template, tok)
    return (template.fingerprint if template else None) == recorded


def _check_made_by(record: ScanRecord, options: ScanOptions, given: frozenset[str], where: str) -> None:
    """A given long policy, tokenizer or chat template must be the one the scan was made with."""
    recorded = record.options
    if "long" in given and options.long != recorded.long:
        raise _contradiction("long", options.long, recorded.long, where)
    for name in ("tokenizer", "chat_template"):
        if name in given and not _made_with(name, options, getattr(recorded, name)):
            was = record.tokenizer if name == "tokenizer" else (record.chat_template.name if record.chat_template
                                                                 else None)
            raise _contradiction(name, getattr(options, name), was, where)


def settle(resolved: Resolved, stored: list[Stored]) -> Resolved:
    """`resolved` with the stored scans' values of the both-stage settings (in recipe order: the first stored scan
    that records one gives it); raises when a given setting, or two stored datasets, say otherwise."""
    values: dict[str, tuple[Any, str | None]] = {}
    for d in stored:
        recorded = d.samples.record.options
        if recorded is None:  # a bare samples table: nothing is known about how it was made
            continue
        for name in registry.BOTH:
            value = getattr(recorded, name)
            if name in resolved.given:
                if getattr(resolved.plan, name) != value:
                    raise _contradiction(name, getattr(resolved.plan, name), value, d.where)
            elif name in values and values[name][0] != value:
                raise SettingsError(f"datasets {values[name][1]!r} and {d.name!r} have {name} {values[name][0]} and "
                                    f"{value}: a recipe has one {name}; rescan one of them with the other's")
            values.setdefault(name, (value, d.name))
        _check_made_by(d.samples.record, d.options, resolved.given, d.where)
    carried = {name: value for name, (value, _) in values.items() if name not in resolved.given}
    return resolved.carried(carried) if carried else resolved

"""A scan (or plan) directory compiled again carries the options it was made with (so does a scan's samples.parquet
compiled on its own: its metadata records them).

Its samples table only means what it means under the scan's `sequence_len` (samples were dropped or cut to it),
`shift` (label counts depend on it), tokenizer, chat template and long policy. So compiling it takes those values,
and a flag or config key that says otherwise is refused with both values named instead of silently producing a
plan that does not match its tokens.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection
from typing import Any

from plancc.config.settings import SHARED_SETTINGS, PlanSettings, ScanOptions, flag
from plancc.errors import SettingsError
from plancc.store.scan_record import ScanRecord


def _contradiction(name: str, given: Any, recorded: Any, where: str) -> SettingsError:
    return SettingsError(f"{flag(name)} {given} contradicts {where}, which was scanned with {name} {recorded}: "
                         f"leave {flag(name)} out to use the scan's, or rescan the source with it")


def _made_with(name: str, options: ScanOptions, recorded: str | None) -> bool:
    """Whether `options`' tokenizer (or chat template) is the one a scan recorded as `recorded`."""
    from plancc.scan.sources import templates
    from plancc.scan.sources.tokenizer import load_tokenizer

    tok = load_tokenizer(options.tokenizer) if options.tokenizer is not None else None
    if name == "tokenizer":
        return tok.made(recorded) if tok else recorded is None
    template = templates.resolve(options.chat_template, tok)
    return (template.fingerprint if template else None) == recorded


def carry(record: ScanRecord, options: ScanOptions, settings: PlanSettings, given: Collection[str],
          where: str) -> PlanSettings:
    """`settings` with the scan's sequence_len and shift; raises if `given` (the names the user set) contradict it."""
    recorded = record.options
    if recorded is None:  # a bare samples table: nothing is known about how it was made
        return settings
    for name in SHARED_SETTINGS:  # held by both the scan and the plan: the scan's value is taken
        value = getattr(recorded, name)
        if name in given and getattr(settings, name) != value:
            raise _contradiction(name, getattr(settings, name), value, where)
        settings = dataclasses.replace(settings, **{name: value})
    if "long" in given and options.long != recorded.long:
        raise _contradiction("long", options.long, recorded.long, where)
    for name in ("tokenizer", "chat_template"):
        if name in given and not _made_with(name, options, getattr(recorded, name)):
            was = record.tokenizer if name == "tokenizer" else (record.chat_template.name if record.chat_template
                                                                 else None)
            raise _contradiction(name, getattr(options, name), was, where)
    return settings

"""The row formats as the settings name them: each format's name, the source columns it reads and the names other
tools give it. Plain data, below the scan.

The settings check `format` and `--columns` against it when they are resolved, the store tells a samples table
from a source by the columns no format reads, the CLI lists the names and foreign configs map Axolotl's dataset
`type:` onto them: all of them sit below `plancc.scan`, which may not be imported from there. What a format does
(detect, map, encode, describe) is its module in `plancc.scan.formats`, which takes its name and roles from
`NAMED` here; `tests/unit/scan/formats/test_registry.py` holds the two to the same formats.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FormatName:
    """A row format as settings and configs spell it."""

    name: str  # `--format NAME`, the scan record's `format`
    roles: tuple[str, ...]  # the columns it reads: what `--columns role=FIELD` may map a source field onto
    axolotl: tuple[str, ...] = ()  # Axolotl dataset `type:` values read as this format


# in the order `--help` lists them (the scan detects in its own order: `plancc.scan.formats.FORMATS`)
NAMED = (
    FormatName("tokenized", ("input_ids", "labels", "shift_labels")),
    FormatName("prompt_completion", ("prompt", "completion")),
    FormatName("alpaca", ("instruction", "input", "output"), axolotl=("alpaca",)),
    FormatName("messages", ("messages", "conversations"), axolotl=("chat_template",)),
    FormatName("text", ("text",), axolotl=("completion",)),
    FormatName("input_output", ("segments",), axolotl=("input_output",)),
    # preference data (docs/preference.md): each completion its own sample, a pair's kept or dropped together
    FormatName("preference", ("prompt", "chosen", "rejected")),
    FormatName("unpaired_preference", ("prompt", "completion", "label")),
    # Axolotl's `rl: dpo|ipo` pairs of `type: chat_template.default`: never detected, named by the config
    FormatName("axolotl_preference", ("messages", "chosen", "rejected")),
)

BY_NAME = {f.name: f for f in NAMED}
FORMATS = ("auto", *(f.name for f in NAMED))  # the values of the `format` setting
ROLES = tuple(dict.fromkeys(role for f in NAMED for role in f.roles))  # every column some format reads
AXOLOTL_TYPES = {kind: f.name for f in NAMED for kind in f.axolotl}  # Axolotl `type:` -> format

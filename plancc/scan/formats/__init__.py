"""The row formats, one module each, listed in detection order: what a source's rows are and how they become
token sequences.

A format module (`tokenized`, `messages`, `alpaca`, `prompt_completion`, `text`) holds everything about its rows:
which columns say a source is of it (`detects`), the columns it reads and checks (`canonical`, under its own names:
`--columns role=FIELD` renames a source's fields onto them first), how settings shape the text (`shape`,
`text_format`), how rows become tokens and labels (`encode`), what `plancc show` says is trained (`trained`). Its
name, its roles and the names other tools give it (Axolotl's dataset `type:`) are one `FormatName` in
`plancc.config.formats`, which the module names as `named`.

Why the names live apart from the behaviour: the settings check `format` and `--columns` when they are resolved
(a misspelt format in a config file is named there, with the file), the store tells a samples table from a
source by the columns formats read, and the CLI lists the names; all of them sit below the scan and may not import
it. So the names and roles are plain data one layer down, and this package holds what needs Arrow, a tokenizer or
a chat template. `tests/unit/scan/formats/test_registry.py` holds the two to the same formats.

A scan runs a format as: `detect` (or `--format`) on the first rows → per shard `map_columns` → `canonical` →
`shape` → `encode` (in worker processes for the formats that tokenize) → the samples table (`sources.samples`).

**Several sequences a row.** `encode` returns `Encoded` sequences, not rows: a format whose rows each give `k`
sequences (a preference pair: the chosen and the rejected completion, each its own sample) sets
`sequences = k` and returns `k * rows` sequences in row order (row r: sequences r*k .. r*k+k-1), each with its own
tokens, labels and `end_only`, and per-sequence values in `Encoded.attributes` (e.g. `pair_role`, `desirable`)
for the samples table. A fixed `k` keeps a sequence's place computable from its row alone, so shards still need
no coordination: sample `row * k + j` is the token store's row of that number. The SFT formats give one each;
the scan around them (a part's ids offset by its first row in `scan/shard.py`, drops by sequence in
`sources/samples.py`) becomes `lo * k` and whole rows kept or dropped together when the first format with `k > 1`
lands.

Adding a format: a `FormatName` in `plancc.config.formats`, a module here subclassing `RowFormat` (its `FORMAT`
in `FORMATS` below, where detection should try it), and its tests.
"""

from __future__ import annotations

from plancc.config.fields import flag
from plancc.config.settings import ScanOptions
from plancc.errors import InputError, SettingsError, clip
from plancc.scan.formats import (
    alpaca,
    axolotl_preference,
    input_output,
    messages,
    preference,
    prompt_completion,
    text,
    tokenized,
    unpaired_preference,
)
from plancc.scan.formats.base import Encoded, Encoding, RowError, RowFormat
from plancc.scan.formats.columns import map_columns
from plancc.scan.sources.read import Source

# detection order: the first whose columns a source has is its format
# (preference data before the formats whose columns it shares: its rows are never SFT rows)
FORMATS: tuple[RowFormat, ...] = (tokenized.FORMAT, preference.FORMAT, unpaired_preference.FORMAT,
                                  axolotl_preference.FORMAT, messages.FORMAT, alpaca.FORMAT, prompt_completion.FORMAT,
                                  input_output.FORMAT, text.FORMAT)
_BY_NAME = {f.name: f for f in FORMATS}


def get(name: str) -> RowFormat:
    """The format named `name` (a `--format` value other than `auto`, or a scan record's `format`)."""
    return _BY_NAME[name]


def detect(src: Source) -> RowFormat:
    """The format a source's columns imply (docs/spec.md §2): the first of `FORMATS` that detects them."""
    found = next((f for f in FORMATS if f.detects(src)), None)
    if found is not None:
        return found
    raise InputError(
        f"{src.paths[0] if src.paths else 'source'}: cannot tell the format from columns "
        f"{clip(sorted(src.column_names), 200)}; expected {', '.join(f.detected_by for f in FORMATS[:-1])} or "
        f"{FORMATS[-1].detected_by}: map yours with --columns (e.g. --columns prompt=question,completion=answer) "
        "and/or pass --format"
    )


def refuse_as_sft(src: Source, fmt: RowFormat) -> None:
    """Preference pairs (chosen/rejected) and unpaired feedback (prompt, completion and a label) are never compiled
    as SFT: trained as SFT, a rejected or undesirable completion would be taught as a target."""
    preference = next((f for f in FORMATS if f.data_kind != "sft" and f.detects(src)), None)
    if fmt.data_kind != "sft" or preference is None:
        return
    where = src.paths[0] if src.paths else "source"
    what = ("columns chosen and rejected are preference pairs (DPO, ORPO, ...)" if preference.sequences > 1 else
            "a label column beside prompt and completion is unpaired feedback (KTO)")
    raise InputError(f"{where}: {what}, not SFT data: --format {fmt.name} would train every completion, rejected or "
                     f"undesirable too; compile them as format {preference.name} (what auto-detection picks), or "
                     "drop those columns to train SFT")


def choose(probe: Source, options: ScanOptions) -> RowFormat:
    """The scan's format, from its first rows `probe` (columns mapped): `--format`, or the one their columns
    imply; checked now that it reads them (a missing or mistyped column is named before any work) and that no
    text-shaping setting is for another format (it would do nothing)."""
    fmt = detect(probe) if options.format == "auto" else get(options.format)
    if fmt.name != "tokenized":
        refuse_as_sft(probe, fmt)
    fmt.canonical(probe, options)
    for name in options.shaping():
        owner = next(f for f in FORMATS if name in f.shaping)
        if owner is not fmt:
            raise SettingsError(f"{flag(name)} applies to format {owner.name}; this source is {fmt.name}", name)
    return fmt


__all__ = ["FORMATS", "Encoded", "Encoding", "RowError", "RowFormat", "choose", "detect", "get", "map_columns"]

"""A scan's record: how a samples table was made (the options that decide its rows, the tokenizer and template
that made them, its counts and fingerprints), as `scan.json` and a plan manifest's `scan` entry hold it.

`ScanRecord.read` is the one reader and `ScanRecord.write` / `to_json` the one writer of that JSON: every other
module holds the typed record. A record says only what its writer knew (a scan knows everything, a recipe its
counts and tokenizer, a bare samples table at most its options), so `keys` names the entries it holds and
`to_json` writes exactly those: a record read and written again gives the same bytes. A malformed file is one
line naming it and the entry, never a traceback.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import orjson

from plancc.config import registry
from plancc.config.checks import NamedTokens, Pairs, Positive, Roles, Switch, Tokens
from plancc.config.fields import Record
from plancc.config.settings import ScanOptions
from plancc.core.choices import Choice
from plancc.errors import InputError
from plancc.store.atomic import read_regular
from plancc.store.parquet import write_json
from plancc.store.schemas import SCAN_MANIFEST_FILE

COUNTS = ("truncated", "dropped_long", "dropped_all_masked", "end_only", "blank_turns")  # {count, first_rows}
TOTALS = ("rows_read", "retained", "dropped_samples", "truncated_samples")
_DEFAULTS = ScanOptions()


class ScanRecordError(InputError):
    """A scan record (scan.json, a manifest's `scan` entry) that is not one plancc wrote."""


def _bad(where: str, key: str, want: str, got: Any) -> ScanRecordError:
    return ScanRecordError(f"{where}: entry {key!r} must be {want}, got {got!r} (not a scan record plancc wrote: "
                           "rescan the source)")


def _of(where: str, key: str, value: Any, types: tuple[type, ...], want: str) -> Any:
    """`value` when it is of `types` (a bool is never an int), else the error naming `key`."""
    if (isinstance(value, bool) and bool not in types) or not isinstance(value, types):
        raise _bad(where, key, want, value)
    return value


def _text(where: str, key: str, value: Any, nullable: bool = True) -> str | None:
    if value is None and nullable:
        return None
    return _of(where, key, value, (str,), "a string" + (" or null" if nullable else ""))


def _int(where: str, key: str, value: Any) -> int:
    return _of(where, key, value, (int,), "an integer")


def _texts(where: str, key: str, value: Any) -> tuple[str, ...]:
    return tuple(_text(where, key, v, False) for v in _of(where, key, value, (list,), "a list of strings"))


def _pairs(where: str, key: str, value: Any) -> tuple[tuple[str, str], ...]:
    items = _of(where, key, value, (list,), "a list of [name, name] pairs")
    if not all(isinstance(p, list) and len(p) == 2 and all(isinstance(s, str) for s in p) for p in items):
        raise _bad(where, key, "a list of [name, name] pairs", value)
    return tuple((a, b) for a, b in items)


def _plain(value: Any) -> Any:
    """A setting's value as the record holds it: named choices as their text."""
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    return str(value) if isinstance(value, Choice) else value


def _reader(d: registry.Declared) -> Any:
    """How the record reads the entry of setting `d` back, by its check."""
    check = d.setting.check
    if isinstance(check, Switch):
        return lambda where, key, v: _of(where, key, v, (bool,), "true or false")
    if isinstance(check, Positive):
        return _int
    if isinstance(check, Pairs | NamedTokens):
        return _pairs
    if isinstance(check, Roles | Tokens):
        return _texts
    nullable = d.default is None or d.setting.record == Record.WHEN_USED
    return lambda where, key, v: _text(where, key, v, nullable)


# every scan option the record holds, in declaration order: those always recorded are required entries; the others
# (`Record.UNLESS_DEFAULT`) are written only away from their defaults (a scan made before they existed keeps its
# key), `template_date` (`Record.WHEN_USED`) only for a template that reads the date
_RECORDED = tuple(d for d in registry.of_stage("scan", "both") if d.setting.record != Record.NEVER)
_READERS = {d.name: _reader(d) for d in _RECORDED}


class _Recorded:
    """The methods of `RecordedOptions` (its fields are made from the settings' declarations)."""

    @staticmethod
    def of(options: ScanOptions, tokenizer: str | None, chat_template: str | None,
           reads_date: bool) -> RecordedOptions:
        """What a scan with `options` records, given its tokenizer's and template's fingerprints (and whether its
        template reads the date)."""
        kept = {d.name: _plain(getattr(options, d.name)) for d in _RECORDED
                if d.name not in ("tokenizer", "chat_template", "template_date")}
        return RecordedOptions(**kept, tokenizer=tokenizer, chat_template=chat_template,
                               template_date=options.template_date if reads_date else None)

    def to_json(self) -> dict[str, Any]:
        """The recorded options as plain JSON values, the optional ones only when recorded (see `_RECORDED`)."""
        out: dict[str, Any] = {}
        for d in _RECORDED:
            value = getattr(self, d.name)
            if (d.setting.record == Record.WHEN_USED and value is None) or (
                    d.setting.record == Record.UNLESS_DEFAULT and value == d.default):
                continue
            out[d.name] = [list(p) for p in value] if isinstance(d.setting.check, Pairs | NamedTokens) else \
                list(value) if isinstance(value, tuple) else value
        return out

    @staticmethod
    def from_json(d: Any, where: str) -> RecordedOptions:
        """The options `to_json` wrote; a ScanRecordError naming `where` and the entry otherwise."""
        d = _of(where, "options", d, (dict,), "an object")
        unknown = sorted(set(d) - set(_READERS))
        if unknown:
            raise ScanRecordError(f"{where}: unknown scan option {unknown[0]!r} (not a scan record plancc wrote: "
                                  "rescan the source)")
        missing = [r.name for r in _RECORDED if r.setting.record == Record.ALWAYS and r.name not in d]
        if missing:
            raise ScanRecordError(f"{where}: scan options lack {missing[0]!r} (not a scan record plancc wrote: "
                                  "rescan the source)")
        return RecordedOptions(**{name: _READERS[name](f"{where} options", name, value) for name, value in d.items()})

    @staticmethod
    def from_metadata(settings: Any) -> RecordedOptions | None:
        """The options a samples file's metadata `settings` records when a scan wrote it (a plan writes its plan
        settings there instead, which hold `mode` and no `format`); None otherwise."""
        if not isinstance(settings, dict) or "format" not in settings or "mode" in settings:
            return None
        return RecordedOptions.from_json(settings, "samples file metadata")


RecordedOptions = dataclasses.make_dataclass(
    "RecordedOptions",
    [(d.name, d.type) if d.setting.record == Record.ALWAYS else
     (d.name, d.type, field(default=None if d.setting.record == Record.WHEN_USED else _plain(d.default)))
     for d in _RECORDED],
    bases=(_Recorded,), frozen=True, kw_only=True)
RecordedOptions.__module__ = __name__
RecordedOptions.__doc__ = """The scan options as recorded (and hashed into the scan cache key): what decides the
samples table. The tokenizer and template are their content fingerprints, not where they were found; a setting
declared `Record.NEVER` (`max_dropped`, a check on the result) is not here."""


@dataclass(frozen=True)
class Counted:
    """Samples of one kind (truncated, dropped as too long, ...): how many, and the first rows."""

    count: int
    first_rows: tuple[int, ...]

    def to_json(self) -> dict[str, Any]:
        """As the record writes it."""
        return {"count": self.count, "first_rows": list(self.first_rows)}


@dataclass(frozen=True)
class Template:
    """The chat template that rendered the rows: its name and content fingerprint (where it came from, and
    whether its `{% generation %}` blocks mark what is trained, for a scan's own)."""

    name: str
    fingerprint: str
    origin: str | None = None
    generation: bool = False

    def to_json(self) -> dict[str, Any]:
        """As the record writes it."""
        origin = {"origin": self.origin} if self.origin is not None else {}
        return {"name": self.name, **origin, "fingerprint": self.fingerprint,
                **({"generation": True} if self.generation else {})}


@dataclass(frozen=True)
class PartRange:
    """A partial scan's rows [lo, hi) of the source's `rows`."""

    lo: int
    hi: int
    rows: int


@dataclass(frozen=True)
class MergedFrom:
    """One part a merged scan was joined from."""

    path: str
    lo: int
    hi: int


@dataclass(frozen=True, kw_only=True)
class ScanRecord:
    """What a scan records of how its samples table was made (module docstring); `keys`: the entries it holds."""

    keys: frozenset[str] = field(default=frozenset(), repr=False)
    format: str | None = None
    source: str | None = None
    source_kind: str | None = None
    source_paths: tuple[str, ...] = ()
    source_files: tuple[tuple[str, int], ...] = ()  # each source file's name (beside the others) and rows, in row order
    source_fingerprint: str | None = None
    tokenizer: str | None = None  # where the tokenizer was found (or the built-in's name)
    tokenizer_fingerprint: str | None = None
    chat_template: Template | None = None
    text_format: tuple[tuple[str, str], ...] = ()  # how a row's fields became the text (alpaca, prompt_completion)
    eos_token: str | None = None
    options: RecordedOptions | None = None  # None: nothing is known of how the rows were made
    max_dropped: float = _DEFAULTS.max_dropped
    labels_shifted: bool = False
    key: str | None = None  # the scan cache key
    plancc_scan_version: int | None = None
    warnings: tuple[str, ...] = ()
    rows_read: int = 0
    retained: int = 0
    dropped_samples: int = 0
    truncated_samples: int = 0
    truncated: Counted = Counted(0, ())
    dropped_long: Counted = Counted(0, ())
    dropped_all_masked: Counted = Counted(0, ())
    end_only: Counted = Counted(0, ())
    blank_turns: Counted = Counted(0, ())  # rows with a turn to train whose text renders to nothing
    fingerprints: tuple[tuple[str, str], ...] = ()  # dataset, metadata
    part: PartRange | None = None  # a partial scan's rows
    seconds: float = 0.0
    merged_from: tuple[MergedFrom, ...] = ()

    def __post_init__(self) -> None:
        for name in ("text_format", "fingerprints"):  # one order, whichever the writer or the JSON gave
            object.__setattr__(self, name, tuple(sorted(getattr(self, name))))

    @staticmethod
    def of(**values: Any) -> ScanRecord:
        """A record holding exactly the entries given."""
        return ScanRecord(keys=frozenset(values), **values)

    def but(self, **values: Any) -> ScanRecord:
        """This record with the entries given set (added when it did not hold them)."""
        return dataclasses.replace(self, keys=self.keys | set(values), **values)

    def without(self, *names: str) -> ScanRecord:
        """This record without the entries named (their values back to the defaults)."""
        defaults = {f.name: f.default for f in fields(ScanRecord) if f.name in names}
        return dataclasses.replace(self, keys=self.keys - set(names), **defaults)

    def held(self) -> dict[str, Any]:
        """The entries this record holds, by name (typed values: what `but` takes)."""
        return {name: getattr(self, name) for name in self.keys}

    @property
    def sequence_len(self) -> int | None:
        """The sequence_len the samples were cut or dropped to; None when the record has no options."""
        return self.options.sequence_len if self.options is not None else None

    @property
    def fingerprint_map(self) -> dict[str, str]:
        """The samples table's fingerprints by name (dataset, metadata)."""
        return dict(self.fingerprints)

    @property
    def identity(self) -> dict[str, str | None]:
        """The tokenizer and chat template fingerprints (for the metadata fingerprint)."""
        return {"tokenizer": self.tokenizer_fingerprint,
                "chat_template": self.chat_template.fingerprint if self.chat_template else None}

    def to_json(self) -> dict[str, Any]:
        """The record as JSON values: exactly the entries it holds."""
        return {name: _json_value(getattr(self, name), name) for name in sorted(self.keys)}

    @staticmethod
    def from_json(d: Any, where: str) -> ScanRecord:
        """The record `to_json` wrote; a ScanRecordError naming `where` and the entry otherwise."""
        d = _of(where, "scan", d, (dict,), "an object")
        known = {f.name for f in fields(ScanRecord)} - {"keys"}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ScanRecordError(f"{where}: unknown entry {unknown[0]!r} (not a scan record plancc wrote: rescan "
                                  "the source)")
        return ScanRecord.of(**{k: _READ[k](where, k, v) for k, v in d.items()})

    @staticmethod
    def read(path: str | Path) -> ScanRecord:
        """The record of a scan directory (or the scan.json at `path`); ScanRecordError naming the file when it
        is missing (or not a regular file), not JSON, or not a record."""
        p = Path(path)
        f = p / SCAN_MANIFEST_FILE if p.is_dir() else p
        raw = read_regular(f)  # a FIFO named like the record is not read (it would block)
        if raw is None:
            raise ScanRecordError(f"{f.parent}: not a scan directory (no readable {SCAN_MANIFEST_FILE})")
        try:
            d = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise ScanRecordError(f"{f}: not readable ({exc})") from None
        return ScanRecord.from_json(d, str(f))

    def write(self, directory: Path) -> None:
        """The record as the scan.json of `directory`."""
        write_json(self.to_json(), directory / SCAN_MANIFEST_FILE)


def _json_value(value: Any, name: str) -> Any:
    """One entry as JSON values."""
    if name in ("text_format", "fingerprints"):
        return dict(value)
    if name == "source_files":
        return [list(f) for f in value]
    if name == "part":
        return {"lo": value.lo, "hi": value.hi, "rows": value.rows}
    if name == "merged_from":
        return [{"path": m.path, "lo": m.lo, "hi": m.hi} for m in value]
    if isinstance(value, tuple):
        return list(value)
    return value.to_json() if hasattr(value, "to_json") else value


def _counted(where: str, key: str, v: Any) -> Counted:
    v = _of(where, key, v, (dict,), "an object {count, first_rows}")
    if set(v) != {"count", "first_rows"}:
        raise _bad(where, key, "an object {count, first_rows}", v)
    rows = _of(where, key, v["first_rows"], (list,), "an object {count, first_rows}")
    return Counted(_int(where, key, v["count"]), tuple(_int(where, key, r) for r in rows))


def _template(where: str, key: str, v: Any) -> Template | None:
    if v is None:
        return None
    v = _of(where, key, v, (dict,), "an object {name, fingerprint, ...} or null")
    if not {"name", "fingerprint"} <= set(v) <= {"name", "fingerprint", "origin", "generation"} or \
            v.get("generation", True) is not True:
        raise _bad(where, key, "an object {name, fingerprint, ...} or null", v)
    return Template(_text(where, key, v["name"], False), _text(where, key, v["fingerprint"], False),
                    _text(where, key, v.get("origin")), "generation" in v)


def _files(where: str, key: str, v: Any) -> tuple[tuple[str, int], ...]:
    items = _of(where, key, v, (list,), "a list of [name, rows] pairs")
    if not all(isinstance(p, list) and len(p) == 2 and isinstance(p[0], str) and type(p[1]) is int for p in items):
        raise _bad(where, key, "a list of [name, rows] pairs", v)
    return tuple((name, rows) for name, rows in items)


def _str_map(where: str, key: str, v: Any) -> tuple[tuple[str, str], ...]:
    v = _of(where, key, v, (dict,), "an object of strings")
    return tuple((k, _text(where, key, x, False)) for k, x in v.items())


def _part(where: str, key: str, v: Any) -> PartRange:
    v = _of(where, key, v, (dict,), "an object {lo, hi, rows}")
    if set(v) != {"lo", "hi", "rows"}:
        raise _bad(where, key, "an object {lo, hi, rows}", v)
    return PartRange(*(_int(where, key, v[k]) for k in ("lo", "hi", "rows")))


def _merged(where: str, key: str, v: Any) -> tuple[MergedFrom, ...]:
    items = _of(where, key, v, (list,), "a list of {path, lo, hi}")
    if not all(isinstance(m, dict) and set(m) == {"path", "lo", "hi"} for m in items):
        raise _bad(where, key, "a list of {path, lo, hi}", v)
    return tuple(MergedFrom(_text(where, key, m["path"], False), _int(where, key, m["lo"]), _int(where, key, m["hi"]))
                 for m in items)


def _number(where: str, key: str, v: Any) -> float:
    return _of(where, key, v, (int, float), "a number")


_READ: dict[str, Any] = {
    **dict.fromkeys(("source_kind", "source_fingerprint", "tokenizer", "tokenizer_fingerprint", "eos_token", "key",
                     "format", "source"), _text),
    "source_paths": _texts, "warnings": _texts, "source_files": _files,
    "chat_template": _template, "text_format": _str_map, "fingerprints": _str_map,
    "options": lambda where, key, v: RecordedOptions.from_json(v, where),
    "max_dropped": _number, "seconds": _number,
    "labels_shifted": lambda where, key, v: _of(where, key, v, (bool,), "true or false"),
    "plancc_scan_version": _int, **dict.fromkeys(TOTALS, _int), **dict.fromkeys(COUNTS, _counted),
    "part": _part, "merged_from": _merged,
}

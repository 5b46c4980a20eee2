"""What every row format is and gives: `RowFormat` (the interface a format module implements), `Encoding` (what
encoding reads: tokenizer, template, scan options) and `Encoded` (its result: sequences as flat arrays).

`Encoded` holds sequences, not rows: a format gives `sequences` of them for every source row, in row order (row r
gives sequences r*k .. r*k+k-1), each with its own tokens and labels and, in `attributes`, its own values of
columns the samples table adds (e.g. which side of a preference pair it is). Every SFT format gives one sequence
a row and no attributes.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import pyarrow as pa

from plancc.config.formats import FormatName
from plancc.config.settings import ScanOptions

if TYPE_CHECKING:
    from plancc.scan.sources.read import Source
    from plancc.scan.sources.tokenizer import Tok


class RowError(Exception):
    """A problem with one source row; the caller turns `row` into a file location."""

    def __init__(self, row: int, message: str):
        super().__init__(message)
        self.row = row
        self.message = message


@dataclass(frozen=True)
class Encoding:
    """What encoding reads: the tokenizer (None: rows already tokenized without one), the chat template's text
    (chat formats) and the scan's options."""

    tok: Tok | None
    options: ScanOptions = field(default_factory=ScanOptions)
    template: str | None = None

    @property
    def keep(self) -> int | None:
        """Only a sequence's first `keep` tokens matter when a longer one is cut or dropped (None: `long error`
        needs exact lengths), so a text far longer may be tokenized from a cut of it (`tokens.heads`)."""
        return self.options.sequence_len if self.options.long in ("truncate", "drop") else None


@dataclass
class Encoded:
    """Encoded sequences as flat int32 ids and labels with int64 offsets (CSR), which train on an end of turn alone
    (`end_only`), and per-sequence `attributes` (module docstring)."""

    ids: np.ndarray  # int32, flat
    labels: np.ndarray  # int32, flat, same layout as ids
    offsets: np.ndarray  # int64, n+1
    end_only: np.ndarray | None = None  # bool, n; None: no sequence is known to be
    attributes: dict[str, np.ndarray] = field(default_factory=dict)  # name -> one value per sequence

    def end_only_rows(self) -> np.ndarray:
        """`end_only` as a bool array of one entry a sequence."""
        return self.end_only if self.end_only is not None else np.zeros(len(self.offsets) - 1, bool)

    def to_table(self, start: int = 0, stop: int | None = None) -> pa.Table:
        """Sequences [start, stop) as `input_ids`/`labels` list<int32> columns (int32 offsets: keep slices
        < 2**31), the bool column `end_only` and one column per attribute."""
        stop = len(self.offsets) - 1 if stop is None else stop
        a, b = int(self.offsets[start]), int(self.offsets[stop])
        off = pa.array((self.offsets[start:stop + 1] - a).astype(np.int32), pa.int32())
        return pa.table({
            "input_ids": pa.ListArray.from_arrays(off, pa.array(self.ids[a:b], pa.int32())),
            "labels": pa.ListArray.from_arrays(off, pa.array(self.labels[a:b], pa.int32())),
            "end_only": pa.array(self.end_only_rows()[start:stop], pa.bool_()),
            **{name: pa.array(values[start:stop]) for name, values in self.attributes.items()},
        })

    @staticmethod
    def from_table(table: pa.Table) -> Encoded:
        """The sequences `to_table` wrote (copies: they outlive a memory-mapped file they are read from)."""
        ids = table.column("input_ids").combine_chunks()
        labels = table.column("labels").combine_chunks()
        offsets = np.asarray(ids.offsets, dtype=np.int64)
        known = {"input_ids", "labels", "end_only"}
        return Encoded(np.array(ids.flatten().to_numpy(), dtype=np.int32),
                       np.array(labels.flatten().to_numpy(), dtype=np.int32), offsets - offsets[0],
                       np.array(table.column("end_only").to_numpy(), dtype=bool),
                       {name: np.array(table.column(name).to_numpy(zero_copy_only=False))
                        for name in table.column_names if name not in known})

    @staticmethod
    def empty() -> Encoded:
        """No sequences: the identity of `concat`."""
        return Encoded(np.zeros(0, np.int32), np.zeros(0, np.int32), np.zeros(1, np.int64))

    @staticmethod
    def concat(parts: list[Encoded]) -> Encoded:
        """The sequences of `parts`, in order, as one `Encoded` (parts of one format: the same attributes)."""
        if len(parts) == 1:
            return parts[0]
        shifts = np.cumsum([0] + [int(p.offsets[-1]) for p in parts[:-1]])
        offsets = np.concatenate([np.zeros(1, np.int64)] + [p.offsets[1:] + s for p, s in zip(parts, shifts, strict=True)])
        attributes = {name: np.concatenate([p.attributes[name] for p in parts]) for name in parts[0].attributes}
        return Encoded(np.concatenate([p.ids for p in parts]), np.concatenate([p.labels for p in parts]), offsets,
                       np.concatenate([p.end_only_rows() for p in parts]), attributes)


class RowFormat(ABC):
    """A row format: how a source's rows are recognized, checked, shaped, encoded and described.

    A format module subclasses this once and names its `FormatName` (`plancc.config.formats`); the registry
    (`plancc.scan.formats`) lists the instances in detection order. The methods run in this order in a scan:
    `detects` (auto-detection, on the first rows) → `canonical` (checked columns under the format's own names,
    every row) → `shape` (text-shaping settings applied; may hand the rows on to another format) → `encode`
    (tokens and labels). `trained` is what `plancc show` says is supervised.
    """

    named: ClassVar[FormatName]
    detected_by: ClassVar[str]  # the columns that say a source is of it, as the detection error lists them
    sequences: ClassVar[int] = 1  # sequences each source row gives (`Encoded`)
    data_kind: ClassVar[str] = "sft"  # what its samples table holds (`schemas.data_kind_of`)
    tokenizes: ClassVar[bool] = True  # rows are text: a scan of them needs a tokenizer
    chat: ClassVar[bool] = False  # rows are conversations: a scan of them needs a chat template
    shaping: ClassVar[tuple[str, ...]] = ()  # the text-shaping settings (`ScanOptions.shaping`) it reads

    @property
    def name(self) -> str:
        """The format's name (`--format`, the scan record's `format`)."""
        return self.named.name

    @abstractmethod
    def detects(self, src: Source) -> bool:
        """Whether `src`'s columns are this format's (the registry asks each format in turn)."""

    @abstractmethod
    def canonical(self, src: Source, options: ScanOptions) -> pa.Table:
        """The rows' checked input columns under the format's own names; an `InputError` names the first bad
        row, column and what was expected."""

    def shape(self, table: pa.Table, options: ScanOptions) -> tuple[pa.Table, RowFormat]:
        """Canonical rows with the text-shaping settings applied, and the format that encodes them."""
        return table, self

    def text_format(self, options: ScanOptions) -> dict[str, Any] | None:
        """What the scan record says about how a row's fields became the text tokenized (None: nothing)."""
        return None

    def needs_template(self, probe: Source) -> bool:
        """Whether a scan of rows like `probe`'s (the first rows, columns mapped) needs a chat template: the
        format's rows are conversations (`chat`), or some of them may be (preference data)."""
        return self.chat

    def labels_shifted(self, options: ScanOptions) -> bool:
        """Whether `encode` gives labels already shifted (a tokenized source's `shift_labels`)."""
        return False

    @abstractmethod
    def encode(self, table: pa.Table, how: Encoding, row0: int = 0) -> Encoded:
        """Canonical rows as sequences (`row0`: the global index of the first row, for `RowError`s)."""

    @abstractmethod
    def trained(self, options: ScanOptions, *, generation: bool = False) -> str:
        """What the scan supervised, in one line: the what-is-trained settings that apply to this format
        (`generation`: the chat template marks it with `{% generation %}` blocks)."""

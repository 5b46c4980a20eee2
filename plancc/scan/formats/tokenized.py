"""`tokenized`: rows already tokenized, `input_ids` with optional `labels` (or `shift_labels`, labels already
shifted, for `--shift none`): the source's own labels are what is trained, read as they are.

    {"input_ids": [5, 6, 7], "labels": [-100, 6, 7]}

No tokenizer is needed (one given bounds the ids by its vocabulary); no text is shaped.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from plancc.config.formats import BY_NAME
from plancc.config.settings import ScanOptions
from plancc.core.plan_arrays import IGNORE_INDEX
from plancc.scan.formats import columns
from plancc.scan.formats.base import Encoded, Encoding, RowError, RowFormat
from plancc.scan.sources.read import Source


def _list_flat(arr: pa.ChunkedArray) -> tuple[pa.Array, np.ndarray]:
    """(flattened values, offsets int64 n+1) of a list column."""
    a = arr.combine_chunks() if isinstance(arr, pa.ChunkedArray) else arr
    if pa.types.is_fixed_size_list(a.type):
        offsets = np.arange(len(a) + 1, dtype=np.int64) * a.type.list_size
    else:
        offsets = np.asarray(a.offsets, dtype=np.int64)
        offsets = offsets - offsets[0]
    return a.flatten(), offsets


def _row_of(offsets: np.ndarray, flat_index: int) -> int:
    return int(np.searchsorted(offsets, flat_index, side="right") - 1)


def _ids(table: pa.Table, vocab_size: int | None) -> tuple[np.ndarray, np.ndarray, int]:
    """(ids int32, offsets, the bound every id is under) of the `input_ids` column."""
    values, offsets = _list_flat(table.column("input_ids"))
    if values.null_count:
        raise RowError(_row_of(offsets, pc.index(pc.is_null(values), True).as_py()),
                       "column 'input_ids' holds a null token")
    ids64 = values.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
    limit = vocab_size if vocab_size is not None else 2**31
    bad = np.flatnonzero((ids64 < 0) | (ids64 >= limit))
    if bad.size:
        j = int(bad[0])
        hint = f" (tokenizer vocabulary has {vocab_size} tokens: wrong --tokenizer?)" if vocab_size else ""
        raise RowError(_row_of(offsets, j), f"column 'input_ids' has token id {ids64[j]} at position "
                                            f"{j - offsets[_row_of(offsets, j)]}, outside [0, {limit}){hint}")
    return ids64.astype(np.int32), offsets, limit


def _labels(table: pa.Table, name: str, offsets: np.ndarray, limit: int) -> np.ndarray:
    """Column `name` as int32 labels laid out as the ids (a null is -100)."""
    lvalues, loffsets = _list_flat(table.column(name))
    if not np.array_equal(loffsets, offsets):
        row = int(np.flatnonzero(np.diff(loffsets) != np.diff(offsets))[0])
        raise RowError(row, f"column '{name}' has {loffsets[row + 1] - loffsets[row]} values but 'input_ids' has "
                            f"{offsets[row + 1] - offsets[row]}")
    if lvalues.null_count:
        lvalues = pc.fill_null(lvalues, IGNORE_INDEX)
    lab64 = lvalues.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
    bad = np.flatnonzero(((lab64 < 0) & (lab64 != IGNORE_INDEX)) | (lab64 >= limit))
    if bad.size:
        j = int(bad[0])
        raise RowError(_row_of(offsets, j), f"column '{name}' has value {lab64[j]}; expected -100 or a token id in "
                                            f"[0, {limit})")
    return lab64.astype(np.int32)


def _encode(table: pa.Table, how: Encoding) -> Encoded:
    vocab_size = how.tok.vocab_size if how.tok is not None else None
    ids, offsets, limit = _ids(table, vocab_size)
    name = "shift_labels" if how.options.shift == "none" else "labels"
    if name == "shift_labels" and name not in table.column_names:
        raise RowError(0, "--shift none needs a 'shift_labels' column (labels already shifted); this tokenized "
                          "source has none (use --shift sample)")
    if name not in table.column_names:
        return Encoded(ids, ids.copy(), offsets)
    return Encoded(ids, _labels(table, name, offsets, limit), offsets)


class Tokenized(RowFormat):
    """Rows of token ids and the source's own labels."""

    named = BY_NAME["tokenized"]
    detected_by = "input_ids"
    tokenizes: ClassVar[bool] = False

    def detects(self, src: Source) -> bool:
        """An `input_ids` column."""
        return "input_ids" in src.column_names

    def canonical(self, src: Source, options: ScanOptions) -> pa.Table:
        """`input_ids`, and `labels`/`shift_labels` when there, as lists of integers."""
        columns.require(src, self.name, ("input_ids",))
        return pa.table({name: columns.int_list_column(src, name) for name in self.named.roles
                         if name in src.column_names})

    def labels_shifted(self, options: ScanOptions) -> bool:
        """Under `--shift none` the labels are the source's `shift_labels`, already shifted."""
        return options.shift == "none"

    def encode(self, table: pa.Table, how: Encoding, row0: int = 0) -> Encoded:
        """The ids; labels are `shift_labels` under shift none, else `labels` (or the ids)."""
        try:
            return _encode(table, how)
        except RowError as exc:
            raise RowError(row0 + exc.row, exc.message) from None

    def trained(self, options: ScanOptions, *, generation: bool = False) -> str:
        """The source's own labels."""
        return "the source's own labels"


FORMAT = Tokenized()

"""`input_output`: text already cut into segments, each trained or not (Axolotl's template-free
`type: input_output`).

    {"segments": [{"text": "Q: 2+2?\\n", "label": false}, {"text": "A: 4</s>", "label": true}]}
        ->  "Q: 2+2?\\n" "A: 4</s>",  only the second segment's tokens supervised

Each segment is tokenized apart, without the tokenizer's special tokens, and the row is the segments joined: no
template, no bos or eos added (the segments hold their own markup). `train_on_inputs` trains every segment.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from plancc.config.formats import BY_NAME
from plancc.config.settings import ScanOptions
from plancc.core.plan_arrays import IGNORE_INDEX
from plancc.errors import InputError
from plancc.scan.formats import columns, tokens
from plancc.scan.formats.base import Encoded, Encoding, RowFormat
from plancc.scan.sources.read import Source

SEGMENT = pa.struct([("text", pa.large_string()), ("label", pa.bool_())])


def _segment_ok(s) -> bool:
    return isinstance(s, dict) and isinstance(s.get("text"), str) and isinstance(s.get("label"), bool)


class InputOutput(RowFormat):
    """Rows of labelled text segments."""

    named = BY_NAME["input_output"]
    detected_by = "segments"

    def detects(self, src: Source) -> bool:
        """A `segments` column."""
        return "segments" in src.column_names

    def canonical(self, src: Source, options: ScanOptions) -> pa.Table:
        """`segments` as lists of {text, label} (a string and a bool each)."""
        columns.require(src, self.name, ("segments",))
        rows = columns.column_values(src, "segments")
        for i, row in enumerate(rows):
            if not (isinstance(row, list) and all(map(_segment_ok, row))):
                raise InputError(f"{src.where(i)}: column 'segments' must be a list of "
                                 "{text: string, label: true/false}")
        return pa.table({"segments": pa.array(rows, pa.list_(SEGMENT))})

    def encode(self, table: pa.Table, how: Encoding, row0: int = 0) -> Encoded:
        """Every segment tokenized apart; a row is its segments' tokens in order."""
        segments = table.column("segments").combine_chunks()
        parts = segments.flatten()
        ids, seg_off = tokens.token_ids(how.tok, parts.field("text").to_pylist(), False)
        trained = np.repeat(parts.field("label").to_numpy(zero_copy_only=False) | how.options.train_on_inputs,
                            np.diff(seg_off))
        labels = np.where(trained, ids, IGNORE_INDEX).astype(np.int32)
        rows = np.asarray(segments.offsets, dtype=np.int64)
        offsets = seg_off[rows - rows[0]]
        return Encoded(ids, labels, offsets)

    def trained(self, options: ScanOptions, *, generation: bool = False) -> str:
        """The segments labelled true, or every one with `train_on_inputs`."""
        return "every segment (train_on_inputs)" if options.train_on_inputs else "the segments labelled true"


FORMAT = InputOutput()

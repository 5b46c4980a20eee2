"""`text`: plain text, every token trained (continued pretraining; Axolotl's `completion`, TRL's language
modeling datasets).

    {"text": "The quick brown fox."}   ->   bos? "The quick brown fox." eos, all supervised

The eos appended (`add_eos`) is a target unless `train_on_eos none`.
"""

from __future__ import annotations

import pyarrow as pa

from plancc.config.formats import BY_NAME
from plancc.config.settings import ScanOptions
from plancc.scan.formats import columns, tokens
from plancc.scan.formats.base import Encoded, Encoding, RowFormat
from plancc.scan.sources.read import Source


class Text(RowFormat):
    """Rows of one text each."""

    named = BY_NAME["text"]
    detected_by = "text"

    def detects(self, src: Source) -> bool:
        """A `text` column."""
        return "text" in src.column_names

    def canonical(self, src: Source, options: ScanOptions) -> pa.Table:
        """`text` as strings."""
        columns.require(src, self.name, ("text",))
        return pa.table({"text": columns.string_column(src, "text")})

    def encode(self, table: pa.Table, how: Encoding, row0: int = 0) -> Encoded:
        """Each text whole, then eos."""
        return tokens.whole_texts(table.column("text").to_pylist(), how)

    def trained(self, options: ScanOptions, *, generation: bool = False) -> str:
        """Every token; the eos by `train_on_eos`."""
        return f"train_on_eos {options.train_on_eos}"


FORMAT = Text()

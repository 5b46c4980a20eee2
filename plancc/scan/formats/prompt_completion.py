"""`prompt_completion`: a prompt and the completion to learn (TRL's prompt-completion datasets, as strings; as
lists of messages they are chat rows, `messages`).

    {"prompt": "2+2=", "completion": "4"}   ->   bos? "2+2=" | "4" eos,  only "4" eos supervised

Prompt and completion are tokenized apart and joined as they are; `--separator` is text appended to the prompt
(so unsupervised). `train_on_inputs` supervises the prompt too; `train_on_eos none` leaves the eos out.
"""

from __future__ import annotations

from typing import Any, ClassVar

import pyarrow as pa
import pyarrow.compute as pc

from plancc.config.formats import BY_NAME
from plancc.config.settings import ScanOptions
from plancc.scan.formats import columns, tokens
from plancc.scan.formats.base import Encoded, Encoding, RowFormat
from plancc.scan.sources.read import Source


class PromptCompletion(RowFormat):
    """Rows of a prompt and its completion, both strings."""

    named = BY_NAME["prompt_completion"]
    detected_by = "prompt+completion"
    shaping: ClassVar[tuple[str, ...]] = ("separator",)

    def detects(self, src: Source) -> bool:
        """`prompt` and `completion` columns."""
        return {"prompt", "completion"} <= set(src.column_names)

    def canonical(self, src: Source, options: ScanOptions) -> pa.Table:
        """`prompt` and `completion` as strings."""
        columns.require(src, self.name, self.named.roles)
        return pa.table({name: columns.string_column(src, name) for name in self.named.roles})

    def shape(self, table: pa.Table, options: ScanOptions) -> tuple[pa.Table, PromptCompletion]:
        """`--separator` appended to every prompt."""
        if options.separator:
            prompts = pc.binary_join_element_wise(table.column("prompt"), options.separator, "")
            table = table.set_column(table.column_names.index("prompt"), "prompt", prompts)
        return table, self

    def text_format(self, options: ScanOptions) -> dict[str, Any]:
        """The separator: prompt and completion are tokenized apart, with nothing else between."""
        return {"separator": options.separator}

    def encode(self, table: pa.Table, how: Encoding, row0: int = 0) -> Encoded:
        """Each prompt, then its completion and eos."""
        return tokens.pairs(table.column("prompt").to_pylist(), table.column("completion").to_pylist(), how)

    def trained(self, options: ScanOptions, *, generation: bool = False) -> str:
        """`train_on_inputs` and `train_on_eos`."""
        return f"train_on_inputs {str(options.train_on_inputs).lower()}, train_on_eos {options.train_on_eos}"


FORMAT = PromptCompletion()

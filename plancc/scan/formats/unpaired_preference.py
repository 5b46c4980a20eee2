"""`unpaired_preference`: a prompt, one completion and a `label` saying whether the completion is desirable (TRL's
unpaired preference datasets, for KTO), as strings or as conversations.

    {"prompt": "2+2=", "completion": "4", "label": true}  ->  "2+2=" | "4" eos   (desirable: only "4" eos trained)

Each row gives one sequence, the prompt rendered as TRL renders it followed by the completion (`completions`),
with its label as the samples table's `desirable`. A completion is trained whatever its label: the loss, not the
mask, tells desirable from undesirable (a KTO plan is never SFT).
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from plancc.config.formats import BY_NAME
from plancc.config.settings import ScanOptions
from plancc.core.pairs import DESIRABLE_COLUMN
from plancc.errors import InputError, clip
from plancc.scan.formats import columns, completions
from plancc.scan.formats.base import Encoded, Encoding, RowFormat
from plancc.scan.sources.read import Source


def _labels(src: Source) -> pa.ChunkedArray:
    """The `label` column as booleans, naming the first row that is not one."""
    if "label" not in src.column_names:
        raise columns.missing(src, "unpaired_preference", "label")
    if "label" in src.loose:
        bad = next((i for i, v in enumerate(src.loose["label"]) if not isinstance(v, bool)), 0)
        raise InputError(f"{src.where(bad)}: column 'label' has {clip(repr(src.loose['label'][bad]), 40)}, expected "
                         "true or false")
    arr = src.table.column("label")
    if not pa.types.is_boolean(arr.type):
        raise InputError(f"{src.where(0)}: column 'label' has type {clip(arr.type)}, expected true or false")
    columns.first_null(src, "label", arr, "true or false")
    return arr


class UnpairedPreference(RowFormat):
    """Rows of a prompt, a completion and whether it is desirable."""

    named = BY_NAME["unpaired_preference"]
    detected_by = "prompt+completion+label"
    data_kind: ClassVar[str] = "unpaired_preference"

    def detects(self, src: Source) -> bool:
        """`prompt`, `completion` and `label` columns."""
        return {"prompt", "completion", "label"} <= set(src.column_names)

    def needs_template(self, probe: Source) -> bool:
        """Conversations need the chat template; strings do not."""
        return not isinstance(completions.values(probe, "completion")[0], str) if probe.num_rows else False

    def canonical(self, src: Source, options: ScanOptions) -> pa.Table:
        """`prompt` and `completion` as strings (conversations as JSON), whether each row is a conversation, and
        `label`."""
        completions.check_options(options, self.name)
        prompt, completion = completions.values(src, "prompt"), completions.values(src, "completion")
        conv = np.array([not isinstance(c, str) for c in completion], dtype=bool)
        bad = np.flatnonzero(np.array([not isinstance(p, str) for p in prompt], dtype=bool) != conv)
        if bad.size:
            raise InputError(f"{src.where(int(bad[0]))}: column 'prompt' is {'messages' if conv[bad[0]] else 'a string'}"
                             " but 'completion' is not; a row is all strings or all conversations")
        return pa.table({"prompt": completions.as_column(src, "prompt", prompt),
                         "completion": completions.as_column(src, "completion", completion),
                         "conversational": pa.array(conv), "label": _labels(src)})

    def encode(self, table: pa.Table, how: Encoding, row0: int = 0) -> Encoded:
        """Each completion after its prompt (`completions.render`), with its label."""
        enc = completions.render(table.column("prompt").to_pylist(), [table.column("completion").to_pylist()],
                                 np.asarray(table.column("conversational").to_pylist(), dtype=bool), how, row0)
        enc.attributes[DESIRABLE_COLUMN] = np.asarray(pc.fill_null(table.column("label"), False).to_pylist(),
                                                      dtype=bool)
        return enc

    def trained(self, options: ScanOptions, *, generation: bool = False) -> str:
        """Always the completion (with its end token), never the prompt, whatever its label."""
        return "the completion with its end token, desirable or not (the loss tells them apart); the prompt never"


FORMAT = UnpairedPreference()

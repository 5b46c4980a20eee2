"""`preference`: a prompt and two completions, the chosen one and the rejected one (TRL's preference datasets, for
DPO, IPO, SimPO and ORPO), as strings or as conversations; or TRL's implicit-prompt form, `chosen` and `rejected`
whole conversations (or texts) whose common start is the prompt.

    {"prompt": "2+2=", "chosen": "4", "rejected": "5"}
        ->  "2+2=" | "4" eos     and     "2+2=" | "5" eos     (two samples of one pair; only "4" eos, "5" eos trained)

Each row gives two sequences (`sequences = 2`): the chosen completion (`pair_role` "chosen") then the rejected
one, each the prompt rendered as TRL renders it followed by the completion (`completions`), both kept or dropped
together. A completion may also be one message (Axolotl's `chosen: {role, content}`).
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import pyarrow as pa

from plancc.config.formats import BY_NAME
from plancc.config.settings import ScanOptions
from plancc.core.pairs import PAIR_ROLE_COLUMN, PAIR_ROLES
from plancc.errors import InputError
from plancc.scan.formats import completions
from plancc.scan.formats.base import Encoded, Encoding, RowFormat
from plancc.scan.sources.read import Source


class Preference(RowFormat):
    """Rows of a prompt (or none: the implicit prompt) and a chosen and a rejected completion."""

    named = BY_NAME["preference"]
    detected_by = "chosen+rejected"
    sequences: ClassVar[int] = 2
    data_kind: ClassVar[str] = "preference"

    def detects(self, src: Source) -> bool:
        """`chosen` and `rejected` columns."""
        return {"chosen", "rejected"} <= set(src.column_names)

    def needs_template(self, probe: Source) -> bool:
        """Conversations need the chat template; strings do not."""
        return not isinstance(completions.values(probe, "chosen")[0], str) if probe.num_rows else False

    def canonical(self, src: Source, options: ScanOptions) -> pa.Table:
        """`prompt` (the implicit prompt where there is none), `chosen` and `rejected` as strings (conversations as
        JSON), and whether each row is a conversation."""
        completions.check_options(options, self.name)
        chosen, rejected = completions.values(src, "chosen"), completions.values(src, "rejected")
        prompt = completions.values(src, "prompt", optional=True)
        if prompt is None:
            prompt, chosen, rejected = (list(x) for x in zip(*(completions.implicit_prompt(c, r)
                                                              for c, r in zip(chosen, rejected, strict=True)),
                                                           strict=True)) if chosen else ([], [], [])
        conv = np.array([not isinstance(c, str) for c in chosen], dtype=bool)
        for name, vals in (("prompt", prompt), ("rejected", rejected)):
            bad = np.flatnonzero(np.array([not isinstance(v, str) for v in vals], dtype=bool) != conv)
            if bad.size and not (name == "prompt" and vals[bad[0]] == ""):
                raise InputError(f"{src.where(int(bad[0]))}: column '{name}' is "
                                 f"{'messages' if conv[bad[0]] else 'a string'} but 'chosen' is not; a row is all "
                                 "strings or all conversations")
        return pa.table({"prompt": completions.as_column(src, "prompt", prompt),
                         "chosen": completions.as_column(src, "chosen", chosen),
                         "rejected": completions.as_column(src, "rejected", rejected),
                         "conversational": pa.array(conv)})

    def encode(self, table: pa.Table, how: Encoding, row0: int = 0) -> Encoded:
        """Each row's chosen then rejected completion after its prompt (`completions.render`), with their roles."""
        enc = completions.render(table.column("prompt").to_pylist(),
                                 [table.column("chosen").to_pylist(), table.column("rejected").to_pylist()],
                                 np.asarray(table.column("conversational").to_pylist(), dtype=bool), how, row0)
        enc.attributes[PAIR_ROLE_COLUMN] = np.tile(np.array(PAIR_ROLES, dtype=object), table.num_rows)
        return enc

    def trained(self, options: ScanOptions, *, generation: bool = False) -> str:
        """Always the completions (with their end token), never the prompt."""
        return "the chosen and the rejected completion, each with its end token; the prompt never"


FORMAT = Preference()

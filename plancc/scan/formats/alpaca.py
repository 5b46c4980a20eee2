"""`alpaca`: an instruction, an optional input and the output to learn, joined by the Alpaca prompt (Axolotl's
`type: alpaca`).

    {"instruction": "Add.", "input": "2+2", "output": "4"}
        ->  "Below is an instruction ... ### Instruction:\\nAdd.\\n\\n### Input:\\n2+2\\n\\n### Response:\\n" | "4" eos

The prompt is never supervised unless `train_on_inputs`; a row with an empty (or missing, or null) input takes
the no-input prompt. `--prompt-format` (with `{instruction}` and `{input}`) and `--no-input-format` (with
`{instruction}`) replace the built-in prompts: the rows are then prompts and completions (`prompt_completion`).
"""

from __future__ import annotations

from typing import Any, ClassVar

import pyarrow as pa

from plancc.config.formats import BY_NAME
from plancc.config.settings import ScanOptions
from plancc.scan.formats import columns, prompt_completion, tokens
from plancc.scan.formats.base import Encoded, Encoding, RowFormat
from plancc.scan.sources.read import Source

ALPACA_WITH_INPUT = (
    "Below is an instruction that describes a task, paired with an input that provides further context. "
    "Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n"
)
ALPACA_NO_INPUT = (
    "Below is an instruction that describes a task. Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n### Response:\n"
)
BUILTIN = "alpaca (built-in)"  # how the scan record names the built-in prompts


def alpaca_prompts(table: pa.Table, with_input: str = ALPACA_WITH_INPUT, no_input: str = ALPACA_NO_INPUT
                   ) -> list[str]:
    """Each alpaca row's prompt: `with_input` filled with its instruction and input, `no_input` when the input is
    empty."""
    return [(with_input if inp else no_input).format(instruction=ins, input=inp)
            for ins, inp in zip(table.column("instruction").to_pylist(), table.column("input").to_pylist(),
                                strict=True)]


class Alpaca(RowFormat):
    """Rows of instruction, input and output."""

    named = BY_NAME["alpaca"]
    detected_by = "instruction+input+output"
    shaping: ClassVar[tuple[str, ...]] = ("prompt_format", "no_input_format")

    def detects(self, src: Source) -> bool:
        """`instruction` and `output` columns (`input` is optional)."""
        return {"instruction", "output"} <= set(src.column_names)

    def canonical(self, src: Source, options: ScanOptions) -> pa.Table:
        """`instruction` and `output` as strings, `input` as strings with "" for a null or a missing column."""
        columns.require(src, self.name, ("instruction", "output"))
        out = {name: columns.string_column(src, name) for name in ("instruction", "output")}
        out["input"] = (columns.string_column(src, "input", allow_null=True) if "input" in src.column_names
                        else pa.array([""] * src.num_rows, pa.string()))
        return pa.table(out)

    def shape(self, table: pa.Table, options: ScanOptions) -> tuple[pa.Table, RowFormat]:
        """Rows with their own prompt formats become prompts and completions."""
        if not (options.prompt_format or options.no_input_format):
            return table, self
        with_input = options.prompt_format or ALPACA_WITH_INPUT
        no_input = options.no_input_format or options.prompt_format or ALPACA_NO_INPUT
        prompts = pa.array(alpaca_prompts(table, with_input, no_input), pa.large_string())
        return prompt_completion.FORMAT.shape(pa.table({"prompt": prompts, "completion": table.column("output")}),
                                              options)

    def text_format(self, options: ScanOptions) -> dict[str, Any]:
        """The two prompts, by name when built in."""
        return {"prompt_format": options.prompt_format or BUILTIN,
                "no_input_format": options.no_input_format or options.prompt_format or BUILTIN}

    def encode(self, table: pa.Table, how: Encoding, row0: int = 0) -> Encoded:
        """Each row's Alpaca prompt, then its output and eos."""
        return tokens.pairs(alpaca_prompts(table), table.column("output").to_pylist(), how)

    def trained(self, options: ScanOptions, *, generation: bool = False) -> str:
        """As prompts and completions: `train_on_inputs` and `train_on_eos`."""
        return prompt_completion.FORMAT.trained(options)


FORMAT = Alpaca()

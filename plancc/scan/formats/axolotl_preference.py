"""`axolotl_preference`: preference pairs as Axolotl 0.19.0 trains them with `rl: dpo` or `ipo` and
`type: chat_template.default`: a conversation (`messages`, the prompt) and a chosen and a rejected reply.

Axolotl's strategy turns each row into three strings with the chat template, and its trainer then treats them as
TRL's string pairs (docs/preference.md, "Axolotl")::

    prompt    render(messages, generation prompt)
    chosen    render([user "[[dummy_message]]", chosen]) from the first occurrence of the reply's content, with
              trailing whitespace stripped (its end-of-turn markup is kept: "4<|eot_id|>")
    sequence  tok(prompt + chosen + eos text unless it ends so), special tokens added (a template that renders
              the bos gets a second one: Axolotl's fix for that is never called by TRL 1.9.0's DPOTrainer); the
              prompt's own tokens masked (the completion starts right after them)

`messages` is a list of messages or one string (a user turn); a reply is a string (an assistant turn), one
message, or a list whose last message is the reply. Messages are read by their `role` and `content`, roles user,
assistant, system and tool: what Axolotl 0.19.0's strategy reads once its DPO dataset schema has dropped any other
mapping (`message_property_mappings`, `roles`); another role is an error, as it is in Axolotl. Axolotl keeps a pair when its prompt's and each reply's tokens
(without special tokens, counted apart) come to at most `sequence_len`, then cuts each sequence to `sequence_len`:
so does this format (`long drop`).
"""

from __future__ import annotations

import json
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa

from plancc.config.formats import BY_NAME
from plancc.config.settings import ScanOptions
from plancc.core.pairs import PAIR_ROLE_COLUMN, PAIR_ROLES
from plancc.errors import InputError
from plancc.scan.formats import columns, completions
from plancc.scan.formats.base import Encoded, Encoding, RowError
from plancc.scan.formats.preference import Preference
from plancc.scan.formats.tokens import heads, token_ids
from plancc.scan.sources.chat import Renderer, TemplateProblem
from plancc.scan.sources.read import Source

DUMMY = {"role": "user", "content": "[[dummy_message]]"}  # the turn Axolotl renders before each reply
ROLES = ("user", "assistant", "system", "tool")
REPLIES = ("chosen", "rejected")


class AxolotlPreference(Preference):
    """A prompt conversation and two replies, rendered as Axolotl's `chat_template.default` DPO strategy does."""

    named = BY_NAME["axolotl_preference"]
    detected_by = "messages+chosen+rejected (--format axolotl_preference)"
    chat: ClassVar[bool] = True

    def detects(self, src: Source) -> bool:
        """Never: its rows look like TRL's implicit-prompt pairs; an Axolotl config or `--format` names it."""
        return False

    def needs_template(self, probe: Source) -> bool:
        """Always: every row is rendered with the chat template."""
        return True

    def canonical(self, src: Source, options: ScanOptions) -> pa.Table:
        """`messages` (the prompt), `chosen` and `rejected` (one message each) as JSON, checked."""
        completions.check_options(options, self.name)
        out: dict[str, list[str]] = {}
        for name in ("messages", *REPLIES):
            if name not in src.column_names:
                raise columns.missing(src, self.name, name)
            default = "user" if name == "messages" else "assistant"
            out[name] = [json.dumps(_messages(src, i, name, value, default))
                         for i, value in enumerate(columns.column_values(src, name))]
        return pa.table({name: pa.array(values, pa.large_string()) for name, values in out.items()})

    def encode(self, table: pa.Table, how: Encoding, row0: int = 0) -> Encoded:
        """Axolotl's strings (module docstring) encoded as TRL encodes string pairs, then cut as Axolotl cuts."""
        tok = how.tok
        renderer = Renderer(how.template, tok.bos_token, tok.eos_token, how.options.template_date)
        prompts, replies = [], [[], []]
        for i, row in enumerate(table.to_pylist()):
            try:
                prompts.append(renderer.render(json.loads(row["messages"]), add_generation_prompt=True))
                for j, name in enumerate(REPLIES):
                    replies[j].append(_reply(renderer, json.loads(row[name])[0]))
            except TemplateProblem as exc:
                raise RowError(row0 + i, str(exc)) from None
        enc = completions.render(prompts, replies, np.zeros(len(prompts), dtype=bool), how, row0, prompt_end=True)
        if how.options.long in ("drop", "truncate"):
            enc = _cut(enc, _fits(prompts, replies, how), how.options.sequence_len)
        enc.attributes[PAIR_ROLE_COLUMN] = np.tile(np.array(PAIR_ROLES, dtype=object), table.num_rows)
        return enc

    def trained(self, options: ScanOptions, *, generation: bool = False) -> str:
        """Each reply as Axolotl cuts it, with its markup and the eos; never the prompt."""
        return ("the chosen and the rejected reply (from its content on, its end-of-turn markup and the eos "
                "included); the prompt never")


def _messages(src: Source, row: int, name: str, value: Any, default: str) -> list[dict[str, str]]:
    """A cell as `[{role, content}]`: a string is one `default`-role turn; a reply keeps its last message."""
    if isinstance(value, str):
        return [{"role": default, "content": value}]
    if name != "messages" and isinstance(value, list) and value:
        value = value[-1]
    given = [value] if isinstance(value, dict) and name != "messages" else value
    if not isinstance(given, list) or not given:
        raise InputError(f"{src.where(row)}: column '{name}' is {type(value).__name__}, expected a string or "
                         f"{'a list of messages' if name == 'messages' else 'a message or a list of messages'}")
    out = []
    for j, m in enumerate(given):
        role, content = (m.get("role"), m.get("content")) if isinstance(m, dict) else (None, None)
        if not isinstance(role, str) or not isinstance(content, str):
            raise InputError(f"{src.where(row)}: column '{name}', message {j}: needs string fields 'role' and "
                             "'content'")
        if role not in ROLES:
            raise InputError(f"{src.where(row)}: column '{name}', message {j}: role {role!r} is not one Axolotl's "
                             f"DPO strategy reads ({', '.join(ROLES)}); rename it in the data")
        out.append({"role": role, "content": content})
    return out


def _reply(renderer: Renderer, message: dict[str, str]) -> str:
    """A reply rendered after the dummy user turn, from its content's first occurrence, trailing space stripped."""
    text = renderer.render([DUMMY, message])
    return text[text.find(message["content"]):].rstrip()


def _fits(prompts: list[str], replies: list[list[str]], how: Encoding) -> np.ndarray:
    """Which pairs Axolotl keeps: prompt and reply tokens (no special tokens, counted apart) within
    `sequence_len`, for both replies."""
    tok, limit = how.tok, how.options.sequence_len

    def counts(texts: list[str]) -> np.ndarray:
        return np.diff(token_ids(tok, heads(tok, texts, False, how.keep), False)[1])

    prompt = counts(prompts)
    return np.all([prompt + counts(texts) <= limit for texts in replies], axis=0)


def _cut(enc: Encoded, fits: np.ndarray, limit: int) -> Encoded:
    """The sequences of pairs that `fits` cut to `limit` tokens (TRL's collator keeps a sequence's start); the
    others left whole, for the scan's long policy to drop."""
    lengths = np.diff(enc.offsets)
    cut = np.repeat(fits, 2) & (lengths > limit)
    if not cut.any():
        return enc
    new = np.where(cut, limit, lengths)
    keep = np.arange(enc.ids.shape[0]) - np.repeat(enc.offsets[:-1], lengths) < np.repeat(new, lengths)
    offsets = np.concatenate([[0], np.cumsum(new)]).astype(np.int64)
    return Encoded(enc.ids[keep], enc.labels[keep], offsets, enc.end_only, enc.attributes)


FORMAT = AxolotlPreference()

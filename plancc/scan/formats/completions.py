"""Prompts and completions as TRL's preference trainers render them: what the `preference` and
`unpaired_preference` formats share (docs/preference.md).

A completion's sequence is the prompt followed by the completion, tokenized whole, and its prompt tokens are the
ones the whole shares with the prompt tokenized alone (a template may render a prompt alone differently, or tokens
may merge across the boundary: the completion then starts where the two diverge)::

    strings         prompt alone:  tok(prompt)                    whole: tok(prompt + completion + eos text)
    conversations   prompt alone:  tok(render(prompt, generation prompt), no special tokens)
                    whole:         tok(render(prompt + completion), no special tokens)

    sequence = whole;  prompt tokens = common prefix of (prompt alone, whole);  the rest (completion, its end token
    or end-of-turn markup) supervised

A pair's two completions share one prompt length, the shorter of their two prefixes, as TRL's DPO trainer takes
it. The eos text is appended to a string completion that does not already end with it (`add_eos`).
`implicit_prompt` is TRL's prompt of a row without one: the longest common start of its chosen and rejected
completions (whole messages of conversations, characters of strings, a space before the difference left to the
completions).
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pyarrow as pa

from plancc.config.settings import ScanOptions
from plancc.core.plan_arrays import IGNORE_INDEX
from plancc.errors import InputError, SettingsError
from plancc.scan.formats import columns
from plancc.scan.formats.base import Encoded, Encoding, RowError
from plancc.scan.formats.tokens import blank, heads, token_ids
from plancc.scan.sources.chat import Renderer, TemplateProblem, normalize
from plancc.scan.sources.read import Source

# the what-is-trained settings of SFT data: a preference completion is always trained whole, its prompt never
SFT_ONLY = {"train_on_inputs": False, "train_on_eos": "turn", "roles_to_train": ("assistant",),
            "train_on": "all_turns"}


def check_options(options: ScanOptions, fmt: str) -> None:
    """Refuse an SFT what-is-trained setting on preference data (it would do nothing)."""
    for name, plain in SFT_ONLY.items():
        if getattr(options, name) != plain:
            raise SettingsError(f"{name} does not apply to {fmt} data: a completion is trained whole (its end token "
                                "included) and its prompt never is; leave it unset", name)


def _is_conversation(value: Any) -> bool:
    return isinstance(value, list | dict)


def values(src: Source, name: str, *, optional: bool = False) -> list[Any] | None:
    """Column `name`'s values, each a string or a conversation (a list of messages, or one message), all of one
    kind; None when `optional` and absent. Names the first row that is neither, or of the other kind."""
    if name not in src.column_names:
        if optional:
            return None
        raise columns.missing(src, "preference", name)
    out = columns.column_values(src, name)
    kinds = [isinstance(v, str) or (2 if _is_conversation(v) else 0) for v in out]
    for i, (v, kind) in enumerate(zip(out, kinds, strict=True)):
        if kind == 0:
            raise InputError(f"{src.where(i)}: column '{name}' has {type(v).__name__} value, expected a string or "
                             "a list of messages")
        if kind != kinds[0]:
            raise InputError(f"{src.where(i)}: column '{name}' mixes strings and messages (row 0 is "
                             f"{'a string' if kinds[0] is True else 'messages'}); one kind per column")
    return out


def as_column(src: Source, name: str, vals: list[Any]) -> pa.Array:
    """Values as one string column: messages as JSON (`conversation` reads them back), checked now."""
    if vals and not isinstance(vals[0], str):
        for i, v in enumerate(vals):
            try:
                normalize(v if isinstance(v, list) else [v])
            except TemplateProblem as exc:
                raise InputError(f"{src.where(i)}: column '{name}', {exc}") from None
        return pa.array([json.dumps(v if isinstance(v, list) else [v]) for v in vals], pa.large_string())
    return pa.array(vals, pa.large_string())


def conversation(text: str) -> list[dict[str, Any]]:
    """A canonical column's messages (`as_column`), normalized for the template."""
    return normalize(json.loads(text))


def implicit_prompt(chosen: Any, rejected: Any) -> tuple[Any, Any, Any]:
    """(prompt, chosen, rejected) of a row without a prompt: TRL's implicit prompt (module docstring)."""
    n = min(len(chosen), len(rejected))
    cut = next((i for i in range(n) if chosen[i] != rejected[i]), n - 1 if n else 0)
    if cut > 0 and cut < n and chosen[cut] != rejected[cut] and chosen[cut - 1] == " ":
        cut -= 1
    return chosen[:cut], chosen[cut:], rejected[cut:]


def _common(a_ids: np.ndarray, a_off: np.ndarray, b_ids: np.ndarray, b_off: np.ndarray) -> np.ndarray:
    """Per sequence i of two CSR batches, how many tokens a's sequence i and b's share from their start."""
    size = np.minimum(np.diff(a_off), np.diff(b_off))
    first = np.cumsum(size) - size  # where each sequence's compared tokens start among all of them
    seq = np.repeat(np.arange(size.shape[0]), size)
    within = np.arange(int(size.sum())) - first[seq]
    differ = np.flatnonzero(a_ids[a_off[:-1][seq] + within] != b_ids[b_off[:-1][seq] + within])
    out = size.copy()
    firsts = differ[np.r_[True, seq[differ][1:] != seq[differ][:-1]]] if differ.size else differ
    out[seq[firsts]] = within[firsts]
    return out


def _interleave(parts: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """CSR batches of n sequences each as one batch in row order: sequence i of every part, then sequence i + 1."""
    lengths = np.stack([np.diff(off) for _, off in parts], axis=1).reshape(-1)
    offsets = np.zeros(lengths.shape[0] + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    base = np.cumsum([0, *(ids.shape[0] for ids, _ in parts[:-1])])
    source = np.stack([b + off[:-1] for b, (_, off) in zip(base, parts, strict=True)], axis=1).reshape(-1)
    ids = np.concatenate([ids for ids, _ in parts]) if parts else np.zeros(0, np.int32)
    return ids[np.repeat(source - offsets[:-1], lengths) + np.arange(int(offsets[-1]))].astype(np.int32), offsets


def render(prompts: list[str], completions: list[list[str]], conversational: np.ndarray, how: Encoding,
           row0: int) -> Encoded:
    """Each row's completions (`completions[j][i]`: completion j of row i) as sequences, row by row: the prompt
    and the completion tokenized whole, the prompt tokens (the shorter of the row's common prefixes) masked."""
    tok, options = how.tok, how.options
    k, n = len(completions), len(prompts)
    renderer = Renderer(how.template, tok.bos_token, tok.eos_token, options.template_date) if conversational.any() \
        else None
    eos = tok.eos_token if options.add_eos and tok.eos_id is not None else ""
    alone, whole = [], [[] for _ in range(k)]
    for i in range(n):
        try:
            if conversational[i]:
                prompt = conversation(prompts[i]) if prompts[i] else []
                alone.append(renderer.render(prompt, add_generation_prompt=True))
                for j in range(k):
                    whole[j].append(renderer.render(prompt + conversation(completions[j][i])))
            else:
                alone.append(prompts[i])
                for j in range(k):
                    text = completions[j][i]
                    whole[j].append(prompts[i] + text + (eos if eos and not text.endswith(eos) else ""))
        except TemplateProblem as exc:
            raise RowError(row0 + i, str(exc)) from None
    special = not conversational.all()  # strings get the tokenizer's special tokens, renderings have them
    if conversational.any() and special:
        raise RowError(row0, "rows mix strings and messages")
    p_ids, p_off = token_ids(tok, heads(tok, alone, special, how.keep), special)
    parts = [token_ids(tok, heads(tok, texts, special, how.keep), special) for texts in whole]
    starts = np.min([_common(p_ids, p_off, ids, off) for ids, off in parts], axis=0)  # the pair's shorter prompt
    seq_ids, offsets = _interleave(parts)
    labels = seq_ids.copy()  # a sequence's first `starts` tokens (its row's) are the prompt's
    labels[np.arange(seq_ids.shape[0]) < np.repeat(offsets[:-1] + np.repeat(starts, k), np.diff(offsets))] = IGNORE_INDEX
    empty = np.stack([blank([completions[j][i] if not conversational[i] else _content(completions[j][i])
                             for i in range(n)]) for j in range(k)], axis=1).reshape(-1)
    return Encoded(seq_ids, labels, offsets, empty)


def _content(text: str) -> str:
    """The text of a conversation's messages (what `blank` asks of a completion of messages)."""
    return "".join(m["content"] for m in conversation(text))

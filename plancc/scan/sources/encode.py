"""Tokenize one contiguous batch of canonical rows into flat token and label arrays.

Per-sample Python work is kept to what the tokenizer API forces (one `encode_batch` per text column and reading
`.ids`); joining prompt and completion, appending eos and masking are numpy index arithmetic on flat arrays:

    prompt ids  [p0 p1 p2]      completion ids [c0 c1] + eos
    input_ids   [p0 p1 p2 c0 c1 eos]
    labels      [-100 -100 -100 c0 c1 eos]

Returns `Encoded(ids, labels, offsets, end_only)`: CSR layout, sample i is `ids[offsets[i]:offsets[i+1]]`; `end_only[i]`:
its supervised part is at most the end of a turn (an empty completion or assistant turn trains on EOS alone).

What is trained is read from the scan options under their own names: `train_on_inputs` supervises the prompt
too; `train_on_eos` the appended EOS (`none`: not) or, for chat, the end-of-turn markup after each trained turn's
content (`turn`: every trained turn's, `last`: the last trained turn's only, `all`: every turn's, trained or not);
`roles_to_train` which roles' turns are trained, `train_on` all of them or the conversation's last one only;
`add_eos` whether a non-chat sample ends in the tokenizer's EOS; `template_date` the date a chat template reads.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import chain

import numpy as np
import pyarrow as pa

from plancc.config.settings import ScanOptions
from plancc.core.choices import TrainOn, TrainOnEos
from plancc.scan.sources.chat import Renderer, TemplateProblem, Turn, normalize
from plancc.scan.sources.tokenizer import Tok
from plancc.store.token_store import IGNORE_INDEX

ALPACA_WITH_INPUT = (
    "Below is an instruction that describes a task, paired with an input that provides further context. "
    "Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n"
)
ALPACA_NO_INPUT = (
    "Below is an instruction that describes a task. Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n### Response:\n"
)


def alpaca_prompts(table: pa.Table, with_input: str = ALPACA_WITH_INPUT, no_input: str = ALPACA_NO_INPUT
                   ) -> list[str]:
    """Each alpaca row's prompt: `with_input` filled with its instruction and input, `no_input` when the input is
    empty."""
    return [(with_input if inp else no_input).format(instruction=ins, input=inp)
            for ins, inp in zip(table.column("instruction").to_pylist(), table.column("input").to_pylist(),
                                strict=True)]


CHARS_PER_TOKEN = 16  # first guess at the text `keep` tokens need; doubled where a text is sparser in tokens
MARGIN = 64  # tokens past `keep` that a cut text must still give: a cut changes only the last few before it


class RowError(Exception):
    """A problem with one source row; the caller turns `row` into a file location."""

    def __init__(self, row: int, message: str):
        super().__init__(message)
        self.row = row
        self.message = message


DEFAULTS = ScanOptions()


@dataclass
class Encoded:
    """Tokenized rows as flat int32 ids and labels with int64 row offsets (CSR), and which rows train on an end of
    turn alone (`end_only`)."""

    ids: np.ndarray  # int32, flat
    labels: np.ndarray  # int32, flat, same layout as ids
    offsets: np.ndarray  # int64, n+1
    end_only: np.ndarray | None = None  # bool, n; None: no row is known to be

    def end_only_rows(self) -> np.ndarray:
        """`end_only` as a bool array of one entry a row."""
        return self.end_only if self.end_only is not None else np.zeros(len(self.offsets) - 1, bool)

    def to_table(self, start: int = 0, stop: int | None = None) -> pa.Table:
        """Rows [start, stop) as `input_ids`/`labels` list<int32> columns (int32 offsets: keep slices < 2**31)
        and the bool column `end_only`."""
        stop = len(self.offsets) - 1 if stop is None else stop
        a, b = int(self.offsets[start]), int(self.offsets[stop])
        off = pa.array((self.offsets[start:stop + 1] - a).astype(np.int32), pa.int32())
        return pa.table({
            "input_ids": pa.ListArray.from_arrays(off, pa.array(self.ids[a:b], pa.int32())),
            "labels": pa.ListArray.from_arrays(off, pa.array(self.labels[a:b], pa.int32())),
            "end_only": pa.array(self.end_only_rows()[start:stop], pa.bool_()),
        })

    @staticmethod
    def empty() -> Encoded:
        """No rows: the identity of `concat`."""
        return Encoded(np.zeros(0, np.int32), np.zeros(0, np.int32), np.zeros(1, np.int64))

    @staticmethod
    def concat(parts: list[Encoded]) -> Encoded:
        """The rows of `parts`, in order, as one `Encoded`."""
        if len(parts) == 1:
            return parts[0]
        shifts = np.cumsum([0] + [int(p.offsets[-1]) for p in parts[:-1]])
        offsets = np.concatenate([np.zeros(1, np.int64)] + [p.offsets[1:] + s for p, s in zip(parts, shifts, strict=True)])
        return Encoded(np.concatenate([p.ids for p in parts]), np.concatenate([p.labels for p in parts]), offsets,
                       np.concatenate([p.end_only_rows() for p in parts]))


def _flat(encodings) -> tuple[np.ndarray, np.ndarray]:
    lists = [e.ids for e in encodings]
    lengths = np.fromiter(map(len, lists), dtype=np.int64, count=len(lists))
    offsets = np.zeros(len(lists) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    ids = np.fromiter(chain.from_iterable(lists), dtype=np.int32, count=int(offsets[-1]))
    return ids, offsets


def _append(ids: np.ndarray, offsets: np.ndarray, token: int) -> tuple[np.ndarray, np.ndarray]:
    """Append `token` to every sample."""
    out = np.insert(ids, offsets[1:], np.int32(token))
    return out, offsets + np.arange(len(offsets), dtype=np.int64)


def _join(p_ids, p_off, c_ids, c_off, inputs: bool) -> Encoded:
    """Concatenate prompt i and completion i for every i; labels mask the prompt unless `inputs`."""
    lp, lc = np.diff(p_off), np.diff(c_off)
    offsets = np.zeros(len(lp) + 1, np.int64)
    np.cumsum(lp + lc, out=offsets[1:])
    ids = np.empty(int(offsets[-1]), np.int32)
    p_pos = np.repeat(offsets[:-1] - p_off[:-1], lp) + np.arange(len(p_ids))
    c_pos = np.repeat(offsets[:-1] + lp - c_off[:-1], lc) + np.arange(len(c_ids))
    ids[p_pos] = p_ids
    ids[c_pos] = c_ids
    labels = ids.copy()
    if not inputs:
        labels[p_pos] = IGNORE_INDEX
    return Encoded(ids, labels, offsets)


def _eos_unsupervised(enc: Encoded) -> Encoded:
    """`train_on_eos = none`: the appended EOS (every sample's last token) is not a target."""
    ends = enc.offsets[1:][np.diff(enc.offsets) > 0] - 1
    enc.labels[ends] = IGNORE_INDEX
    return enc


def _blank(texts: list[str]) -> np.ndarray:
    """Which texts are empty or whitespace only."""
    return np.fromiter((not t.strip() for t in texts), dtype=bool, count=len(texts))


def _ids(tok: Tok, texts: list[str], special: bool) -> tuple[np.ndarray, np.ndarray]:
    """Flat ids and offsets of `texts`. The built-in tokenizer's ids are the UTF-8 bytes, read straight into numpy
    unless a text contains special-token markup (`<|`), which the tokenizer itself must split out."""
    if tok.byte_ids and not any("<|" in t for t in texts):
        try:
            data = [t.encode("utf-8") for t in texts]
        except UnicodeEncodeError:
            data = None
        if data is not None:
            offsets = np.zeros(len(data) + 1, np.int64)
            np.cumsum(np.fromiter(map(len, data), dtype=np.int64, count=len(data)), out=offsets[1:])
            return np.frombuffer(b"".join(data), dtype=np.uint8).astype(np.int32), offsets
    fast = getattr(tok.tokenizer, "encode_batch_fast", None)  # no offsets: ids are all we read
    encode = fast if fast is not None else tok.tokenizer.encode_batch
    return _flat(encode(texts, add_special_tokens=special))


def _head(tok: Tok, text: str, special: bool, keep: int) -> str:
    """A prefix of `text` that gives at least `keep + MARGIN` tokens (CHARS_PER_TOKEN characters a token, doubled
    until it does; the whole text where none does): its first `keep` tokens are the whole text's, and tokenizing
    it costs memory by `keep`, not by the text (a long message tokenized whole takes gigabytes: docs/benchmarks.md)."""
    chars = CHARS_PER_TOKEN * (keep + MARGIN)
    while chars < len(text):
        head = text[:chars]
        if len(tok.tokenizer.encode(head, add_special_tokens=special).ids) >= keep + MARGIN:
            return head
        chars *= 2
    return text


def _heads(tok: Tok, texts: list[str], special: bool, keep: int | None) -> list[str]:
    """`texts` with each one too long to matter cut to its `_head` (all of them as they are when `keep` is None)."""
    if keep is None:
        return texts
    chars = CHARS_PER_TOKEN * (keep + MARGIN)
    return [_head(tok, t, special, keep) if len(t) > chars else t for t in texts]


def _pair(tok: Tok, prompts: list[str], completions: list[str], keep: int | None, options: ScanOptions) -> Encoded:
    p_ids, p_off = _ids(tok, _heads(tok, prompts, True, keep), True)
    c_ids, c_off = _ids(tok, _heads(tok, completions, False, keep), False)
    eos = options.add_eos and tok.eos_id is not None
    if eos:
        c_ids, c_off = _append(c_ids, c_off, tok.eos_id)
    enc = _join(p_ids, p_off, c_ids, c_off, options.train_on_inputs)
    if eos and options.train_on_eos == TrainOnEos.NONE:
        enc = _eos_unsupervised(enc)
    enc.end_only = _blank(completions) & (not options.train_on_inputs)
    return enc


def _text(tok: Tok, texts: list[str], keep: int | None, options: ScanOptions) -> Encoded:
    ids, off = _ids(tok, _heads(tok, texts, True, keep), True)
    eos = options.add_eos and tok.eos_id is not None
    if eos:
        ids, off = _append(ids, off, tok.eos_id)
    enc = Encoded(ids, ids.copy(), off, _blank(texts))
    return _eos_unsupervised(enc) if eos and options.train_on_eos == TrainOnEos.NONE else enc


def _chosen(turns: list[Turn], options: ScanOptions) -> list[Turn]:
    """The turns trained: those of `roles_to_train`, or only the last of them (`train_on = last_turn`)."""
    trained = [t for t in turns if t.role in options.roles_to_train]
    return trained[-1:] if options.train_on == TrainOn.LAST_TURN else trained


def _turn_spans(renderer: Renderer, messages: list[dict[str, str]], options: ScanOptions
                ) -> tuple[str, list[tuple[int, int]], bool]:
    """Rendered text, the character spans trained (tokens starting inside one are supervised) and whether the
    trained turns' content is empty (only end-of-turn markup is trained)."""
    eos = options.train_on_eos
    roles = {m["role"] for m in messages} if eos == TrainOnEos.ALL else set(options.roles_to_train)
    text, turns = renderer.turns(messages, roles, split=eos != TrainOnEos.TURN or options.roles_to_train != (
        "assistant",))
    trained = _chosen(turns, options)
    spans = [(t.start, t.content_end) for t in trained]
    ends = {TrainOnEos.TURN: trained, TrainOnEos.LAST: trained[-1:], TrainOnEos.ALL: turns, TrainOnEos.NONE: []}[eos]
    spans += [(t.content_end, t.end) for t in ends]
    empty = all(not messages[t.index]["content"].strip() for t in trained)
    return text, spans, empty


def _tagged_spans(renderer: Renderer, messages: list[dict[str, str]], options: ScanOptions
                  ) -> tuple[str, list[tuple[int, int]], bool]:
    """Rendered text, the `{% generation %}` blocks' spans (tokens overlapping one are supervised) and whether
    the assistant turns they train have empty content."""
    text, spans = renderer.generation_spans(messages)
    replies = [m for m in messages if m["role"] == "assistant" and m.get("training") is not False]
    if options.train_on == TrainOn.LAST_TURN:
        spans, replies = spans[-1:], replies[-1:]
    return text, spans, all(not m["content"].strip() for m in replies)


def _mask(ids: np.ndarray, offsets: np.ndarray, encodings, spans: list, overlap: bool) -> np.ndarray:
    """Labels: each row's tokens that start inside one of its spans (`overlap`: that overlap one) keep their id."""
    labels = np.full(len(ids), IGNORE_INDEX, np.int32)
    for i, (enc, sp) in enumerate(zip(encodings, spans, strict=True)):
        if not sp:
            continue
        if overlap:
            bounds = np.array(enc.offsets, dtype=np.int64).reshape(-1, 2)
            starts, ends = bounds[:, 0], bounds[:, 1]
        else:
            starts = np.fromiter((s for s, _ in enc.offsets), dtype=np.int64, count=len(enc))
        chosen = np.zeros(len(starts), bool)
        for a, b in sp:
            chosen |= (starts < b) & (ends > a) if overlap else (starts >= a) & (starts < b)
        o = offsets[i]
        seg = ids[o:o + len(starts)]
        labels[o:o + len(starts)][chosen] = seg[chosen]
    return labels


def _messages(tok: Tok, template: str, conversations: list, row0: int, keep: int | None,
              options: ScanOptions) -> Encoded:
    renderer = Renderer(template, tok.bos_token, tok.eos_token, options.template_date)
    locate = _tagged_spans if renderer.tagged else _turn_spans
    texts, spans, empty = [], [], []
    for i, conv in enumerate(conversations):
        try:
            messages = normalize(conv)
        except TemplateProblem as exc:
            raise RowError(row0 + i, f"column 'messages', {exc}") from None
        try:
            text, sp, blank = locate(renderer, messages, options)
        except TemplateProblem as exc:
            raise RowError(row0 + i, str(exc)) from None
        texts.append(text)
        spans.append(sp)
        empty.append(blank)
    texts = _heads(tok, texts, False, keep)  # spans past a cut select no token
    encodings = tok.tokenizer.encode_batch(texts, add_special_tokens=False)
    ids, offsets = _flat(encodings)
    labels = _mask(ids, offsets, encodings, spans, renderer.tagged)
    return Encoded(ids, labels, offsets, np.array(empty, dtype=bool))


def encode_table(table: pa.Table, fmt: str, tok: Tok, options: ScanOptions = DEFAULTS, *, row0: int = 0,
                 template: str | None = None, keep: int | None = None) -> Encoded:
    """Encode canonical rows (see detect.canonical) of one format; `row0` is the global index of the first row;
    `template` is the chat template's text (messages only); `options` say what is trained (the module docstring)
    and whether an EOS is appended. `keep`: only a row's first
    `keep` tokens matter (its longer tail is truncated or the row dropped), so a row far longer is tokenized from a
    cut of its text: its first `keep` tokens and labels are exact, and it still has more than `keep`, but not all,
    of its tokens."""
    if fmt == "text":
        return _text(tok, table.column("text").to_pylist(), keep, options)
    if fmt == "prompt_completion":
        return _pair(tok, table.column("prompt").to_pylist(), table.column("completion").to_pylist(), keep, options)
    if fmt == "alpaca":
        return _pair(tok, alpaca_prompts(table), table.column("output").to_pylist(), keep, options)
    if fmt == "messages":
        if template is None:
            raise ValueError("messages need a chat template")
        return _messages(tok, template, table.column("messages").to_pylist(), row0, keep, options)
    raise ValueError(f"no encoder for format {fmt}")

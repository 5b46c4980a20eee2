"""Text to flat token and label arrays: the kernels the text formats share.

Per-sample Python work is kept to what the tokenizer API forces (one `encode_batch` per text column and reading
`.ids`); joining prompt and completion, appending eos and masking are numpy index arithmetic on flat arrays:

    prompt ids  [p0 p1 p2]      completion ids [c0 c1] + eos
    input_ids   [p0 p1 p2 c0 c1 eos]
    labels      [-100 -100 -100 c0 c1 eos]

Results are `Encoded(ids, labels, offsets, end_only)`: CSR layout, sample i is `ids[offsets[i]:offsets[i+1]]`;
`end_only[i]`: its supervised part is at most the end of a turn (an empty completion or assistant turn trains on
EOS alone).

What is trained is read from the scan options under their own names: `train_on_inputs` supervises the prompt
too; `train_on_eos` the appended EOS (`none`: not) or, for chat, the end-of-turn markup after each trained turn's
content (`turn`: every trained turn's, `last`: the last trained turn's only, `all`: every turn's, trained or not;
`formats.messages`); `add_eos` whether a non-chat sample ends in the tokenizer's EOS.
"""

from __future__ import annotations

import functools
import re
from itertools import accumulate, chain

import numpy as np

from plancc.core.plan_arrays import IGNORE_INDEX
from plancc.scan.formats.base import Encoded, Encoding
from plancc.scan.sources.tokenizer import Tok

CHARS_PER_TOKEN = 16  # first guess at the text `keep` tokens need; doubled where a text is sparser in tokens
MARGIN = 64  # tokens past `keep` that a cut text must still give: a cut changes only the last few before it


def flat(encodings) -> tuple[np.ndarray, np.ndarray]:
    """Flat int32 ids and int64 offsets of a batch of tokenizer encodings."""
    lists = [e.ids for e in encodings]
    lengths = np.fromiter(map(len, lists), dtype=np.int64, count=len(lists))
    offsets = np.zeros(len(lists) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    ids = np.fromiter(chain.from_iterable(lists), dtype=np.int32, count=int(offsets[-1]))
    return ids, offsets


def _append(ids: np.ndarray, offsets: np.ndarray, token: int) -> tuple[np.ndarray, np.ndarray]:
    """Append `token` to every sample that does not already end in it (a text that ends in the eos gets no second
    one, as Axolotl and TRL give none)."""
    lengths = np.diff(offsets)
    last = ids[np.maximum(offsets[1:] - 1, 0)] if len(ids) else np.zeros(len(lengths), np.int32)
    add = ~((lengths > 0) & (last == token))
    out = np.insert(ids, offsets[1:][add], np.int32(token))
    shifts = np.zeros(len(offsets), np.int64)
    np.cumsum(add, out=shifts[1:])
    return out, offsets + shifts


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


def blank(texts: list[str]) -> np.ndarray:
    """Which texts are empty or whitespace only."""
    return np.fromiter((not t.strip() for t in texts), dtype=bool, count=len(texts))


def token_ids(tok: Tok, texts: list[str], special: bool) -> tuple[np.ndarray, np.ndarray]:
    """Flat ids and offsets of `texts`. The built-in tokenizer's ids are read straight into numpy (`_byte_ids`);
    any other tokenizer, or added tokens it cannot split out as the tokenizer does, runs the tokenizer."""
    found = _byte_ids(tok, texts) if tok.byte_ids else None
    if found is not None:
        return found
    fast = getattr(tok.tokenizer, "encode_batch_fast", None)  # no offsets: ids are all we read
    encode = fast if fast is not None else tok.tokenizer.encode_batch
    return flat(encode(texts, add_special_tokens=special))


def _byte_ids(tok: Tok, texts: list[str]) -> tuple[np.ndarray, np.ndarray] | None:
    """The built-in tokenizer's ids without running it: a text's UTF-8 bytes, each added token in it (special-token
    markup such as the eos a preference completion ends with) its own id, matched leftmost-longest as the tokenizer
    matches them. None where that is not the tokenizer's result (`_added_tokens`) or a text is not valid UTF-8."""
    added = _added_tokens(tok)
    if added is None:
        return None
    pattern, id_of = added
    try:
        data = [t.encode("utf-8") for t in texts]
    except UnicodeEncodeError:
        return None
    # a text holding added tokens: its bytes without them, and where (text, byte in it) each one goes with its id
    where_text, where_byte, token_ids_ = [], [], []
    added_count = np.zeros(len(texts), np.int64)
    for i in [] if pattern is None else [i for i, t in enumerate(texts) if pattern.search(t)]:
        pieces = pattern.split(texts[i])  # text, token, text, ..., text (the pattern's group keeps the tokens)
        raw = [p.encode("utf-8") for p in pieces[0::2]]
        data[i] = b"".join(raw)
        where_byte.extend(accumulate(map(len, raw[:-1])))
        token_ids_.extend(id_of[t] for t in pieces[1::2])
        where_text.extend([i] * (len(raw) - 1))
        added_count[i] = len(raw) - 1
    byte_offsets = np.zeros(len(data) + 1, np.int64)
    np.cumsum(np.fromiter(map(len, data), dtype=np.int64, count=len(data)), out=byte_offsets[1:])
    ids = np.frombuffer(b"".join(data), dtype=np.uint8).astype(np.int32)
    if not token_ids_:
        return ids, byte_offsets
    at = byte_offsets[np.asarray(where_text, np.int64)] + np.asarray(where_byte, np.int64)
    offsets = byte_offsets.copy()
    np.cumsum(added_count, out=added_count)
    offsets[1:] += added_count
    return np.insert(ids, at, np.asarray(token_ids_, np.int32)), offsets


@functools.lru_cache(maxsize=8)
def _added_tokens(tok: Tok) -> tuple[re.Pattern | None, dict[str, int]] | None:
    """(a pattern matching the tokenizer's added tokens, longest first, or None without any; each one's id), or
    None where the tokenizer would not split them out plainly: an added token that strips the space beside it,
    matches whole words only or is matched after normalizing."""
    tokens = tok.tokenizer.get_added_tokens_decoder()
    if any(t.lstrip or t.rstrip or t.single_word or t.normalized for t in tokens.values()):
        return None
    id_of = {t.content: i for i, t in tokens.items()}
    if not id_of:
        return None, id_of
    return re.compile("(" + "|".join(re.escape(c) for c in sorted(id_of, key=len, reverse=True)) + ")"), id_of


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


def heads(tok: Tok, texts: list[str], special: bool, keep: int | None) -> list[str]:
    """`texts` with each one too long to matter cut to its `_head` (all of them as they are when `keep` is None)."""
    if keep is None:
        return texts
    chars = CHARS_PER_TOKEN * (keep + MARGIN)
    return [_head(tok, t, special, keep) if len(t) > chars else t for t in texts]


def pairs(prompts: list[str], completions: list[str], how: Encoding) -> Encoded:
    """Each prompt then its completion (and eos, `add_eos`), tokenized apart: the prompt with the tokenizer's
    special tokens (bos), the completion without; the prompt supervised only with `train_on_inputs`."""
    tok, keep, options = how.tok, how.keep, how.options
    p_ids, p_off = token_ids(tok, heads(tok, prompts, True, keep), True)
    c_ids, c_off = token_ids(tok, heads(tok, completions, False, keep), False)
    eos = options.add_eos and tok.eos_id is not None
    if eos:
        c_ids, c_off = _append(c_ids, c_off, tok.eos_id)
    enc = _join(p_ids, p_off, c_ids, c_off, options.train_on_inputs)
    if eos and options.train_on_eos == "none":
        enc = _eos_unsupervised(enc)
    enc.end_only = blank(completions) & (not options.train_on_inputs)
    return enc


def whole_texts(values: list[str], how: Encoding) -> Encoded:
    """Each text whole (and eos, `add_eos`), every token supervised (the eos unless `train_on_eos none`)."""
    tok = how.tok
    ids, off = token_ids(tok, heads(tok, values, True, how.keep), True)
    eos = how.options.add_eos and tok.eos_id is not None
    if eos:
        ids, off = _append(ids, off, tok.eos_id)
    enc = Encoded(ids, ids.copy(), off, blank(values))
    return _eos_unsupervised(enc) if eos and how.options.train_on_eos == "none" else enc

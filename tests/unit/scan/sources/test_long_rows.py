"""Rows far longer than --sequence-len under --long truncate/drop are tokenized from a cut of their text, so that a
scan's memory follows sequence_len instead of the longest raw text (a 20 MB message took 142 s and 5.7 GB). The
cut must not change a token that is kept: for every format and both real tokenizers, a long row's first
`sequence_len` tokens and labels are exactly what tokenizing the whole text gives, it still counts as longer than
`sequence_len`, and a row under the bound is encoded exactly as before."""

from __future__ import annotations

import random

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from plancc.config.settings import ScanOptions
from plancc.scan import formats
from plancc.scan.formats import Encoding
from plancc.scan.formats.tokens import CHARS_PER_TOKEN, MARGIN
from plancc.scan.sources.chat import normalize
from plancc.scan.sources.templates import BUILTIN_TEMPLATES
from plancc.scan.sources.tokenizer import load_tokenizer
from tests.support.sources import DEEPSEEK_JSON, chatterbot_conversations

KEEP = 40
BOUND = CHARS_PER_TOKEN * (KEEP + MARGIN)  # texts longer than this are cut


def _texts() -> list[str]:
    """Real conversation text, and texts sparse or dense in tokens, from shorter than the bound to 20x longer."""
    corpus = " ".join(m["content"] for conv in chatterbot_conversations(200, system=False) for m in conv)
    rng = random.Random(7)
    out = []
    for length in (BOUND // 2, BOUND - 1, BOUND + 1, 3 * BOUND, 20 * BOUND):
        start = rng.randrange(0, len(corpus) - length) if len(corpus) > length else 0
        out.append((corpus * (1 + length // len(corpus)))[start:start + length])
    out += [" " * (5 * BOUND) + "end",  # whitespace runs: few tokens per character, the cut must grow
            "\n\n" * BOUND + "x",
            "深度学习模型的训练数据" * (BOUND // 3),  # several tokens per character
            "🙂🚀 a1b2 " * BOUND,
            "x" * (3 * BOUND)]
    return out


def _check(whole, cut, n: int) -> None:
    for i in range(n):
        w = slice(whole.offsets[i], whole.offsets[i + 1])
        c = slice(cut.offsets[i], cut.offsets[i + 1])
        if whole.offsets[i + 1] - whole.offsets[i] <= KEEP:
            assert np.array_equal(whole.ids[w], cut.ids[c]) and np.array_equal(whole.labels[w], cut.labels[c]), i
            continue
        assert cut.offsets[i + 1] - cut.offsets[i] > KEEP, i  # still over: truncated or dropped as before
        head = slice(cut.offsets[i], cut.offsets[i] + KEEP)
        whole_head = slice(whole.offsets[i], whole.offsets[i] + KEEP)
        assert np.array_equal(whole.ids[whole_head], cut.ids[head]), i
        assert np.array_equal(whole.labels[whole_head], cut.labels[head]), i


def _table(fmt: str, texts: list[str]) -> pa.Table:
    short = [t[:30] for t in texts]
    if fmt == "text":
        return pa.table({"text": texts})
    if fmt == "prompt_completion":  # long prompts (all masked), then long completions after short prompts
        return pa.table({"prompt": texts + short, "completion": short + texts})
    if fmt == "alpaca":
        return pa.table({"instruction": short + texts, "input": texts + short, "output": short + texts})
    conversations = [normalize([{"role": "user", "content": s}, {"role": "assistant", "content": t}])
                     for s, t in zip(short, texts, strict=True)]
    conversations += [normalize([{"role": "user", "content": t}, {"role": "assistant", "content": s}])
                      for s, t in zip(short, texts, strict=True)]
    return pa.table({"messages": pa.array(conversations)})


def _encode(table: pa.Table, fmt: str, tok, keep: int | None, template: str | None = None):
    """`table` encoded as `fmt`, tokenizing only what the first `keep` tokens need (None: every text whole)."""
    options = ScanOptions(sequence_len=keep, long="truncate") if keep is not None else ScanOptions(long="error")
    return formats.get(fmt).encode(table, Encoding(tok, options, template))


@pytest.mark.parametrize("tokenizer", ["builtin", str(DEEPSEEK_JSON)])
@pytest.mark.parametrize("fmt", ["text", "prompt_completion", "alpaca", "messages"])
def test_a_cut_long_row_keeps_exactly_the_tokens_the_whole_text_gives(tokenizer, fmt):
    tok = load_tokenizer(tokenizer)
    table = _table(fmt, _texts())
    template = BUILTIN_TEMPLATES["chatml"] if fmt == "messages" else None
    whole = _encode(table, fmt, tok, None, template)
    cut = _encode(table, fmt, tok, KEEP, template)
    lengths = np.diff(cut.offsets)
    assert (np.diff(whole.offsets) > KEEP).sum() >= len(lengths) // 2  # most rows are long: the test tests cuts
    assert lengths.max() < np.diff(whole.offsets).max()  # and some were cut
    _check(whole, cut, table.num_rows)


_PIECES = ["the ", "model", " ", "   ", "\n", "\t", "深度", "学习", "🙂", "1234", "5", ".", ", ", "don't", "<|im_start|>",
           "<｜User｜>", "ü", "e\u0301", "https://x.org/a?b=c", "{\"a\": [1]}", "supercalifragilistic"]


@given(st.lists(st.sampled_from(_PIECES), min_size=1, max_size=40), st.integers(1, 400))
@settings(max_examples=60, deadline=None)
def test_any_cut_text_keeps_the_whole_texts_first_tokens(pieces, repeat):
    """Texts of any mix of words, whitespace runs, CJK, emoji, combining marks and special-token markup."""
    tok = load_tokenizer(str(DEEPSEEK_JSON))
    text = "".join(pieces) * repeat
    for fmt, table in (("text", pa.table({"text": [text]})),
                       ("prompt_completion", pa.table({"prompt": ["q"], "completion": [text]}))):
        whole = _encode(table, fmt, tok, None)
        cut = _encode(table, fmt, tok, KEEP)
        _check(whole, cut, 1)

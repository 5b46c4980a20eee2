"""Formats (auto-detected and forced), label semantics per shift mode, long-sample policies, drops, tokenizer checks."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from plancc.config.settings import ScanOptions
from plancc.errors import InputError
from plancc.scan.formats.alpaca import ALPACA_NO_INPUT, ALPACA_WITH_INPUT
from plancc.scan.scanner import scan
from plancc.scan.sources.tokenizer import load_tokenizer, with_tokens
from plancc.store import token_store
from tests.support.sources import DEEPSEEK_JSON, alpaca_rows, pc_rows, write_rows

TOK = load_tokenizer("builtin")
EOS = TOK.eos_id


def _scan(tmp_path, source, **kw):
    return scan(str(source), ScanOptions(**{"tokenizer": "builtin", "chat_template": "chatml", **kw}), cache_dir=Path(tmp_path) / "cache")


def _tokenized(result):
    return token_store.to_table(result.tokenized_path).to_pylist()


def _enc(text, special=True):
    return TOK.tokenizer.encode(text, add_special_tokens=special).ids


@pytest.mark.parametrize(
    ("row", "fmt"),
    [
        ({"input_ids": [1, 2, 3]}, "tokenized"),
        ({"prompt": "p", "completion": "c"}, "prompt_completion"),
        ({"instruction": "i", "input": "", "output": "o"}, "alpaca"),
        ({"messages": [{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}]}, "messages"),
        ({"conversations": [{"from": "human", "value": "u"}, {"from": "gpt", "value": "a"}]}, "messages"),
        ({"text": "hello"}, "text"),
    ],
)
def test_auto_detect(tmp_path, row, fmt):
    assert _scan(tmp_path, write_rows(tmp_path / "d.jsonl", [row])).report.to_json()["format"] == fmt


def test_format_override(tmp_path):
    p = write_rows(tmp_path / "d.jsonl", [{"prompt": "ab", "completion": "cd", "text": "hello world"}])
    auto = _scan(tmp_path, p)
    forced = _scan(tmp_path, p, format="text")
    assert auto.report.to_json()["format"] == "prompt_completion" and forced.report.to_json()["format"] == "text"
    assert _tokenized(forced)[0]["input_ids"] == [*_enc("hello world"), EOS]


def test_prompt_completion_masks_prompt(tmp_path):
    rows = pc_rows(5)
    result = _scan(tmp_path, write_rows(tmp_path / "d.jsonl", rows))
    for row, tok in zip(rows, _tokenized(result), strict=True):
        p, c = _enc(row["prompt"]), [*_enc(row["completion"], False), EOS]
        assert tok["input_ids"] == p + c
        assert tok["labels"] == [-100] * len(p) + c
    no_eos = _scan(tmp_path, write_rows(tmp_path / "d.jsonl", rows), add_eos=False)
    assert _tokenized(no_eos)[0]["input_ids"] == _enc(rows[0]["prompt"]) + _enc(rows[0]["completion"], False)


def test_alpaca_template_with_and_without_input(tmp_path):
    rows = alpaca_rows(4)
    result = _scan(tmp_path, write_rows(tmp_path / "d.json", rows))
    for row, tok in zip(rows, _tokenized(result), strict=True):
        template = ALPACA_WITH_INPUT if row["input"] else ALPACA_NO_INPUT
        prompt = _enc(template.format(**row))
        assert tok["input_ids"] == prompt + _enc(row["output"], False) + [EOS]
        assert tok["labels"][: len(prompt)] == [-100] * len(prompt)
    assert "### Input:" in TOK.tokenizer.decode(_tokenized(result)[0]["input_ids"])
    assert "### Input:" not in TOK.tokenizer.decode(_tokenized(result)[1]["input_ids"])


def test_alpaca_without_input_column(tmp_path):
    rows = [{"instruction": "say hi", "output": "hi"}]
    result = _scan(tmp_path, write_rows(tmp_path / "d.jsonl", rows), format="alpaca")
    assert _tokenized(result)[0]["input_ids"][:-3] == _enc(ALPACA_NO_INPUT.format(instruction="say hi"))


def test_text_all_supervised(tmp_path):
    result = _scan(tmp_path, write_rows(tmp_path / "d.jsonl", [{"text": "héllo wörld"}]))
    tok = _tokenized(result)[0]
    assert tok["input_ids"] == tok["labels"] == [*_enc("héllo wörld"), EOS]
    assert TOK.tokenizer.decode(tok["input_ids"][:-1]) == "héllo wörld"
    s = result.samples.to_pylist()[0]
    assert s["label_count"] == s["length"] and s["first_label_supervised"]


def test_tokenized_source_is_converted_once_into_a_token_store(tmp_path):
    p = write_rows(tmp_path / "t.parquet", [{"input_ids": [5, 6, 7]}, {"input_ids": [8, 9]}])
    result = _scan(tmp_path, p)
    assert result.source_paths == [str(p)]
    assert _tokenized(result) == [{"input_ids": [5, 6, 7], "labels": [5, 6, 7]}, {"input_ids": [8, 9], "labels": [8, 9]}]
    assert result.samples.column("label_count").to_pylist() == [3, 2]


def test_tokenized_truncation_writes_tokens(tmp_path):
    p = write_rows(tmp_path / "t.parquet", [{"input_ids": list(range(10)), "labels": list(range(10))}])
    result = _scan(tmp_path, p, sequence_len=4, long="truncate")
    assert _tokenized(result) == [{"input_ids": [0, 1, 2, 3], "labels": [0, 1, 2, 3]}]


def test_shift_none_needs_shift_labels(tmp_path):
    p = write_rows(tmp_path / "t.jsonl", [{"input_ids": [1, 2], "labels": [1, 2]}])
    with pytest.raises(InputError, match=r"t\.jsonl row 0.*shift_labels"):
        _scan(tmp_path, p, shift="none")


def test_shift_none_text_source_labels_are_shifted(tmp_path):
    result = _scan(tmp_path, write_rows(tmp_path / "d.jsonl", [{"text": "abc"}]), shift="none")
    tok = _tokenized(result)[0]
    assert tok["labels"] == [*tok["input_ids"][1:], -100]
    s = result.samples.to_pylist()[0]
    assert s["label_count"] == s["length"] - 1 and not s["first_label_supervised"]


def test_labels_length_mismatch(tmp_path):
    p = write_rows(tmp_path / "t.jsonl", [{"input_ids": [1, 2], "labels": [1, 2]}, {"input_ids": [1], "labels": [1, 2]}])
    with pytest.raises(InputError, match=r"t\.jsonl row 1 \(line 2\): column 'labels' has 2 values"):
        _scan(tmp_path, p)


def test_mismatched_tokenizer(tmp_path):
    p = write_rows(tmp_path / "t.jsonl", [{"input_ids": [1, 2]}, {"input_ids": [3, 300]}])
    with pytest.raises(InputError, match=r"t\.jsonl row 1 \(line 2\): column 'input_ids' has token id 300"):
        scan(str(p), ScanOptions(tokenizer=str(_builtin_json(tmp_path))), cache_dir=tmp_path / "c")
    big = write_rows(tmp_path / "big.jsonl", [{"input_ids": [1, 200_000]}])
    with pytest.raises(InputError, match=r"big\.jsonl row 0.*200000.*wrong --tokenizer"):
        scan(str(big), ScanOptions(tokenizer=str(DEEPSEEK_JSON)), cache_dir=tmp_path / "c")


def _builtin_json(tmp_path) -> Path:
    path = tmp_path / "byte.json"
    TOK.tokenizer.save(str(path))
    return path


def test_long_policies(tmp_path):
    rows = [{"text": "a" * n} for n in (3, 20, 5, 30)]
    p = write_rows(tmp_path / "d.jsonl", rows)
    drop = _scan(tmp_path, p, sequence_len=10, max_dropped=0.5)
    assert drop.samples.column("sample_id").to_pylist() == [0, 2]
    assert drop.report.to_json()["dropped_long"] == {"count": 2, "first_rows": [1, 3]}
    assert (drop.report.to_json()["dropped_samples"], drop.report.to_json()["truncated_samples"]) == (2, 0)
    trunc = _scan(tmp_path, p, sequence_len=10, long="truncate")
    assert trunc.samples.column("length").to_pylist() == [4, 10, 6, 10]
    assert trunc.report.to_json()["truncated"]["count"] == 2
    assert (trunc.report.to_json()["dropped_samples"], trunc.report.to_json()["truncated_samples"]) == (0, 2)
    assert [len(r["input_ids"]) for r in _tokenized(trunc)] == [4, 10, 6, 10]
    with pytest.raises(InputError, match=r"d\.jsonl row 1 \(line 2\): sample has 21 tokens, more than --sequence-len 10"):
        _scan(tmp_path, p, sequence_len=10, long="error")


def test_all_masked_samples_dropped_and_reported(tmp_path):
    rows = [{"prompt": "p", "completion": "c" if i % 2 else ""} for i in range(6)]
    p = write_rows(tmp_path / "d.jsonl", rows)
    result = _scan(tmp_path, p, add_eos=False, max_dropped=0.5)
    assert result.samples.column("sample_id").to_pylist() == [1, 3, 5]
    assert result.report.to_json()["dropped_all_masked"] == {"count": 3, "first_rows": [0, 2, 4]}
    # a sample whose only label is its first token has no target after the sample shift
    t = write_rows(tmp_path / "t.jsonl", [{"input_ids": [1, 2], "labels": [1, -100]}, {"input_ids": [1, 2], "labels": [1, 2]}])
    assert _scan(tmp_path, t, max_dropped=0.5).samples.column("sample_id").to_pylist() == [1]


def test_nothing_supervised_is_an_error(tmp_path):
    p = write_rows(tmp_path / "d.jsonl", [{"prompt": "p", "completion": ""}] * 3)
    with pytest.raises(InputError, match=r"d\.jsonl: no supervised samples: of 3 rows, 3 have no supervised target"):
        _scan(tmp_path, p, add_eos=False)


row_strategy = st.lists(
    st.lists(st.tuples(st.integers(0, 255), st.booleans()), min_size=1, max_size=12), min_size=1, max_size=8
)


@given(rows=row_strategy, shift=st.sampled_from(["sample", "row", "none"]))
def test_label_counts_equal_direct_count(rows, shift):
    data = [{"input_ids": [t for t, _ in r], "labels": [t if s else -100 for t, s in r],
             "shift_labels": [t if s else -100 for t, s in r]} for r in rows]
    col = "shift_labels" if shift == "none" else "labels"
    effective = [sum(x != -100 for x in d[col]) - (shift != "none" and d[col][0] != -100) for d in data]
    with tempfile.TemporaryDirectory() as tmp:
        p = write_rows(Path(tmp) / "t.parquet", data)
        if not any(e > 0 for e in effective):
            with pytest.raises(InputError, match="no supervised samples"):
                _scan(tmp, p, shift=shift)
            return
        result = _scan(tmp, p, shift=shift, max_dropped=1)
    kept = [i for i, e in enumerate(effective) if e > 0]
    assert result.samples.column("sample_id").to_pylist() == kept
    assert result.samples.column("label_count").to_pylist() == [sum(x != -100 for x in data[i][col]) for i in kept]
    assert result.samples.column("first_label_supervised").to_pylist() == [
        shift != "none" and data[i][col][0] != -100 for i in kept]
    assert result.samples.column("length").to_pylist() == [len(data[i]["input_ids"]) for i in kept]


def test_label_counts_text_sources_each_shift(tmp_path):
    rows = pc_rows(8)
    for shift in ("sample", "row", "none"):
        result = _scan(tmp_path, write_rows(tmp_path / "d.jsonl", rows), shift=shift)
        labels = [np.array(r["labels"]) for r in _tokenized(result)]
        ids = result.samples.column("sample_id").to_pylist()
        assert result.samples.column("label_count").to_pylist() == [int((labels[i] != -100).sum()) for i in ids]


@given(texts=st.lists(st.text(max_size=30), min_size=1, max_size=6))
def test_builtin_byte_fast_path_equals_tokenizer(texts):
    from plancc.scan.formats.tokens import token_ids

    ids, offsets = token_ids(TOK, texts, True)
    expected = [TOK.tokenizer.encode(t).ids for t in texts]
    assert [ids[offsets[i]:offsets[i + 1]].tolist() for i in range(len(texts))] == expected


ADDED = with_tokens(TOK, (("eos_token", "</s>"),), ("[X]", "<|im"), ("<|eos|>x",))  # prefixes of other tokens too
MARKUP = st.sampled_from(["<|eos|>", "<|im_start|>", "<|im_end|>", "<|bos|>", "</s>", "[X]", "<|im", "<|eos|>x",
                          "<|", "[X", "</", "x"])


@given(pieces=st.lists(st.lists(st.one_of(st.text(max_size=8), MARKUP), max_size=6), min_size=1, max_size=5),
       added=st.booleans())
@example(pieces=[["a", "[X]", "b"], ["c", "</s>"]], added=True)  # added tokens without `<|` markup
def test_builtin_byte_fast_path_splits_added_tokens_as_the_tokenizer_does(pieces, added):
    """Texts holding special-token markup (a preference completion ends with the eos text) or added tokens, even
    ones that are a prefix of another: the fast path's ids are the tokenizer's own."""
    from plancc.scan.formats.tokens import token_ids

    tok = ADDED if added else TOK
    texts = ["".join(p) for p in pieces]
    ids, offsets = token_ids(tok, texts, True)
    expected = [tok.tokenizer.encode(t).ids for t in texts]
    assert [ids[offsets[i]:offsets[i + 1]].tolist() for i in range(len(texts))] == expected


def test_builtin_special_markup_in_text_uses_tokenizer(tmp_path):
    result = _scan(tmp_path, write_rows(tmp_path / "d.jsonl", [{"text": "a<|im_end|>b"}]))
    assert _tokenized(result)[0]["input_ids"] == [*_enc("a<|im_end|>b"), EOS]
    assert TOK.tokenizer.token_to_id("<|im_end|>") in _tokenized(result)[0]["input_ids"]

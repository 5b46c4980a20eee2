"""`input_output` rows: each segment tokenized apart, exactly the segments labelled true supervised."""

from __future__ import annotations

from plancc.config.settings import ScanOptions
from plancc.scan.scanner import scan
from plancc.scan.sources.tokenizer import load_tokenizer
from plancc.store import token_store
from tests.support.sources import DEEPSEEK_JSON, write_rows


def test_segments_are_joined_and_only_the_labelled_ones_trained(tmp_path):
    tok = load_tokenizer(str(DEEPSEEK_JSON))
    rows = [{"segments": [{"text": f"Question {i}: what is {i}+{i}?\n", "label": False},
                          {"text": f"Answer: {2 * i}.", "label": True}, {"text": " (checked)", "label": False}]}
            for i in range(6)]
    result = scan(str(write_rows(tmp_path / "d.jsonl", rows)), ScanOptions(tokenizer=str(DEEPSEEK_JSON)),
                  cache_dir=tmp_path / "cache")
    assert result.report.format == "input_output"
    store = token_store.open_store(result.tokenized_path)
    for i, row in enumerate(rows):
        a, b = int(store.offsets[i]), int(store.offsets[i + 1])
        pieces = [tok.tokenizer.encode(s["text"], add_special_tokens=False).ids for s in row["segments"]]
        assert store.input_ids[a:b].tolist() == [t for p in pieces for t in p]
        assert store.labels[a:b].tolist() == [t if s["label"] else -100 for s, p in zip(row["segments"], pieces, strict=True)
                                              for t in p]

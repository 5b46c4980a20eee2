"""The scan API: cache reuse and keys, identical results for any process count, SCAN_DIR output, samples sources."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from plancc.config.settings import ScanOptions
from plancc.core.paths import default_cache_dir
from plancc.errors import InputError
from plancc.scan.scanner import scan, write_scan
from plancc.store import parquet, schemas, token_store
from plancc.store.samples import samples_fingerprints
from plancc.store.samples_source import open_samples
from tests.support import REPO
from tests.support.sources import alpaca_rows, chatterbot_conversations, deepseek_dir, write_rows


def _phases(calls):
    return {c[0] for c in calls}


def test_cache_hit_reuses_and_key_follows_options(tmp_path):
    p = write_rows(tmp_path / "d.jsonl", alpaca_rows(20))
    calls: list = []
    first = scan(str(p), ScanOptions(tokenizer="builtin"), cache_dir=tmp_path / "c", progress=lambda *a: calls.append(a))
    assert {"reading", "tokenizing", "writing"} <= _phases(calls)
    assert ("tokenizing", 20, 20) in calls
    calls.clear()
    again = scan(str(p), ScanOptions(tokenizer="builtin"), cache_dir=tmp_path / "c", progress=lambda *a: calls.append(a))
    assert "tokenizing" not in _phases(calls)
    assert again.key == first.key and again.samples.equals(first.samples)
    assert again.tokenized_path == first.tokenized_path and again.report == first.report
    other = scan(str(p), ScanOptions(tokenizer="builtin", sequence_len=2048), cache_dir=tmp_path / "c")
    assert other.key != first.key
    assert scan(str(p), ScanOptions(tokenizer="builtin", add_eos=False), cache_dir=tmp_path / "c").key not in (first.key, other.key)
    write_rows(p, alpaca_rows(21))  # new content, same path: new key
    assert scan(str(p), ScanOptions(tokenizer="builtin"), cache_dir=tmp_path / "c").key != first.key


def test_default_cache_dir_from_env(tmp_path, monkeypatch):
    monkeypatch.setenv("PLANCC_CACHE", str(tmp_path / "env-cache"))
    result = scan(str(write_rows(tmp_path / "d.jsonl", alpaca_rows(3))), ScanOptions(tokenizer="builtin"))
    assert result.tokenized_path.is_relative_to(tmp_path / "env-cache")


def test_an_empty_cache_variable_means_unset(monkeypatch):
    """`PLANCC_CACHE= cmd` must not put the cache (scans, compiled kernels) in the working directory."""
    monkeypatch.setenv("PLANCC_CACHE", "")
    monkeypatch.setenv("HOME", "/home/someone")
    assert default_cache_dir() == Path("/home/someone/.cache/plancc")


def test_one_module_knows_where_the_cache_is():
    """The cache-path rule is written once (`plancc.core.paths`): nothing else reads PLANCC_CACHE or names the
    default folder, and every cache user goes through `cache_path`."""
    import ast

    root = REPO / "plancc"
    found = [f"{p.relative_to(root)}:{node.lineno}" for p in sorted(root.rglob("*.py")) if p.name != "paths.py"
             for node in ast.walk(ast.parse(p.read_text(encoding="utf-8")))
             if (isinstance(node, ast.Constant) and node.value in ("PLANCC_CACHE", "~/.cache/plancc"))
             or (isinstance(node, ast.Name | ast.Attribute) and getattr(node, "id", getattr(node, "attr", None))
                 == "default_cache_dir")]
    assert found == []


@pytest.mark.slow
def test_num_proc_identical(tmp_path):
    convs = chatterbot_conversations(200)
    p = write_rows(tmp_path / "chat.jsonl", [{"messages": c} for c in convs * 6])
    options = ScanOptions(tokenizer=str(deepseek_dir(tmp_path, "llama3")))
    one = scan(str(p), options, num_proc=1, cache_dir=tmp_path / "c1")
    two = scan(str(p), options, num_proc=2, cache_dir=tmp_path / "c2")
    assert one.samples.equals(two.samples)
    for f in sorted(one.tokenized_path.iterdir()):  # the token store, byte for byte
        assert f.read_bytes() == (two.tokenized_path / f.name).read_bytes()
    assert (one.tokenized_path.parent / "samples.parquet").read_bytes() == \
        (two.tokenized_path.parent / "samples.parquet").read_bytes()


@pytest.mark.slow
def test_num_proc_row_error_names_row(tmp_path):
    convs = chatterbot_conversations(100, system=False) * 12
    convs[1100] = [{"role": "narrator", "content": "x"}]
    p = write_rows(tmp_path / "chat.jsonl", [{"messages": c} for c in convs])
    with pytest.raises(InputError, match=r"chat\.jsonl row 1100 \(line 1101\).*unknown role narrator"):
        scan(str(p), ScanOptions(tokenizer=str(deepseek_dir(tmp_path, "deepseek"))), num_proc=2,
             cache_dir=tmp_path / "c")


def test_write_scan_and_read_back(tmp_path):
    result = scan(str(write_rows(tmp_path / "d.jsonl", alpaca_rows(9))), ScanOptions(tokenizer="builtin"), cache_dir=tmp_path / "c")
    out = tmp_path / "scan-out"
    write_scan(result, out)
    assert sorted(f.name for f in out.iterdir()) == ["samples.parquet", "scan.json", "tokens"]
    meta = parquet.read_file_meta(out / "samples.parquet")
    assert meta["kind"] == "samples" and meta["fingerprints"] == result.report.to_json()["fingerprints"]
    tokens = token_store.open_store(out / schemas.TOKENS_DIR)
    assert tokens.header["rows"] == 9 and tokens.header["fingerprints"] == result.report.to_json()["fingerprints"]
    assert token_store.verify_all(tokens) is None
    for source in (out, out / "samples.parquet"):
        loaded = open_samples(source)
        assert loaded is not None
        assert loaded.table.equals(result.samples)
        if loaded.kind == "scan":
            assert samples_fingerprints(loaded.table, loaded.record.identity) == \
                result.report.to_json()["fingerprints"]
            assert loaded.record.key == result.key and loaded.tokens == out / schemas.TOKENS_DIR
        else:  # the scan's samples file alone still records the options it was made under
            assert loaded.kind == "table" and loaded.record.options == result.report.options


def test_open_samples_foreign_and_not_samples(tmp_path):
    foreign = tmp_path / "foreign.parquet"
    table = pa.table({"sample_id": pa.array([0, 2], pa.int64()), "length": pa.array([5, 7], pa.int32()),
                      "label_count": pa.array([3, 7], pa.int32()),
                      "first_label_supervised": pa.array([False, True]),
                      "token_hash": pa.array([1, 2], pa.uint64())}, schema=schemas.SAMPLES_SCHEMA)
    pq.write_table(table, foreign)
    loaded = open_samples(foreign)
    assert loaded is not None and loaded.kind == "table" and loaded.table.equals(table)
    assert loaded.record.keys == frozenset() and loaded.tokens is None  # nothing records how it was made
    assert open_samples(write_rows(tmp_path / "t.parquet", [{"text": "a"}])) is None
    assert open_samples(tmp_path / "t.jsonl") is None
    bad = tmp_path / "bad.parquet"
    pq.write_table(table.set_column(0, "sample_id", pa.array([2, 0], pa.int64())), bad)
    with pytest.raises(InputError, match=r"bad\.parquet row 1: sample_id is not strictly increasing"):
        open_samples(bad)


def test_cache_hit_points_at_current_files(tmp_path):
    rows = [{"input_ids": [1, 2, 3]}, {"input_ids": [4, 5]}]
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first = scan(str(write_rows(tmp_path / "a" / "t.parquet", rows)), ScanOptions(), cache_dir=tmp_path / "c")
    second = scan(str(write_rows(tmp_path / "b" / "t.parquet", rows)), ScanOptions(), cache_dir=tmp_path / "c")
    assert second.key == first.key and second.tokenized_path == first.tokenized_path
    assert second.source_paths == [str(tmp_path / "b" / "t.parquet")]


def test_messages_with_mixed_extra_fields(tmp_path):
    rows = [{"messages": [{"role": "user", "content": "q", "weight": 1}, {"role": "assistant", "content": "a"}]},
            {"messages": [{"role": "user", "content": "q", "weight": "x"}, {"role": "assistant", "content": "b"}]}]
    result = scan(str(write_rows(tmp_path / "m.jsonl", rows)), ScanOptions(tokenizer="builtin", chat_template="chatml"),
                  cache_dir=tmp_path / "c")
    assert result.samples.num_rows == 2

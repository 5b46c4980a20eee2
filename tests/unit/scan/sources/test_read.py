"""Every source kind reads to the same samples, and every bad input is an InputError naming file, row, column."""

from __future__ import annotations

import datasets
import pytest

from plancc.config.settings import ScanOptions
from plancc.errors import InputError
from plancc.scan.scanner import scan
from tests.support.sources import alpaca_rows, pc_rows, write_rows


def _scan(tmp_path, source, **kw):
    return scan(str(source), ScanOptions(**{"tokenizer": "builtin", "chat_template": "chatml", **kw}), cache_dir=tmp_path / "cache")


@pytest.mark.parametrize("suffix", [".jsonl", ".json", ".parquet", ".arrow", ".csv"])
def test_file_kinds_agree(tmp_path, suffix):
    ref = _scan(tmp_path, write_rows(tmp_path / "ref.jsonl", pc_rows()))
    got = _scan(tmp_path, write_rows(tmp_path / f"data{suffix}", pc_rows()))
    assert got.samples.equals(ref.samples)
    assert got.report.to_json()["format"] == "prompt_completion"
    assert got.source_paths == [str(tmp_path / f"data{suffix}")]


def test_glob_concatenates_in_sorted_order(tmp_path):
    rows = pc_rows(12)
    write_rows(tmp_path / "part-1.jsonl", rows[6:])
    write_rows(tmp_path / "part-0.jsonl", rows[:6])
    ref = _scan(tmp_path, write_rows(tmp_path / "all.parquet", rows))
    got = _scan(tmp_path, tmp_path / "part-*.jsonl")
    assert got.samples.equals(ref.samples)
    assert len(got.source_paths) == 2


def test_save_to_disk_directory(tmp_path):
    rows = alpaca_rows(10)
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "ds"))
    ref = _scan(tmp_path, write_rows(tmp_path / "ref.json", rows))
    got = _scan(tmp_path, tmp_path / "ds")
    assert got.samples.equals(ref.samples)
    assert got.report.to_json()["format"] == "alpaca"
    assert all(p.endswith(".arrow") for p in got.source_paths)


def test_hub_id_offline_is_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(InputError, match=r"plancc-test-nobody/no-such-dataset.*Hub dataset could not be loaded"):
        _scan(tmp_path, "plancc-test-nobody/no-such-dataset")


def test_missing_local_file(tmp_path):
    with pytest.raises(InputError, match="no such file"):
        _scan(tmp_path, tmp_path / "nope.jsonl")
    with pytest.raises(InputError, match="no files match"):
        _scan(tmp_path, tmp_path / "nope-*.jsonl")


def test_malformed_json_line_names_line(tmp_path):
    p = tmp_path / "bad.jsonl"
    lines = [b'{"text": "a"}', b"", b'{"text": "b"}', b'{"text": "c",}']
    p.write_bytes(b"\n".join(lines) + b"\n")
    with pytest.raises(InputError, match=r"bad\.jsonl line 4: malformed JSON"):
        _scan(tmp_path, p)


def test_malformed_json_list_names_line(tmp_path):
    p = tmp_path / "bad.json"
    p.write_text('[\n{"text": "a"},\n{"text": "b" "c"}\n]\n')
    with pytest.raises(InputError, match=r"bad\.json line 3 column \d+: malformed JSON"):
        _scan(tmp_path, p)


def test_missing_column_names_column(tmp_path):
    p = write_rows(tmp_path / "pc.jsonl", [{"prompt": "a", "answer": "b"}])
    with pytest.raises(InputError, match=r"pc\.jsonl: missing column 'completion'"):
        _scan(tmp_path, p, format="prompt_completion")
    with pytest.raises(InputError, match="cannot tell the format"):
        _scan(tmp_path, p)


def test_mistyped_column_names_first_bad_row(tmp_path):
    rows = pc_rows(5)
    rows[3]["completion"] = 42
    p = write_rows(tmp_path / "pc.jsonl", rows)
    with pytest.raises(InputError, match=r"pc\.jsonl row 3 \(line 4\): column 'completion' has int value"):
        _scan(tmp_path, p)


def test_mistyped_parquet_column(tmp_path):
    p = write_rows(tmp_path / "t.parquet", [{"text": 1}, {"text": 2}])
    with pytest.raises(InputError, match=r"t\.parquet row 0: column 'text' has type int64, expected string"):
        _scan(tmp_path, p)


def test_null_value_names_row(tmp_path):
    p = write_rows(tmp_path / "t.parquet", [{"text": "a"}, {"text": None}])
    with pytest.raises(InputError, match=r"t\.parquet row 1: column 'text' is missing a value"):
        _scan(tmp_path, p)


def test_mistyped_input_ids(tmp_path):
    p = write_rows(tmp_path / "tok.jsonl", [{"input_ids": [1, 2]}, {"input_ids": [1, "x"]}])
    with pytest.raises(InputError, match=r"tok\.jsonl row 1 \(line 2\): column 'input_ids'"):
        _scan(tmp_path, p)


@pytest.mark.parametrize("suffix", [".jsonl", ".json", ".parquet", ".csv"])
def test_empty_dataset(tmp_path, suffix):
    p = tmp_path / f"empty{suffix}"
    if suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.table({"text": pa.array([], pa.string())}), p)
    elif suffix == ".csv":
        p.write_text("text\n")
    else:
        p.write_text("[]" if suffix == ".json" else "")
    with pytest.raises(InputError, match="empty"):
        _scan(tmp_path, p)


def test_csv_with_newlines_in_values(tmp_path):
    rows = [{"prompt": "line one\nline two", "completion": "ok"}, {"prompt": "p", "completion": "c"}]
    got = _scan(tmp_path, write_rows(tmp_path / "d.csv", rows))
    ref = _scan(tmp_path, write_rows(tmp_path / "d.jsonl", rows))
    assert got.samples.equals(ref.samples)


def test_unwritable_cache_is_clear_error(tmp_path):
    from plancc.errors import PlanccError

    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(PlanccError, match="cannot write the scan cache"):
        scan(str(write_rows(tmp_path / "d.jsonl", pc_rows(2))), ScanOptions(tokenizer="builtin"), cache_dir=blocker / "sub")


def test_hub_id_unreachable_or_missing_is_clear_error(tmp_path, monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    with pytest.raises(InputError, match=r"plancc-test-nobody/missing-dataset-7f3a.*could not be loaded"):
        _scan(tmp_path, "plancc-test-nobody/missing-dataset-7f3a")

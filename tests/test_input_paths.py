"""Hostile inputs: bytes that are not UTF-8, globs through symlink loops, file names that look like
globs, globs the shell expanded, and plans used from another folder than the one they were compiled in."""

from __future__ import annotations

import json
import os
import shutil
import warnings
from pathlib import Path

import jsonschema
import pytest
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from plancc.cli import app
from plancc.errors import InputError, PlanccWarning
from plancc.runtime import load_tokens
from plancc.scan.sources.read import locate, read_source
from plancc.store.data_files import check_utf8
from tests.sources_fixtures import DEEPSEEK_JSON

runner = CliRunner()


def _tokenized(path: Path, n: int, first: int = 0) -> Path:
    """`n` rows of the `tokenized` format (no tokenizer needed), row i holding token ids around first + i."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"input_ids": [first + i, 7, 8, 9], "labels": [-100, 7, 8, 9]}) + "\n"
                            for i in range(n)))
    return path


def _compile(*args) -> object:
    return runner.invoke(app, ["compile", *map(str, args), "--sequence-len", "64", "-q", "--json"])


# ---------------------------------------------------------------- encodings


@pytest.mark.parametrize("suffix", [".jsonl", ".json", ".csv"])
def test_a_line_that_is_not_utf8_names_file_line_and_byte_offset(tmp_path, suffix):
    good = {".jsonl": b'{"text": "fine"}\n', ".json": b'{"text": "fine"}\n', ".csv": b"text\nfine\n"}[suffix]
    data = good + good.splitlines(keepends=True)[-1] + b'{"text": "caf\xe9"}\n'
    path = tmp_path / f"bad{suffix}"
    path.write_bytes(data)
    res = runner.invoke(app, ["scan", str(path), "-o", str(tmp_path / "scan"), "--tokenizer", str(DEEPSEEK_JSON)])
    at = data.index(b"\xe9")
    line = data.count(b"\n", 0, at) + 1
    assert res.exit_code == 2
    assert f"{path} line {line} (byte offset {at}): not valid UTF-8 (byte 0xe9)" in " ".join(res.output.split())
    assert "Traceback" not in res.output and not (tmp_path / "scan").exists()


@given(st.lists(st.text(max_size=12), min_size=1, max_size=12), st.integers(0, 10**6), st.integers(1, 40),
       st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\x80"]))
def test_utf8_check_finds_the_first_bad_byte_at_any_chunk_size(tmp_path_factory, lines, where, chunk, bad):
    data = "\n".join(lines).encode()
    at = where % (len(data) + 1)
    data = data[:at] + bad + data[at:]
    path = tmp_path_factory.mktemp("u") / "x.jsonl"
    path.write_bytes(data)
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        want = f"line {line} (byte offset {exc.start})"
    else:
        want = None  # the inserted bytes happened to complete a valid character
    if want is None:
        check_utf8(str(path), chunk)
    else:
        with pytest.raises(InputError, match=want.replace("(", r"\(").replace(")", r"\)")):
            check_utf8(str(path), chunk)


# ---------------------------------------------------------------- globs and literal paths


def _loopy_tree(tmp_path: Path) -> Path:
    """data/a.jsonl (3 rows), data/sub/b.jsonl (2 rows), two symlink loops and a second name for a.jsonl."""
    data = tmp_path / "data"
    _tokenized(data / "a.jsonl", 3)
    _tokenized(data / "sub" / "b.jsonl", 2, first=100)
    (data / "loop").symlink_to(data)  # data/loop -> data
    (data / "sub" / "up").symlink_to(data / "sub")  # data/sub/up -> data/sub
    (data / "same.jsonl").symlink_to(data / "a.jsonl")
    return data


def test_a_glob_through_symlink_loops_reads_each_real_file_once(tmp_path):
    data = _loopy_tree(tmp_path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loc = locate(str(data / "**" / "*.jsonl"))
    assert list(loc.paths) == [str(data / "a.jsonl"), str(data / "sub" / "b.jsonl")]
    said = [str(w.message) for w in caught if issubclass(w.category, PlanccWarning)]
    assert any(m.startswith(f"{data / 'loop'} is a directory already searched") for m in said)
    assert any(m.startswith(f"{data / 'sub' / 'up'} is a directory already searched") for m in said)
    assert any("same.jsonl is the same file as" in m for m in said)
    assert read_source(loc).num_rows == 5


def test_a_glob_through_a_loop_compiles_every_row_once_and_warns(tmp_path, monkeypatch):
    _loopy_tree(tmp_path)
    monkeypatch.chdir(tmp_path)
    res = _compile("data/**/*.jsonl", "-o", tmp_path / "plan")
    assert res.exit_code == 0, res.output
    assert "warning:" in res.output and "symlink loop" in res.output
    manifest = json.loads((tmp_path / "plan" / "manifest.json").read_text())
    assert manifest["samples"] == 5


def test_a_path_that_exists_is_taken_literally_before_glob_expansion(tmp_path, monkeypatch):
    _tokenized(tmp_path / "train[v2].jsonl", 4)
    _tokenized(tmp_path / "trainv.jsonl", 9)  # what the glob would match instead
    monkeypatch.chdir(tmp_path)
    assert list(locate("train[v2].jsonl").paths) == [str(tmp_path / "train[v2].jsonl")]
    res = _compile("train[v2].jsonl", "-o", tmp_path / "plan")
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["samples"] == 4


def test_a_glob_the_shell_expanded_says_to_quote_it(tmp_path):
    """`scan` takes one SOURCE (`compile` takes several: a recipe, see tests/test_recipes.py)."""
    a, b = _tokenized(tmp_path / "a.jsonl", 2), _tokenized(tmp_path / "b.jsonl", 2)
    res = runner.invoke(app, ["scan", str(a), str(b), "-o", str(tmp_path / "plan")])
    assert res.exit_code == 2
    assert "unexpected extra argument" in res.output and "quote" in res.output.replace("\n", " ")
    assert not (tmp_path / "plan").exists()


# ---------------------------------------------------------------- plans used from another folder


def test_a_plan_from_a_relative_source_path_trains_from_any_folder_and_after_a_move(tmp_path, monkeypatch):
    work = tmp_path / "work"
    _tokenized(work / "data" / "train.jsonl", 6)
    monkeypatch.chdir(work)
    assert _compile("data/train.jsonl", "-o", "plans/p").exit_code == 0
    manifest = json.loads((work / "plans" / "p" / "manifest.json").read_text())
    jsonschema.validate(manifest, json.loads((Path(__file__).parent.parent / "schemas" / "manifest.schema.json")
                                             .read_text()))
    data = manifest["data"]
    assert data["source"] == [str(work / "data" / "train.jsonl")]
    assert data["source_relative"] == [os.path.join("..", "..", "data", "train.jsonl")]
    monkeypatch.chdir(tmp_path)
    assert len(load_tokens(work / "plans" / "p")) == 6  # another folder: the absolute path
    shutil.move(work, tmp_path / "moved")  # plan and data moved together: the path relative to the plan
    assert len(load_tokens(tmp_path / "moved" / "plans" / "p")) == 6


def test_validate_dataset_runs_from_another_folder_with_a_relative_tokenizer(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    for name in ("first", "work"):  # the second compile reuses the first one's cached scan ...
        work = tmp_path / name
        (work / "tok").mkdir(parents=True)
        shutil.copyfile(DEEPSEEK_JSON, work / "tok" / "tokenizer.json")
        (work / "train.jsonl").write_text("".join(json.dumps({"text": f"sample {i}"}) + "\n" for i in range(8)))
        monkeypatch.chdir(work)
        res = _compile("train.jsonl", "-o", "plan", "--tokenizer", "tok/tokenizer.json", "--cache-dir", cache)
        assert res.exit_code == 0, res.output
    shutil.rmtree(tmp_path / "first")  # ... but must record its own tokenizer path, not the first one's
    monkeypatch.chdir(tmp_path)
    res = runner.invoke(app, ["validate", str(work / "plan"), "--dataset", str(work / "train.jsonl")])
    assert res.exit_code == 0, res.output

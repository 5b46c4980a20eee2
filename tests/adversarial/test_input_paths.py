"""Hostile inputs: bytes that are not UTF-8, globs through symlink loops, file names that look like
globs, globs the shell expanded, and plans used from another folder than the one they were compiled in."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import threading
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
from tests.support import REPO
from tests.support.sources import DEEPSEEK_JSON

runner = CliRunner()
ROOT = REPO


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


# ---------------------------------------------------------------- FIFOs, devices, /dev/stdin


@pytest.fixture
def fifo(tmp_path):
    """A FIFO; if a regression opens it for reading, a writer comes after 30 s so the test fails, not hangs."""
    path = tmp_path / "pipe.jsonl"
    os.mkfifo(path)

    def release() -> None:
        with contextlib.suppress(OSError):  # ENXIO: nobody reads it, as it should be
            os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))

    timer = threading.Timer(30, release)
    timer.start()
    yield path
    timer.cancel()


def _refused(res) -> str:
    assert res.exit_code == 2 and "Traceback" not in res.output, res.output
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), res.output
    return lines[0]


def test_a_fifo_or_device_source_is_named_for_what_it_is(tmp_path, fifo):
    """A FIFO, a device or /dev/stdin given as SOURCE was "no such file or directory"."""
    for source, kind in ((fifo, "a FIFO (named pipe)"), ("/dev/null", "a character device")):
        line = _refused(_compile(source, "-o", tmp_path / "plan", "--tokenizer", "builtin"))
        assert line == f"error: {source} is {kind}, not a regular file; plancc reads a source from regular files or " \
                       "a directory"
    assert not (tmp_path / "plan").exists()


def test_dev_stdin_as_a_source_says_what_it_is(tmp_path):
    """/dev/stdin is the pipe, terminal or file the shell connected: plancc reads a pipe or terminal never."""
    r = subprocess.run([sys.executable, "-m", "plancc", "compile", "/dev/stdin", "-o", str(tmp_path / "plan"),
                        "--tokenizer", "builtin", "-q"], input='{"text": "a"}\n', capture_output=True, text=True,
                       timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 2 and r.stderr == ("error: /dev/stdin is a FIFO (named pipe), not a regular file; plancc "
                                              "reads a source from regular files or a directory\n"), r.stderr


def test_a_fifo_or_device_tokenizer_or_template_is_named_for_what_it_is(tmp_path, fifo):
    chat = tmp_path / "chat.jsonl"
    chat.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"},
                                             {"role": "assistant", "content": "yo"}]}) + "\n")
    for tokenizer, kind in ((fifo, "a FIFO (named pipe)"), ("/dev/zero", "a character device")):
        line = _refused(_compile(chat, "-o", tmp_path / "plan", "--tokenizer", tokenizer))
        shown = fifo.absolute() if tokenizer == fifo else tokenizer
        assert line == f"error: --tokenizer {tokenizer}: {shown} is {kind}, not a regular file; plancc reads a " \
                       "tokenizer from a tokenizer.json file or a directory holding one"
    line = _refused(_compile(chat, "-o", tmp_path / "plan", "--tokenizer", "builtin", "--chat-template", fifo))
    assert line == f"error: --chat-template {fifo}: {fifo} is a FIFO (named pipe), not a regular file; plancc reads " \
                   "a chat template from a regular file"


def test_a_tokenizer_directory_whose_config_is_a_fifo_is_refused_not_ignored(tmp_path):
    """A tokenizer_config.json that is not a regular file was skipped as absent: no EOS, no chat template."""
    tok = tmp_path / "tok"
    tok.mkdir()
    shutil.copy(DEEPSEEK_JSON, tok / "tokenizer.json")
    (tok / "tokenizer_config.json").symlink_to("/dev/zero")
    line = _refused(_compile(_tokenized(tmp_path / "t.jsonl", 3), "-o", tmp_path / "plan", "--tokenizer", tok,
                             "--format", "tokenized"))
    assert line == f"error: --tokenizer {tok}: {tok.absolute() / 'tokenizer_config.json'} is a character device, " \
                   "not a regular file; plancc reads a tokenizer from a tokenizer.json file or a directory holding one"


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
    """`scan` takes one SOURCE (`compile` takes several: a recipe, see tests/integration/test_recipes.py)."""
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
    jsonschema.validate(manifest, json.loads((REPO / "schemas" / "manifest.schema.json")
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

"""`plancc show`: a sample decoded with its supervised tokens marked, on a plan and on a scan directory."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from plancc.cli import app
from tests.support.sources import write_rows

runner = CliRunner()

SYSTEM = {"role": "system", "content": "Be brief."}


def _conversation(i: int) -> list[dict[str, str]]:
    turns = [SYSTEM, {"role": "user", "content": f"What is {i} + {i}? ünï"},
             {"role": "assistant", "content": f"It is {2 * i}. ✓"}]
    if i % 2:
        turns += [{"role": "user", "content": "And doubled?"}, {"role": "assistant", "content": f"{4 * i}."}]
    return turns


def _run(*args):
    return runner.invoke(app, [str(a) for a in args])


@pytest.fixture(scope="module")
def dirs(tmp_path_factory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("show")
    src = write_rows(tmp / "chat.jsonl", [{"messages": _conversation(i)} for i in range(12)])
    out = {"plan": tmp / "plan", "scan": tmp / "scan", "plan_none": tmp / "plan_none"}
    cache = tmp / "cache"
    for args in (["compile", src, "-o", out["plan"]], ["scan", src, "-o", out["scan"]],
                 ["compile", src, "-o", out["plan_none"], "--shift", "none"]):
        res = _run(*args, "--sequence-len", "512", "--tokenizer", "builtin", "--chat-template", "chatml",
                   "--cache-dir", cache, "--quiet")
        assert res.exit_code == 0, res.output
    return out


def _show(directory: Path, sample: int) -> dict:
    res = _run("show", directory, "--sample", sample, "--json")
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


@pytest.mark.parametrize("kind", ["plan", "scan"])
@pytest.mark.parametrize("sample", [0, 3])
def test_marks_exactly_the_assistant_tokens(dirs, kind, sample):
    view = _show(dirs[kind], sample)
    labels = np.asarray(view["labels"])
    assert view["supervised"] == (labels != -100).tolist()
    assert view["supervised_tokens"] == int((labels != -100).sum())
    assistant = [t["content"] for t in _conversation(sample) if t["role"] == "assistant"]
    marked = [s["text"] for s in view["segments"] if s["supervised"]]
    assert len(marked) == len(assistant)
    for text, content in zip(marked, assistant, strict=True):
        assert text.startswith(content + "<|im_end|>")
    plain = "".join(s["text"] for s in view["segments"] if not s["supervised"])
    assert all(t["content"] in plain for t in _conversation(sample) if t["role"] != "assistant")
    # the counts are those the plan uses: label_count = supervised tokens less an unshiftable first one
    assert view["length"] == len(view["input_ids"])
    assert view["label_count"] == view["supervised_tokens"] - int(view["first_label_supervised"])


def test_already_shifted_labels_mark_the_same_tokens(dirs):
    for sample in (0, 1):
        assert _show(dirs["plan_none"], sample)["segments"] == _show(dirs["plan"], sample)["segments"]


def test_plain_output_uses_markers_and_ids_side_by_side(dirs):
    res = _run("show", dirs["plan"], "--sample", 1, "--no-color")
    assert res.exit_code == 0, res.output
    assert "[[It is 2. ✓<|im_end|>" in res.stdout and "[[4.<|im_end|>" in res.stdout
    assert "first label supervised: no" in res.stdout and "plancc-byte-level" in res.stdout
    assert "[[What is" not in res.stdout
    res = _run("show", dirs["scan"], "--sample", 1, "--ids")
    lines = [line for line in res.stdout.splitlines() if "│" in line]
    supervised_rows = [line for line in lines if "yes" in line]
    assert len(supervised_rows) == _show(dirs["scan"], 1)["supervised_tokens"]
    assert _run("show", dirs["plan"], "--sample", 1, "--quiet").stdout == ""


@pytest.mark.parametrize(("args", "message"), [(["--sample", "99"], "no such sample"),
                                               (["--sample", "-1"], "sample ids run 0..11")])
def test_bad_sample_exits_2(dirs, args, message):
    res = _run("show", dirs["plan"], *args)
    assert res.exit_code == 2 and message in res.output


def test_not_a_plan_or_scan_exits_2(tmp_path):
    res = _run("show", tmp_path, "--sample", "0")
    assert res.exit_code == 2 and "not a plan or scan directory" in res.output


def test_a_tokenized_source_scanned_without_a_tokenizer_asks_for_one(tmp_path):
    """Rows already tokenized need no tokenizer to scan; decoding them does: one line naming --tokenizer (it was a
    traceback), and with it the sample is shown with the source's own labels."""
    rows = [{"input_ids": [104, 105, 33, 2], "labels": [-100, 105, 33, 2]} for _ in range(3)]
    src = write_rows(tmp_path / "t.jsonl", rows)
    res = _run("scan", src, "-o", tmp_path / "scan", "--cache-dir", tmp_path / "cache", "--quiet")
    assert res.exit_code == 0, res.output
    res = _run("show", tmp_path / "scan", "--sample", 1)
    assert res.exit_code == 2 and "recorded no tokenizer" in res.output and "--tokenizer" in res.output
    res = _run("show", tmp_path / "scan", "--sample", 1, "--tokenizer", "builtin", "--json")
    assert res.exit_code == 0, res.output
    view = json.loads(res.stdout)
    assert view["trained"] == "the source's own labels" and view["supervised"] == [False, True, True, True]

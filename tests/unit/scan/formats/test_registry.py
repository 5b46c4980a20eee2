"""The format registry (`plancc.scan.formats`) and the names the settings know (`plancc.config.formats`) describe the
same formats: every named format has exactly one module, reads only the columns `--columns` may map onto, is
detected in the registry's order, owns the shaping settings it reads; and `Encoded` sequences keep their
per-sequence attributes through concatenation and the worker-process files."""

from __future__ import annotations

from itertools import combinations

import numpy as np
import pyarrow as pa
import pytest

from plancc.cli.summary import PAIRED
from plancc.config import formats as names
from plancc.config.settings import SHAPING, ScanOptions
from plancc.scan import formats
from plancc.scan.describe import trained
from plancc.scan.formats import Encoded, Encoding
from plancc.scan.sources.read import read_source
from plancc.scan.sources.tokenizer import load_tokenizer
from plancc.store.scan_record import ScanRecord
from tests.support.sources import write_rows

CHAT = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]
ROWS = {  # one row of each format, in its own column names
    "tokenized": {"input_ids": [5, 6, 7], "labels": [-100, 6, 7], "shift_labels": [6, 7, -100]},
    "messages": {"messages": CHAT},
    "alpaca": {"instruction": "Add.", "input": "2+2", "output": "4"},
    "prompt_completion": {"prompt": "2+2=", "completion": "4"},
    "text": {"text": "The quick brown fox."},
    "input_output": {"segments": [{"text": "Q: 2+2?", "label": False}, {"text": " A: 4", "label": True}]},
    "preference": {"prompt": "2+2=", "chosen": "4", "rejected": "5"},
    "unpaired_preference": {"prompt": "2+2=", "completion": "4", "label": True},
    "axolotl_preference": {"messages": CHAT[:1], "chosen": "4", "rejected": "5"},
}
FORCED = {"axolotl_preference"}  # never detected: named by --format or an Axolotl config
DETECTED = sorted(set(ROWS) - FORCED)


def _source(tmp_path, row: dict, name: str = "d.jsonl"):
    return read_source(str(write_rows(tmp_path / name, [row, row])))


def test_the_registry_and_the_settings_name_the_same_formats():
    registered = [f.name for f in formats.FORMATS]
    assert sorted(registered) == sorted(set(registered)) == sorted(f.name for f in names.NAMED) == sorted(ROWS)
    for fmt in formats.FORMATS:
        assert fmt.named is names.BY_NAME[fmt.name]
        assert formats.get(fmt.name) is fmt
    assert set(names.AXOLOTL_TYPES.values()) <= set(registered)
    assert set(PAIRED) == {f.name for f in formats.FORMATS if f.sequences == 2}  # what the summaries count as pairs


@pytest.mark.parametrize("name", sorted(ROWS))
def test_each_format_detects_its_rows_and_reads_only_its_roles(tmp_path, name):
    src = _source(tmp_path, ROWS[name])
    fmt = formats.get(name)
    assert fmt.detects(src) == (name not in FORCED)
    assert name in FORCED or formats.detect(src) is fmt
    table = fmt.canonical(src, ScanOptions())
    derived = {"conversational"}  # the preference formats' flag of a row given as messages: read from no column
    assert set(table.column_names) - derived <= set(fmt.named.roles) <= set(names.ROLES)
    assert table.num_rows == 2


@pytest.mark.parametrize("name", sorted(ROWS))
def test_each_format_gives_its_number_of_sequences_a_row(tmp_path, name):
    """The contract a sequence's place rests on: `sequences` per row, row by row (sample `row * k + j`)."""
    from plancc.scan.sources.templates import BUILTIN_TEMPLATES

    fmt = formats.get(name)
    src = _source(tmp_path, ROWS[name])
    how = Encoding(load_tokenizer("builtin"), ScanOptions(), BUILTIN_TEMPLATES["chatml"] if fmt.chat else None)
    work, shaped = fmt.shape(fmt.canonical(src, ScanOptions()), ScanOptions())
    enc = shaped.encode(work, how)
    assert len(enc.offsets) - 1 == src.num_rows * fmt.sequences == src.num_rows * shaped.sequences
    assert len(enc.end_only_rows()) == len(enc.offsets) - 1
    assert all(len(values) == len(enc.offsets) - 1 for values in enc.attributes.values())


@pytest.mark.parametrize(("first", "second"), list(combinations([f.name for f in formats.FORMATS
                                                                  if f.name not in FORCED], 2)))
def test_a_source_with_the_columns_of_two_formats_is_the_one_detection_tries_first(tmp_path, first, second):
    src = _source(tmp_path, {**ROWS[second], **ROWS[first]})
    assert formats.detect(src).name == first


def test_each_shaping_setting_is_read_by_exactly_one_format():
    for setting in SHAPING:
        assert len([f for f in formats.FORMATS if setting in f.shaping]) == 1, setting
    assert {s for f in formats.FORMATS for s in f.shaping} == set(SHAPING)


def test_a_shaping_setting_for_another_format_is_refused_naming_it(tmp_path):
    from plancc.errors import SettingsError

    src = _source(tmp_path, ROWS["text"])
    with pytest.raises(SettingsError, match="--separator applies to format prompt_completion; this source is text"):
        formats.choose(src, ScanOptions(separator=" "))


def test_encoded_sequences_keep_their_attributes_through_concat_and_the_worker_files():
    """A format giving several sequences a row hands their attributes on: concatenated chunks and the Arrow files
    worker processes write give them back, in sequence order."""
    fmt = formats.get("text")
    how = Encoding(load_tokenizer("builtin"))
    parts = []
    for k, texts in enumerate((["a", "bc", "def"], ["gh", "i"])):
        enc = fmt.encode(pa.table({"text": texts}), how)
        enc.attributes = {"pair_role": np.array(["chosen", "rejected", "chosen"][: len(texts)], dtype=object),
                          "pair_id": np.arange(len(texts), dtype=np.int64) + 10 * k}
        parts.append(enc)
    joined = Encoded.concat(parts)
    back = Encoded.from_table(joined.to_table())
    assert back.attributes["pair_role"].tolist() == ["chosen", "rejected", "chosen", "chosen", "rejected"]
    assert back.attributes["pair_id"].tolist() == [0, 1, 2, 10, 11]
    assert np.array_equal(back.ids, joined.ids) and np.array_equal(back.offsets, joined.offsets)
    assert np.array_equal(back.labels, joined.labels)


@pytest.mark.parametrize(("name", "options", "said"), [
    ("tokenized", ScanOptions(), "the source's own labels"),
    ("text", ScanOptions(train_on_eos="none"), "train_on_eos none"),
    ("alpaca", ScanOptions(train_on_inputs=True), "train_on_inputs true, train_on_eos turn"),
    ("prompt_completion", ScanOptions(), "train_on_inputs false, train_on_eos turn"),
    ("messages", ScanOptions(roles_to_train=["user", "assistant"], train_on="last_turn"),
     "roles_to_train user,assistant, train_on_eos turn, train_on last_turn"),
])
def test_what_a_scan_trained_is_said_by_its_format(name, options, said):
    assert trained(ScanRecord.of(format=name, options=_recorded(options))) == said


def _recorded(options: ScanOptions):
    from plancc.scan.shard import recorded_options

    return recorded_options(options, None, None)

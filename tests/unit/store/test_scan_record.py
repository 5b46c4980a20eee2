"""The scan record: one reader and one writer of scan.json (and a plan manifest's `scan` entry), byte-identical
with what plancc wrote before the record was typed; a malformed record is one line naming the file and entry."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from plancc.cli import app
from plancc.config.settings import ScanOptions
from plancc.store import parquet, schemas
from plancc.store.scan_record import RecordedOptions, ScanRecord
from plancc.store.scan_store import ScanDir
from tests.support import REPO

ROOT = REPO / "plancc"
ROWS = [{"prompt": "q1 q1", "completion": "a"}, {"prompt": "q2", "completion": "a a"},
        {"prompt": "q3 q3 q3", "completion": "b"}]
# the scan.json plancc wrote for ROWS before the record was typed (`plancc scan d.jsonl --tokenizer builtin
# --sequence-len 64 --separator " => "`); `source`, `source_paths` and `seconds` differ from run to run
OLD = {
    "chat_template": None, "dropped_all_masked": {"count": 0, "first_rows": []},
    "dropped_long": {"count": 0, "first_rows": []}, "dropped_samples": 0, "end_only": {"count": 0, "first_rows": []},
    "eos_token": "<|eos|>",
    "fingerprints": {"dataset": "f82493f8bf9d1deb912a546ddf185a1a", "metadata": "942ab77e088b79b6397c6fd795680105"},
    "format": "prompt_completion", "key": "3435d4078fd789527c7d34f79181ecd6", "labels_shifted": False,
    "max_dropped": 0.05,
    "options": {"add_eos": True, "chat_template": None, "columns": [], "format": "auto", "long": "drop",
                "separator": " => ", "sequence_len": 64, "shift": "sample", "split": None,
                "tokenizer": "335c29f6b982031e44cac038418f7183"},
    "plancc_scan_version": 6, "retained": 3, "rows_read": 3, "seconds": 6.589, "source": "d.jsonl",
    "source_fingerprint": "adff5edd5292ed279e5e923683637d16", "source_kind": "jsonl",
    "source_paths": ["/tmp/oldscan/d.jsonl"], "text_format": {"separator": " => "},
    "tokenizer": "plancc-byte-level", "tokenizer_fingerprint": "335c29f6b982031e44cac038418f7183",
    "truncated": {"count": 0, "first_rows": []}, "truncated_samples": 0, "warnings": [],
}
RUN_TO_RUN = ("source", "source_paths", "seconds")
# what changed on purpose since: the tokenizer's fingerprint is its identity by content (so the options' tokenizer,
# the metadata fingerprint and the cache key follow), scan version 7 leaves turns without text untrained and counts
# them (`blank_turns`), scan version 8 renders the template clock in UTC, 9 appends no second eos, 10 writes token
# stores whose digest is independent of the shards; the dataset fingerprint, the rows and every count are the old
# writer's
CONTENT_FP = "d1f33403f5d7609f7aeade2c7446857e"
NOW = {**OLD, "key": "2abed91acc21f8dfda02c05334903b38", "tokenizer_fingerprint": CONTENT_FP,
       "options": {**OLD["options"], "tokenizer": CONTENT_FP},
       "fingerprints": {**OLD["fingerprints"], "metadata": "8d6de1a7b49266e865fefeef05ef47d8"},
       "plancc_scan_version": 10, "blank_turns": {"count": 0, "first_rows": []}}
runner = CliRunner()


def _scan(tmp_path: Path, *extra: str) -> Path:
    source = tmp_path / "d.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    out = tmp_path / "s"
    r = runner.invoke(app, ["scan", str(source), "-o", str(out), "--tokenizer", "builtin", "--sequence-len", "64",
                            "--separator", " => ", "-q", "--cache-dir", str(tmp_path / "c"), *extra])
    assert r.exit_code == 0, r.output
    return out


def test_an_old_scan_json_reads_and_writes_back_byte_identical(tmp_path):
    path = tmp_path / schemas.SCAN_MANIFEST_FILE
    parquet.write_json(OLD, path)
    record = ScanRecord.read(path)
    assert (record.options.sequence_len, record.options.shift, record.sequence_len) == (64, "sample", 64)
    assert record.fingerprint_map == OLD["fingerprints"] and record.retained == 3
    (tmp_path / "again").mkdir()
    record.write(tmp_path / "again")
    assert (tmp_path / "again" / schemas.SCAN_MANIFEST_FILE).read_bytes() == path.read_bytes()


def test_a_scan_writes_what_plancc_wrote_before(tmp_path):
    """The old writer's rows, counts and dataset fingerprint, and the changes `NOW` names: only where and how long
    differ besides, and the entry added since (each source file's name and rows, which `plancc diff` names rows by)."""
    written = orjson.loads((_scan(tmp_path) / schemas.SCAN_MANIFEST_FILE).read_bytes())
    assert written.pop("source_files") == [["d.jsonl", 3]]
    assert {k: v for k, v in written.items() if k not in RUN_TO_RUN} == \
        {k: v for k, v in NOW.items() if k not in RUN_TO_RUN}


def test_a_plan_manifest_scan_entry_round_trips(tmp_path):
    scan = _scan(tmp_path)
    r = runner.invoke(app, ["compile", str(scan), "-o", str(tmp_path / "p"), "-q"])
    assert r.exit_code == 0, r.output
    entry = orjson.loads((tmp_path / "p" / schemas.MANIFEST_FILE).read_bytes())["scan"]
    record = ScanRecord.from_json(entry, "manifest")
    assert record.to_json() == entry and "seconds" not in record.keys and record.sequence_len == 64
    assert orjson.loads((tmp_path / "p" / schemas.MANIFEST_FILE).read_bytes())["settings"]["sequence_len"] == 64  # carried from the scan


def test_scan_dir_opens_and_checks(tmp_path):
    scan = ScanDir.open(_scan(tmp_path))
    assert scan.samples().num_rows == 3 and scan.tokens is not None and scan.record.key == NOW["key"]


_pairs = st.lists(st.tuples(st.sampled_from(["prompt", "completion", "text"]), st.text(min_size=1, max_size=5)),
                  max_size=2).map(lambda ps: tuple(dict(ps).items()))


@settings(max_examples=60, deadline=None)
@given(seq=st.integers(1, 2**20), long=st.sampled_from(["drop", "truncate", "error"]),
       shift=st.sampled_from(["sample", "row", "none"]), add_eos=st.booleans(), separator=st.text(max_size=4),
       roles=st.sampled_from([("assistant",), ("assistant", "user")]), eos=st.sampled_from(["turn", "all", "none"]),
       inputs=st.booleans(), drop=st.booleans(), reads_date=st.booleans(), fp=st.none() | st.text(max_size=8))
def test_recorded_options_round_trip(seq, long, shift, add_eos, separator, roles, eos, inputs, drop, reads_date, fp):
    options = ScanOptions(tokenizer="builtin", sequence_len=seq, long=long, shift=shift, add_eos=add_eos,
                          separator=separator, roles_to_train=roles, train_on_eos=eos, train_on_inputs=inputs,
                          drop_eos_only=drop)
    recorded = RecordedOptions.of(options, fp, None, reads_date)
    d = recorded.to_json()
    assert RecordedOptions.from_json(orjson.loads(orjson.dumps(d)), "x") == recorded
    assert ("separator" in d) == (separator != "") and ("template_date" in d) == reads_date
    assert ("roles_to_train" in d) == (roles != ("assistant",)) and d["sequence_len"] == seq


_counted = st.builds(lambda n, rows: {"count": n, "first_rows": rows}, st.integers(0, 99),
                     st.lists(st.integers(0, 10**6), max_size=3))
_records = st.fixed_dictionaries({}, optional={
    "source": st.text(max_size=6), "tokenizer": st.none() | st.text(max_size=6), "format": st.sampled_from(["text"]),
    "source_paths": st.lists(st.text(max_size=4), max_size=2), "warnings": st.lists(st.text(max_size=8), max_size=2),
    "max_dropped": st.sampled_from([0, 1, 0.05, 0.5]), "seconds": st.floats(0, 100), "labels_shifted": st.booleans(),
    "rows_read": st.integers(0, 10**9), "retained": st.integers(0, 10**9), "truncated": _counted,
    "end_only": _counted, "part": st.builds(lambda a, b: {"lo": a, "hi": a + b, "rows": a + b + 1},
                                            st.integers(0, 99), st.integers(0, 99)),
    "chat_template": st.none() | st.fixed_dictionaries({"name": st.text(max_size=4), "fingerprint": st.just("f")},
                                                       optional={"origin": st.sampled_from(["builtin", "file"]),
                                                                 "generation": st.just(True)}),
    "fingerprints": st.fixed_dictionaries({"dataset": st.just("a"), "metadata": st.just("b")}),
    "text_format": st.dictionaries(st.sampled_from(["separator", "prompt_format"]), st.text(max_size=3)),
    "merged_from": st.lists(st.fixed_dictionaries({"path": st.text(max_size=4), "lo": st.integers(0, 9),
                                                   "hi": st.integers(0, 9)}), max_size=2),
})


@settings(max_examples=100, deadline=None)
@given(d=_records)
def test_any_record_reads_back_to_its_bytes(tmp_path_factory, d):
    path = tmp_path_factory.mktemp("r") / schemas.SCAN_MANIFEST_FILE
    parquet.write_json(d, path)
    again = path.with_name("again.json")
    parquet.write_json(ScanRecord.read(path).to_json(), again)
    assert again.read_bytes() == path.read_bytes()


def _refused(*args: str) -> str:
    r = runner.invoke(app, list(args))
    assert r.exit_code == 2 and "Traceback" not in r.output, r.output
    lines = [line for line in r.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), r.output
    return lines[0]


def test_a_malformed_scan_json_is_one_line_naming_file_and_entry(tmp_path):
    scan = _scan(tmp_path)
    record = scan / schemas.SCAN_MANIFEST_FILE
    good = orjson.loads(record.read_bytes())
    cases = {"sequence_len": {**good, "options": {**good["options"], "sequence_len": "64"}},
             "retained": {**good, "retained": None}, "surprise": {**good, "surprise": 1}}
    for key, bad in cases.items():
        parquet.write_json(bad, record)
        line = _refused("compile", str(scan), "-o", str(tmp_path / "p"))
        assert str(record) in line and repr(key) in line, line
    record.write_text("{not json")
    assert str(record) in _refused("compile", str(scan), "-o", str(tmp_path / "p"))


def _reads_scan_json(tree: ast.AST) -> bool:
    """Whether a function both names the scan record's file and parses JSON."""
    names = {n.id if isinstance(n, ast.Name) else n.attr for n in ast.walk(tree) if isinstance(n, ast.Name | ast.Attribute)}
    texts = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    return ("SCAN_MANIFEST_FILE" in names or "scan.json" in texts) and bool(names & {"loads", "load", "read_manifest"})


def test_only_the_record_parses_scan_json():
    readers = []
    for path in ROOT.rglob("*.py"):
        if path.name == "scan_record.py":
            continue
        tree = ast.parse(path.read_text())
        readers += [f"{path.relative_to(ROOT)}:{f.name}" for f in ast.walk(tree)
                    if isinstance(f, ast.FunctionDef) and _reads_scan_json(f)]
    assert readers == []


def test_the_rule_finds_a_reader():
    assert _reads_scan_json(ast.parse("def f(p):\n    return orjson.loads((p / SCAN_MANIFEST_FILE).read_bytes())"))

"""Bad input a new user gives: each is one `error:` line naming the file and the row, column or setting,
exit 2, no traceback, nothing written. What other test files already cover (malformed JSON lines, mistyped source
columns, unknown config keys, unsorted samples, contradicting a scan's options, ...) is not repeated here."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from plancc import api
from plancc.cli import app
from plancc.errors import SettingsError
from plancc.review.validate import validate_plan
from plancc.store import schemas
from plancc.store.plan import Plan
from tests.support import REPO
from tests.support.plans import write_samples_file

runner = CliRunner()
ROOT = REPO


def refused(*args, out: Path) -> str:
    """The one error line of a command that must fail with exit 2 and leave `out` absent."""
    r = runner.invoke(app, [str(a) for a in args])
    assert r.exit_code == 2 and "Traceback" not in r.output, r.output
    lines = [line for line in r.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), r.output
    assert not out.exists()
    return lines[0]


@pytest.fixture(scope="module")
def samples(tmp_path_factory) -> Path:
    return write_samples_file(tmp_path_factory.mktemp("samples"), seed=3, n=40, max_len=200)


def _with(samples: Path, path: Path, **columns) -> Path:
    table = pq.read_table(samples)
    for name, values in columns.items():
        if values is None:
            table = table.drop_columns([name])
        elif name in table.column_names:
            table = table.set_column(table.schema.get_field_index(name), name, values)
        else:
            table = table.append_column(name, values)
    pq.write_table(table, path)
    return path


# ---------------------------------------------------------------- samples tables


@pytest.mark.parametrize("name", ["length", "label_count", "token_hash"])
def test_a_null_in_a_samples_table_is_named_not_planned(samples, tmp_path, name):
    """A null was read as whatever bytes lay under it (the compile crashed with a segfault on a null length): run
    in a child process, so that a regression fails this test instead of killing the session."""
    table = pq.read_table(samples)
    values = table.column(name).to_pylist()
    values[5] = None
    bad = _with(samples, tmp_path / "nulls.parquet", **{name: pa.array(values, table.schema.field(name).type)})
    r = subprocess.run([sys.executable, "-m", "plancc", "compile", str(bad), "-o", str(tmp_path / "plan"), "-q"],
                       capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": str(ROOT), "PLANCC_CACHE": str(tmp_path / "cache")})
    assert r.returncode == 2 and "Traceback" not in r.stderr, (r.returncode, r.stderr)
    assert r.stderr.strip() == f"error: {bad} row 5: column '{name}' is null (1 nulls); a samples table has a value " \
                               "in every row"
    assert not (tmp_path / "plan").exists()


@pytest.mark.parametrize(("change", "says"), [
    ({"token_hash": None}, "lacks ['token_hash']"),
    ({"weight": pa.array(np.ones(40))}, "has ['weight'] besides"),
])
def test_a_samples_table_with_a_column_missing_or_extra_says_so(samples, tmp_path, change, says):
    bad = _with(samples, tmp_path / "s.parquet", **change)
    line = refused("compile", bad, "-o", tmp_path / "plan", out=tmp_path / "plan")
    assert f"{bad} looks like a samples table but {says}" in line, line


def _set_value(samples: Path, name: str, row: int, value) -> pa.Array:
    table = pq.read_table(samples)
    values = table.column(name).to_pylist()
    values[row] = value
    return pa.array(values, table.schema.field(name).type)


@pytest.mark.parametrize(("change", "says"), [
    (lambda s: {"length": pq.read_table(s).column("length").cast(pa.float64())},
     "column 'length' has type double, expected int32"),
    (lambda s: {"length": _set_value(s, "length", 7, -3)}, "row 7: length must be positive"),
    (lambda s: {"label_count": _set_value(s, "label_count", 9, 10**6)}, "row 9: label_count must be in [0, length]"),
    (lambda s: {"label_count": _set_value(s, "label_count", 11, 0),
                "first_label_supervised": _set_value(s, "first_label_supervised", 11, True)},
     "row 11: first_label_supervised is true but label_count is 0"),
    (lambda s: {"sample_id": _set_value(s, "sample_id", 5, 4)},
     "row 5: sample_id is not strictly increasing (unsorted or duplicate)"),
])
def test_a_bad_value_in_a_samples_table_names_its_row_or_column(samples, tmp_path, change, says):
    bad = _with(samples, tmp_path / "s.parquet", **change(samples))
    line = refused("compile", bad, "-o", tmp_path / "plan", out=tmp_path / "plan")
    assert line.startswith(f"error: {bad}") and says in line, line


def test_a_corrupt_parquet_source_is_one_line(samples, tmp_path):
    bad = tmp_path / "cut.parquet"
    bad.write_bytes(samples.read_bytes()[:300])
    line = refused("compile", bad, "-o", tmp_path / "plan", out=tmp_path / "plan")
    assert line.startswith(f"error: {bad}: not a readable Parquet file"), line


@pytest.mark.parametrize("command", [["validate"], ["inspect", "metrics"], ["inspect", "plan"], ["diff", "OTHER"]])
def test_a_plan_directory_without_plan_parquet_is_one_line(scanned, tmp_path, command):
    plan = _copy(scanned, "plan", tmp_path)
    (plan / schemas.PLAN_FILE).unlink()
    args = [str(scanned / "plan") if a == "OTHER" else a for a in command]
    line = refused(*args, plan, out=tmp_path / "never")
    assert line == f"error: {plan} is not a plan directory (no plan.parquet); write one with `plancc compile " \
                   "SOURCE -o PLAN_DIR`", line


@pytest.mark.parametrize(("labels", "says"), [([1, 2, "x"], "a list holding str 'x' at position 2"),
                                              ([1, True, 3], "a list holding bool True at position 1"),
                                              ("1 2 3", "str value")])
def test_a_tokenized_row_with_a_wrong_label_names_the_value(tmp_path, labels, says):
    source = tmp_path / "t.jsonl"
    source.write_text(json.dumps({"input_ids": [1, 2, 3], "labels": [1, 2, 3]}) + "\n"
                      + json.dumps({"input_ids": [1, 2, 3], "labels": labels}) + "\n")
    line = refused("compile", source, "-o", tmp_path / "plan", "-q", "--cache-dir", tmp_path / "cache",
                   out=tmp_path / "plan")
    assert line == f"error: {source} row 1 (line 2): column 'labels' has {says}, expected a list of integers", line


# ---------------------------------------------------------------- config files


@pytest.mark.parametrize(("text", "says"), [
    ('sequence_len = "big"', "sequence_len must be a positive integer, got 'big'"),
    ("world_size = 2.5", "world_size must be a positive integer, got 2.5"),
    ('drop_last = "false"', "drop_last must be true or false, got 'false'"),
    ('balance = "no"', "balance must be true or false, got 'no'"),
    ("num_proc = 0", "num_proc must be a positive integer, got 0"),
    ("columns = 3", "columns must be role=field pairs (a string or a mapping), got 3"),
    ('mode = "padd"', "mode must be one of packed, padded, flattened; got 'padd'"),
])
@pytest.mark.parametrize("suffix", [".toml", ".yaml"])
def test_a_config_value_of_the_wrong_type_names_the_file_and_setting(samples, tmp_path, text, says, suffix):
    config = tmp_path / f"c{suffix}"
    config.write_text(text.replace(" = ", ": ") if suffix == ".yaml" else text)
    line = refused("compile", samples, "-o", tmp_path / "plan", "--config", config, out=tmp_path / "plan")
    assert line == f"error: config file {config}: {says}", line


def test_a_flag_overriding_a_bad_config_value_is_what_is_checked(samples, tmp_path):
    config = tmp_path / "c.toml"
    config.write_text('sequence_len = "big"\n')
    line = refused("compile", samples, "-o", tmp_path / "plan", "--config", config, "--sequence-len", "0",
                   out=tmp_path / "plan")
    assert line == "error: --sequence-len must be a positive integer, got 0"
    r = runner.invoke(app, ["compile", str(samples), "-o", str(tmp_path / "plan"), "--config", str(config),
                            "--sequence-len", "512", "-q"])
    assert r.exit_code == 0, r.output


def test_a_switch_given_a_string_in_the_api_is_refused(samples, tmp_path):
    with pytest.raises(SettingsError, match="--drop-last must be true or false, got 'false'"):
        api.compile(samples, tmp_path / "plan", drop_last="false")
    with pytest.raises(SettingsError, match="--add-eos must be true or false"):
        api.compile(samples, tmp_path / "plan", add_eos=1)
    assert not (tmp_path / "plan").exists()


# ---------------------------------------------------------------- scan and plan directories as SOURCE


@pytest.fixture(scope="module")
def scanned(tmp_path_factory) -> Path:
    """A scan directory and a plan compiled from it (real files, so that a test's edit reaches nothing else)."""
    tmp = tmp_path_factory.mktemp("scanned")
    source = tmp / "d.jsonl"
    source.write_text("".join(json.dumps({"prompt": f"q{i} " * (i % 9 + 1), "completion": "a " * (i % 5 + 1)}) + "\n"
                              for i in range(30)))
    for args in (["scan", source, "-o", tmp / "scan", "--tokenizer", "builtin", "--sequence-len", "128"],
                 ["compile", tmp / "scan", "-o", tmp / "plan"]):
        r = runner.invoke(app, [*map(str, args), "-q", "--cache-dir", str(tmp / "cache")])
        assert r.exit_code == 0, r.output
    return tmp


def _copy(scanned: Path, name: str, tmp_path: Path) -> Path:
    return Path(shutil.copytree(scanned / name, tmp_path / name))


def _edit_label_count(path: Path) -> None:
    table = pq.read_table(path)
    values = table.column("label_count").to_numpy().copy()
    values[3] -= 1
    pq.write_table(table.set_column(2, "label_count", pa.array(values, pa.int32()))
                   .replace_schema_metadata(table.schema.metadata), path)


@pytest.mark.parametrize("name", ["scan", "plan"])
def test_an_edited_samples_table_of_a_scan_or_plan_is_not_compiled(scanned, tmp_path, name):
    """It used to be planned as it was: the plan's fingerprints were recomputed from the edited rows, and only a
    full validate comparing them with the tokens could tell."""
    directory = _copy(scanned, name, tmp_path)
    _edit_label_count(directory / schemas.SAMPLES_FILE)
    line = refused("compile", directory, "-o", tmp_path / "out", out=tmp_path / "out")
    if name == "scan":  # against the record of the scan
        assert f"{directory / schemas.SAMPLES_FILE}: its rows do not hash to the metadata fingerprint " \
               f"{directory / schemas.SCAN_MANIFEST_FILE} records" in line, line
    else:  # through the plan, against its plan file (manifest.json is only a mirror)
        assert f"{directory / schemas.SAMPLES_FILE}: its rows do not hash to the plan's metadata fingerprint" \
               in line, line


def test_a_token_store_swapped_into_a_scan_is_not_compiled(scanned, tmp_path):
    directory = _copy(scanned, "scan", tmp_path)
    other = tmp_path / "other.jsonl"
    other.write_text(json.dumps({"prompt": "x", "completion": "y"}) + "\n")
    r = runner.invoke(app, ["scan", str(other), "-o", str(tmp_path / "other"), "--tokenizer", "builtin", "-q",
                            "--sequence-len", "128", "--cache-dir", str(tmp_path / "cache")])
    assert r.exit_code == 0, r.output
    shutil.rmtree(directory / schemas.TOKENS_DIR)
    shutil.copytree(tmp_path / "other" / schemas.TOKENS_DIR, directory / schemas.TOKENS_DIR)
    line = refused("compile", directory, "-o", tmp_path / "out", out=tmp_path / "out")
    assert "swapped in from another scan" in line, line


def test_a_plan_directory_without_its_samples_table_says_so(scanned, tmp_path):
    plan = _copy(scanned, "plan", tmp_path)
    (plan / schemas.SAMPLES_FILE).unlink()
    line = refused("compile", plan, "-o", tmp_path / "out", out=tmp_path / "out")
    assert line == f"error: {plan} is a plancc plan directory without its samples.parquet: it was deleted or moved; " \
                   "compile or scan the source again"
    problems, _ = validate_plan(str(plan))
    assert problems == [f"{plan / schemas.SAMPLES_FILE} does not exist"]  # once, not once per check of the file


# ---------------------------------------------------------------- a scan's samples table on its own


def test_a_scans_samples_table_alone_carries_the_scans_sequence_len_and_shift(scanned, tmp_path, samples):
    """`sequence_len` and `shift` live in both the scan options and the plan settings. A scan's samples.parquet
    compiled on its own (copied out of its scan directory) was planned under the flags' or the defaults' values:
    `--shift none` counted every sample's first label as a target, so each update's num_items was wrong. Its
    metadata records the scan's options, so it now carries them as its scan directory does (`plancc.build.carry`)."""
    alone = Path(shutil.copy(scanned / "scan" / schemas.SAMPLES_FILE, tmp_path / "alone.parquet"))
    for flag, value in [("--shift", "none"), ("--sequence-len", "4096")]:
        line = refused("compile", alone, "-o", tmp_path / "p", flag, value, out=tmp_path / "p")
        assert f"{flag} {value} contradicts the scan of {alone}" in line, line
    r = runner.invoke(app, ["compile", str(alone), "-o", str(tmp_path / "p"), "--json"])
    assert r.exit_code == 0, r.output
    assert {k: json.loads(r.stdout)["settings"][k] for k in ("sequence_len", "shift")} == {"sequence_len": 128,
                                                                                           "shift": "sample"}
    same = Plan(scanned / "plan")  # compiled from the scan directory: the same plan
    assert Plan(tmp_path / "p").fingerprints["plan"] == same.fingerprints["plan"]
    r = runner.invoke(app, ["compile", str(samples), "-o", str(tmp_path / "q"), "--shift", "none", "-q"])
    assert r.exit_code == 0, r.output  # a samples table no plancc scan wrote: nothing recorded, the flags rule


def test_validate_refuses_a_plan_whose_settings_are_not_its_scans(scanned, tmp_path):
    """The rule `carry` keeps, checked on disk: a plan's sequence_len and shift are those its samples were scanned
    with (its manifest's scan options). Forged here in the plan file's metadata and the manifest alike."""
    plan = _copy(scanned, "plan", tmp_path)
    table = pq.read_table(plan / schemas.PLAN_FILE)
    meta = json.loads(table.schema.metadata[schemas.META_KEY])
    meta["scan"]["options"]["shift"] = "none"
    pq.write_table(table.replace_schema_metadata({schemas.META_KEY: json.dumps(meta).encode()}), plan / schemas.PLAN_FILE,
                   row_group_size=schemas.PLAN_ROW_GROUP)
    manifest = json.loads((plan / schemas.MANIFEST_FILE).read_text())
    manifest["scan"]["options"]["shift"] = "none"
    (plan / schemas.MANIFEST_FILE).write_text(json.dumps(manifest))
    r = runner.invoke(app, ["validate", str(plan)])
    assert r.exit_code == 1 and "Traceback" not in r.output, r.output
    assert r.output.strip() == (f"violation: {plan / schemas.PLAN_FILE} metadata: settings.shift is 'sample', but its "
                                "samples were scanned with shift 'none' (scan.options.shift)")


# ---------------------------------------------------------------- unreadable files


def _as_a_user(cmd: list[str], tmp_path: Path) -> list[str]:
    """`cmd` run without the power to read a file its mode forbids: as root (CI's containers), through setpriv
    dropping the capabilities that bypass file modes; skipped where that cannot be done."""
    if os.geteuid() != 0:
        return cmd
    drop = ["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--inh-caps=-dac_override,-dac_read_search"]
    probe = tmp_path / "probe"
    probe.write_text("x")
    probe.chmod(0)
    if shutil.which("setpriv") is None or subprocess.run([*drop, "cat", str(probe)], capture_output=True).returncode == 0:
        pytest.skip("cannot drop root's file-mode override here")
    return [*drop, *cmd]


def test_unreadable_files_are_one_named_line(scanned, tmp_path):
    source = tmp_path / "d.jsonl"
    source.write_text(json.dumps({"text": "a b c"}) + "\n")
    plan = _copy(scanned, "plan", tmp_path)
    header = plan / schemas.TOKENS_DIR / "tokens.json"
    header.unlink()  # a hard link to the scan's: a file of its own, to take its mode away
    header.write_bytes((scanned / "plan" / schemas.TOKENS_DIR / "tokens.json").read_bytes())
    for f in (source, header):
        f.chmod(0)
    cases = [
        (["compile", str(source), "-o", str(tmp_path / "out"), "--tokenizer", "builtin", "-q"], 2,
         f"error: {source} Permission denied"),
        (["validate", str(plan), "-q"], 1, f"violation: token store {plan / schemas.TOKENS_DIR}: cannot read tokens.json "
                                           "(Permission denied)"),
    ]
    script = ("import json, sys\nfrom typer.testing import CliRunner\nfrom plancc.cli import app\n"
              "for args in json.loads(sys.argv[1]):\n"
              "    r = CliRunner().invoke(app, args)\n"
              "    print(json.dumps([r.exit_code, r.output.strip()]))\n")  # one process (start-up) for every case
    r = subprocess.run(_as_a_user([sys.executable, "-c", script, json.dumps([c[0] for c in cases])], tmp_path),
                       capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": str(ROOT), "PLANCC_CACHE": str(tmp_path / "cache")})
    assert r.returncode == 0, r.stderr
    assert [tuple(json.loads(line)) for line in r.stdout.splitlines()] == [(code, line) for _, code, line in cases]
    assert not (tmp_path / "out").exists()

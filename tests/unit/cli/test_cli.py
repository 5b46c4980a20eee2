"""The CLI as a user meets it: exit codes 0/1/2, config files under flags, JSON output, clear errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from plancc.cli import app
from plancc.store import schemas, token_store
from tests.support.plans import write_samples_file

runner = CliRunner()


@pytest.fixture(scope="module")
def samples_file(tmp_path_factory) -> Path:
    return write_samples_file(tmp_path_factory.mktemp("src"), 3, 300, 200)


def _run(*args: str):
    return runner.invoke(app, [str(a) for a in args])


def test_compile_from_a_samples_table_then_validate(tmp_path, samples_file):
    out = tmp_path / "plan"
    res = _run("compile", samples_file, "-o", out, "--sequence-len", "256", "--micro-batch-size", "2",
               "--world-size", "2", "--grad-accum", "2", "--json")
    assert res.exit_code == 0, res.output
    manifest = json.loads(res.output)
    assert manifest["settings"]["world_size"] == 2 and manifest["samples"] == 300
    assert _run("validate", out).exit_code == 0
    res = _run("compile", samples_file, "-o", tmp_path / "attention", "--sequence-len", "256", "--world-size", "2",
               "--grad-accum", "2", "--cost", "attention", "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["settings"]["cost"] == "attention"
    assert _run("validate", tmp_path / "attention").exit_code == 0


def test_flags_override_the_config_file(tmp_path, samples_file):
    config = tmp_path / "plan.yaml"
    config.write_text("sequence-len: 256\nmicro_batch_size: 3\nseed: 7\nmode: padded\n")
    res = _run("compile", samples_file, "-o", tmp_path / "plan", "--config", config, "--seed", "9", "--json")
    assert res.exit_code == 0, res.output
    settings = json.loads(res.output)["settings"]
    assert (settings["micro_batch_size"], settings["seed"], settings["mode"]) == (3, 9, "padded")
    toml = tmp_path / "plan.toml"
    toml.write_text('sequence_len = 256\nshift = "row"\n')
    res = _run("compile", samples_file, "-o", tmp_path / "plan2", "--config", toml, "--json")
    assert json.loads(res.output)["settings"]["shift"] == "row"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--micro-batch-size", "0"], "--micro-batch-size must be a positive integer"),
        (["--world-size", "-2"], "--world-size must be a positive integer"),
        (["--mode", "sideways"], "--mode must be one of packed, padded, flattened"),
        (["--balance-window", "65"], "--balance-window must be at most 64"),
        (["--sequence-len", "16"], "longer than 16 tokens"),
        (["--drop-last", "--world-size", "64", "--grad-accum", "64", "--sequence-len", "256"], "--drop-last leaves"),
        (["--mode", "padded", "--real-batches"], "--real-batches only applies"),
        (["--cost", "flops"], "--cost must be one of tokens, attention"),
    ],
)
def test_bad_settings_exit_2_with_the_setting_named(tmp_path, samples_file, args, message):
    res = _run("compile", samples_file, "-o", tmp_path / "plan", *args)
    assert res.exit_code == 2
    assert message in res.output
    assert not (tmp_path / "plan").exists()


def test_bad_config_file_exits_2(tmp_path, samples_file):
    config = tmp_path / "c.toml"
    config.write_text("micro_batch_sise = 2\n")
    res = _run("compile", samples_file, "-o", tmp_path / "plan", "--config", config)
    assert res.exit_code == 2 and "unknown setting 'micro_batch_sise'" in res.output
    config.write_text("micro_batch_size = [\n")
    res = _run("compile", samples_file, "-o", tmp_path / "plan", "--config", config)
    assert res.exit_code == 2 and "not valid" in res.output


def test_validate_exits_1_on_a_violation_and_2_on_a_non_plan(tmp_path, samples_file):
    out = tmp_path / "plan"
    assert _run("compile", samples_file, "-o", out, "--sequence-len", "256", "--quiet").exit_code == 0
    table = pq.read_table(out / schemas.PLAN_FILE)
    pq.write_table(table.slice(1), out / schemas.PLAN_FILE)  # drop one microbatch, keep the metadata
    res = _run("validate", out)
    assert res.exit_code == 1 and "violation" in res.output
    assert _run("validate", tmp_path).exit_code == 2


def test_a_real_process_prints_no_traceback(tmp_path):
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"PAR1 this is not parquet")
    proc = subprocess.run([sys.executable, "-m", "plancc", "compile", str(bad), "-o", str(tmp_path / "p")],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and "error:" in proc.stderr


@pytest.mark.parametrize("command", [["compile"], ["scan"], ["validate"], ["show"], ["inspect", "metrics"],
                                     ["inspect", "plan"], ["diff"]])
def test_every_command_has_help_with_an_example(command):
    res = _run(*command, "--help")
    assert res.exit_code == 0 and "Example" in res.output


def test_scan_then_compile_carries_the_tokenized_rows_and_validate_rescans(tmp_path):
    rows = [{"prompt": f"Question {i}: " + "why? " * (i % 7), "completion": "because " * (1 + i % 11)} for i in range(60)]
    source = tmp_path / "pc.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cache = tmp_path / "cache"
    assert _run("scan", source, "-o", tmp_path / "scan", "--sequence-len", "256", "--tokenizer", "builtin",
                "--cache-dir", cache).exit_code == 0
    plan = tmp_path / "plan"
    res = _run("compile", tmp_path / "scan", "-o", plan, "--sequence-len", "256", "--json")
    assert res.exit_code == 0, res.output
    manifest = json.loads(res.output)
    assert manifest["data"]["tokens"] == schemas.TOKENS_DIR and token_store.is_store(plan / schemas.TOKENS_DIR)
    assert manifest["data"]["source"] == [str(source)]
    assert manifest["scan"]["format"] == "prompt_completion"
    res = _run("validate", plan, "--dataset", source, "--cache-dir", cache)
    assert res.exit_code == 0 and "dataset content" in res.output
    rows[5]["completion"] = "a different answer"
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))
    res = _run("validate", plan, "--dataset", source, "--cache-dir", cache)
    assert res.exit_code == 1 and "the data changed since compile" in res.output

"""`--engine ray` (a local Ray, 2 CPUs): the same scan as the local engine, byte for byte, for any number of units;
bad input still names file, row and column. Few tests: each Ray start costs seconds."""

from __future__ import annotations

import os
import subprocess
import sys

import orjson
import pytest

from plancc import api, store, token_store
from tests.sources_fixtures import (
    DEEPSEEK_JSON,
    alpaca_rows,
    chatterbot_conversations,
    deepseek_dir,
    write_rows,
)

ray = pytest.importorskip("ray")
from plancc import ray_scan  # noqa: E402  (after the skip: imports nothing of Ray by itself)


def _assert_same_scan(a, b) -> None:
    """Two scan directories hold the same samples table (bytes), token store content and fingerprints."""
    assert (a / store.SAMPLES_FILE).read_bytes() == (b / store.SAMPLES_FILE).read_bytes()
    ra, rb = (orjson.loads((d / store.SCAN_MANIFEST_FILE).read_bytes()) for d in (a, b))
    assert ra["fingerprints"] == rb["fingerprints"]
    sa, sb = token_store.open_store(a / store.TOKENS_DIR), token_store.open_store(b / store.TOKENS_DIR)
    assert sa.header["fingerprints"] == sb.header["fingerprints"]
    assert token_store.verify_all(sb) is None


def test_cli_bad_row_under_ray_names_file_row_column(tmp_path):
    """A local Ray started (and stopped) by the command itself; the error is plancc's one line, no Ray traceback."""
    rows = alpaca_rows(40)
    rows[27]["output"] = {"not": "text"}
    src = write_rows(tmp_path / "bad.jsonl", rows)
    run = subprocess.run([sys.executable, "-m", "plancc", "scan", str(src), "-o", str(tmp_path / "s"), "--tokenizer",
                          str(DEEPSEEK_JSON), "--engine", "ray", "--num-proc", "2"],
                         capture_output=True, text=True, env={**os.environ, "PLANCC_CACHE": str(tmp_path / "cache")}, timeout=300)
    assert run.returncode == 2, run.stderr
    assert "bad.jsonl row 27" in run.stderr and "'output'" in run.stderr, run.stderr
    assert "Traceback" not in run.stderr and "RayTaskError" not in run.stderr, run.stderr
    assert len(run.stderr.strip().splitlines()) <= 3, run.stderr
    assert not (tmp_path / "s").exists()


@pytest.fixture(scope="module")
def local_ray():
    with ray_scan.session(None, 2) as r:  # scans below join it instead of starting one each
        yield r


def test_ray_scan_identical_to_local(tmp_path, local_ray, monkeypatch):
    alpaca = tmp_path / "alpaca"
    alpaca.mkdir()
    rows = alpaca_rows(300)
    for k in range(3):  # several files: units span file boundaries
        write_rows(alpaca / f"part-{k}.json", rows[k * 100:(k + 1) * 100])
    chat = write_rows(tmp_path / "chat.jsonl", [{"messages": c} for c in chatterbot_conversations(120)])
    cases = [(str(alpaca / "*.json"), {"tokenizer": str(DEEPSEEK_JSON)}),
             (str(chat), {"tokenizer": str(deepseek_dir(tmp_path, "llama3"))})]
    one_unit = ray_scan.UNIT_MIN_ROWS
    for i, (source, settings) in enumerate(cases):
        local = tmp_path / f"local-{i}"
        api.scan(source, local, cache_dir=tmp_path / f"c-local-{i}", **settings)
        for min_rows in (one_unit, 1):  # one unit; eight (300 rows: some span two files)
            monkeypatch.setattr(ray_scan, "UNIT_MIN_ROWS", min_rows)
            out = tmp_path / f"ray-{i}-{min_rows}"
            api.scan(source, out, engine="ray", cache_dir=tmp_path / f"c-ray-{i}-{min_rows}", **settings)
            _assert_same_scan(local, out)
        plans = [api.compile(d, tmp_path / f"plan-{d.name}", world_size=2, micro_batch_size=2)
                 for d in (local, tmp_path / f"ray-{i}-1")]
        assert plans[0].fingerprints == plans[1].fingerprints

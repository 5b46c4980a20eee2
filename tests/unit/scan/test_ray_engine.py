"""`--engine ray` (a local Ray, 2 CPUs): the same scan as the local engine, byte for byte, for any number of units;
bad input still names file, row and column. Few tests: each Ray start costs seconds."""

from __future__ import annotations

import os
import subprocess
import sys

import orjson
import pytest

from plancc import api
from plancc.config.settings import ScanOptions
from plancc.scan import shard
from plancc.store import schemas, token_store
from tests.support.plans import plan_files
from tests.support.sources import (
    DEEPSEEK_JSON,
    alpaca_rows,
    chatterbot_conversations,
    deepseek_dir,
    write_rows,
)

ray = pytest.importorskip("ray")
from plancc.scan import ray_engine  # noqa: E402  (after the skip: imports nothing of Ray by itself)

pytestmark = pytest.mark.slow  # starts a local Ray


def _assert_same_scan(a, b) -> None:
    """Two scan directories hold the same samples table (bytes), token store content and fingerprints."""
    assert (a / schemas.SAMPLES_FILE).read_bytes() == (b / schemas.SAMPLES_FILE).read_bytes()
    ra, rb = (orjson.loads((d / schemas.SCAN_MANIFEST_FILE).read_bytes()) for d in (a, b))
    assert ra["fingerprints"] == rb["fingerprints"]
    sa, sb = token_store.open_store(a / schemas.TOKENS_DIR), token_store.open_store(b / schemas.TOKENS_DIR)
    assert sa.header["fingerprints"] == sb.header["fingerprints"] and sa.digest == sb.digest
    assert token_store.verify_all(sb) is None


def test_cli_bad_row_under_ray_names_file_row_column(tmp_path):
    """A local Ray started (and stopped) by the command itself. The bad turn is found while encoding, on a Ray
    worker (not by the format check before): the error is still plancc's one line, no Ray traceback."""
    convs = chatterbot_conversations(40, system=False)
    convs[27] = [{"role": "narrator", "content": "x"}]
    src = write_rows(tmp_path / "bad.jsonl", [{"messages": c} for c in convs])
    run = subprocess.run([sys.executable, "-m", "plancc", "scan", str(src), "-o", str(tmp_path / "s"), "--tokenizer",
                          str(deepseek_dir(tmp_path, "deepseek")), "--engine", "ray", "--num-proc", "2"],
                         capture_output=True, text=True, env={**os.environ, "PLANCC_CACHE": str(tmp_path / "c")},
                         timeout=300)
    assert run.returncode == 2, run.stderr
    assert "bad.jsonl row 27 (line 28)" in run.stderr and "unknown role narrator" in run.stderr, run.stderr
    assert "Traceback" not in run.stderr and "RayTaskError" not in run.stderr, run.stderr
    assert len(run.stderr.strip().splitlines()) <= 3, run.stderr
    assert not (tmp_path / "s").exists()


@pytest.fixture(scope="module")
def local_ray():
    with ray_engine.session(None, 2) as r:  # scans below join it instead of starting one each
        yield r


def test_ray_scan_identical_to_local(tmp_path, local_ray):
    alpaca = tmp_path / "alpaca"
    alpaca.mkdir()
    rows = alpaca_rows(300)
    for k in range(3):  # several files: units span file boundaries
        write_rows(alpaca / f"part-{k}.json", rows[k * 100:(k + 1) * 100])
    chat = write_rows(tmp_path / "chat.jsonl", [{"messages": c} for c in chatterbot_conversations(120)])
    cases = [(str(alpaca / "*.json"), {"tokenizer": str(DEEPSEEK_JSON)}),
             (str(chat), {"tokenizer": str(deepseek_dir(tmp_path, "llama3"))})]
    for i, (source, settings) in enumerate(cases):
        local = tmp_path / f"local-{i}"
        api.scan(source, local, cache_dir=tmp_path / f"c-local-{i}", **settings)
        for rows in (None, 38):  # one unit (the default size); eight, some spanning two files
            out = tmp_path / f"ray-{i}-{rows}"
            api.scan(source, out, engine="ray", shard_rows=rows, cache_dir=tmp_path / f"c-ray-{i}-{rows}",
                     **settings)
            _assert_same_scan(local, out)
        plans = [api.compile(d, tmp_path / f"plan-{d.name}", world_size=2, micro_batch_size=2)
                 for d in (local, tmp_path / f"ray-{i}-38")]
        # one store vs eight parts: the same digest, so every fingerprint and every plan file, byte for byte
        assert plans[0].fingerprints == plans[1].fingerprints and isinstance(plans[0].fingerprints["tokens"], str)
        assert plan_files(plans[0].path) == plan_files(plans[1].path)


def test_ray_scan_reuses_finished_parts(tmp_path, local_ray):
    """A part an interrupted run finished (here written beforehand by `scan_part` itself) is not scanned again:
    the scan's token store holds that very file (a hard link to it), and the result is still the local one."""
    src = write_rows(tmp_path / "a.jsonl", alpaca_rows(300))
    options = ScanOptions(tokenizer=str(DEEPSEEK_JSON))
    job = shard.prepare(str(src), options)
    part = tmp_path / "c" / "scans" / f"{job.key}.parts" / shard.part_name(0, 38)
    shard.scan_part(job, 0, 38, part, owned=True)
    ids = (part / schemas.TOKENS_DIR / "input_ids.npy").stat().st_ino
    api.scan(str(src), tmp_path / "ray", engine="ray", shard_rows=38, cache_dir=tmp_path / "c",
             tokenizer=str(DEEPSEEK_JSON))
    assert (tmp_path / "ray" / schemas.TOKENS_DIR / "part-00000" / "input_ids.npy").stat().st_ino == ids
    api.scan(str(src), tmp_path / "local", cache_dir=tmp_path / "c-local", tokenizer=str(DEEPSEEK_JSON))
    _assert_same_scan(tmp_path / "local", tmp_path / "ray")

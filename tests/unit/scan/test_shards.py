"""Sharded scans (docs/spec.md §2, scale-out): a local scan, a local scan cut in many shards, and `--shard I/N` parts joined by
`merge` give byte-identical samples tables, identical fingerprints and identical plans; merge refuses parts that
do not fit; a killed scan resumes from its finished shards; the multi-part token store reads as one dataset."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import jsonschema
import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from plancc import api
from plancc.cli import app
from plancc.config.settings import ScanOptions
from plancc.errors import InputError
from plancc.review.validate import validate_plan
from plancc.runtime import load_tokens, verified_plan
from plancc.scan import merge, shard
from plancc.scan.scanner import scan, scan_shard, write_scan
from plancc.store import parquet, schemas, token_store, token_writer
from tests.support import REPO
from tests.support.plans import plan_files
from tests.support.sources import alpaca_rows, chatterbot_conversations, deepseek_dir, write_rows

ROOT = REPO
runner = CliRunner()
PLAN = {"sequence_len": 512, "micro_batch_size": 2, "world_size": 2, "grad_accum": 2, "epochs": 2}


def _alpaca(tmp_path: Path) -> tuple[Path, ScanOptions]:
    rows = [{**r, "output": r["output"] + " because " + "adding doubles it. " * (i % 5)}
            for i, r in enumerate(alpaca_rows(70))]
    return write_rows(tmp_path / "alpaca.json", rows), ScanOptions(tokenizer=str(deepseek_dir(tmp_path, "llama3")),
                                                                   sequence_len=512)


def _chat(tmp_path: Path) -> tuple[Path, ScanOptions]:
    """Messages JSONL in two files: shards cross the file boundary."""
    convs = [{"messages": c} for c in chatterbot_conversations(90)]
    d = tmp_path / "chat"
    d.mkdir()
    write_rows(d / "a.jsonl", convs[:37])
    write_rows(d / "b.jsonl", convs[37:])
    return d / "*.jsonl", ScanOptions(tokenizer=str(deepseek_dir(tmp_path, "deepseek")), sequence_len=512)


def _parts(source, options, out: Path, n: int) -> list[Path]:
    paths = []
    for i in reversed(range(n)):  # any order
        scan_shard(str(source), options, i, n, out / f"part-{i}")
        paths.append(out / f"part-{i}")
    return paths


def _bytes(scan_dir: Path) -> bytes:
    return (scan_dir / schemas.SAMPLES_FILE).read_bytes()


@pytest.mark.parametrize("data", [_alpaca, _chat], ids=["alpaca-json", "messages-jsonl"])
def test_local_many_shards_and_merged_parts_are_identical(tmp_path, data):
    source, options = data(tmp_path)
    local = scan(str(source), options, cache_dir=tmp_path / "c1")
    write_scan(local, tmp_path / "local")
    cut = scan(str(source), options, cache_dir=tmp_path / "c2", shard_rows=9, num_proc=2)  # 8-10 shards: multi-part
    write_scan(cut, tmp_path / "cut")
    assert token_store.open_store(tmp_path / "cut" / "tokens").parts
    merged = merge.merge(_parts(source, options, tmp_path / "parts", 3), tmp_path / "merged")

    want = _bytes(tmp_path / "local")
    assert _bytes(tmp_path / "cut") == want and _bytes(tmp_path / "merged") == want
    assert local.report.to_json()["fingerprints"] == cut.report.to_json()["fingerprints"] == merged.to_json()["fingerprints"]
    for key in ("rows_read", "retained", "dropped_samples", "truncated_samples", "dropped_long", "format"):
        assert local.report.to_json()[key] == cut.report.to_json()[key] == merged.to_json()[key]

    plans, digests = {}, {}
    for name in ("local", "cut", "merged"):
        api.compile(tmp_path / name, tmp_path / f"plan-{name}", **PLAN)
        plans[name] = plan_files(tmp_path / f"plan-{name}")
        digests[name] = token_store.open_store(tmp_path / f"plan-{name}" / "tokens").digest
        problems, _ = validate_plan(str(tmp_path / f"plan-{name}"))
        assert problems == []
    # one store, parts of 9 rows, parts of a third: the store's digest and every plan file are the same bytes
    assert len(set(digests.values())) == 1, digests
    assert plans["local"] == plans["cut"] == plans["merged"] and "plan.parquet" in plans["local"]
    # the merged scan's multi-part store serves the plan compiled from the local scan (validate --dataset)
    assert validate_plan(str(tmp_path / "plan-local"), tokens_dir=tmp_path / "merged" / "tokens")[0] == []

    # the runtime maps the merged (multi-part) store as one dataset: every sample's tokens as the local scan's
    one = load_tokens(verified_plan(tmp_path / "plan-local"), verify="hash")
    many = load_tokens(verified_plan(tmp_path / "plan-merged"), verify="hash")
    ids = parquet.column(local.samples, "sample_id")
    for arr in ("input_ids", "targets"):
        a, b = getattr(one, arr), getattr(many, arr)
        for i in ids:
            s, e = one.offsets[i], one.offsets[i + 1]
            assert np.array_equal(a[s:e], b[many.offsets[i]:many.offsets[i + 1]])
    assert one.max_id == many.max_id


@settings(max_examples=15)  # each example is a scan plus n part scans and a merge: ~1 s
@given(rows=st.integers(1, 40), n=st.integers(1, 7), cut=st.integers(1, 50))
def test_any_shard_count_and_size_gives_the_local_table(tmp_path_factory, rows, n, cut):
    tmp = tmp_path_factory.mktemp("any")
    source = write_rows(tmp / "d.jsonl", [{"text": f"row {i} " * (1 + i % 4)} for i in range(rows)])
    options = ScanOptions(tokenizer="builtin")
    local = scan(str(source), options, cache_dir=tmp / "c", shard_rows=cut)
    write_scan(local, tmp / "local")
    merged = merge.merge(_parts(source, options, tmp / "parts", n), tmp / "merged")
    assert _bytes(tmp / "merged") == _bytes(tmp / "local")
    assert merged.to_json()["fingerprints"] == local.report.to_json()["fingerprints"]
    stores = [token_store.open_store(tmp / name / "tokens") for name in ("local", "merged")]
    assert stores[0].digest == stores[1].digest  # parts of any sizes: the digest of one store of the same rows
    assert all(token_store.verify_all(m) is None for m in stores)


def test_merge_refuses_parts_that_do_not_fit(tmp_path):
    source = write_rows(tmp_path / "d.jsonl", [{"text": f"row {i}"} for i in range(30)])
    options = ScanOptions(tokenizer="builtin")
    p = _parts(source, options, tmp_path / "p3", 3)  # p[0] is part 2 (rows 20..29), p[2] part 0
    two = _parts(source, options, tmp_path / "p2", 2)  # rows 0..14, 15..29
    with pytest.raises(InputError, match=r"rows 10\.\.19 of 30 are missing"):
        merge.join([p[0], p[2]])
    with pytest.raises(InputError, match=r"rows 20\.\.29 of 30 are missing"):
        merge.join([p[1], p[2]])
    with pytest.raises(InputError, match=r"part-1 \(rows 15\.\.29\) overlaps .*part-1 \(rows 10\.\.19\)"):
        merge.join([p[2], p[1], two[0]])
    other = tmp_path / "other"
    scan_shard(str(source), ScanOptions(tokenizer="builtin", sequence_len=64), 1, 3, other)
    with pytest.raises(InputError, match=r"does not fit .*sequence_len 4096 vs 64"):
        merge.join([p[0], other, p[2]])
    write_rows(tmp_path / "d2.jsonl", [{"text": f"row {i}!"} for i in range(30)])
    changed = tmp_path / "changed"
    scan_shard(str(tmp_path / "d2.jsonl"), options, 1, 3, changed)
    with pytest.raises(InputError, match="source_fingerprint"):
        merge.join([p[0], changed, p[2]])
    whole = scan(str(source), options, cache_dir=tmp_path / "c")
    write_scan(whole, tmp_path / "whole")
    with pytest.raises(InputError, match="a whole scan, not a part"):
        merge.join([tmp_path / "whole"])
    # a part whose samples were swapped for another's
    (p[1] / schemas.SAMPLES_FILE).unlink()
    (p[1] / schemas.SAMPLES_FILE).write_bytes((p[0] / schemas.SAMPLES_FILE).read_bytes())
    with pytest.raises(InputError, match="does not match its recorded fingerprints"):
        merge.join(p)
    assert not (tmp_path / "out").exists()


def test_cli_shard_merge_compile(tmp_path):
    source = write_rows(tmp_path / "d.jsonl", alpaca_rows(25))
    for i in range(2):
        r = runner.invoke(app, ["scan", str(source), "-o", str(tmp_path / f"s{i}"), "--tokenizer", "builtin",
                                "--shard", f"{i}/2"])
        assert r.exit_code == 0, r.output
        assert "part: rows" in r.output and "plancc merge" in r.output
    r = runner.invoke(app, ["compile", str(tmp_path / "s0"), "-o", str(tmp_path / "plan")])
    assert r.exit_code == 2 and "partial scan" in r.output and "plancc merge" in r.output
    r = runner.invoke(app, ["merge", str(tmp_path / "s0"), "-o", str(tmp_path / "m")])
    assert r.exit_code == 2 and "rows 12..24 of 25 are missing" in r.output
    assert not (tmp_path / "m").exists()
    r = runner.invoke(app, ["merge", str(tmp_path / "s1"), str(tmp_path / "s0"), "-o", str(tmp_path / "m")])
    assert r.exit_code == 0, r.output
    assert "merged from 2 parts" in r.output
    r = runner.invoke(app, ["merge", str(tmp_path / "s1"), str(tmp_path / "s0"), "-o", str(tmp_path / "m")])
    assert r.exit_code == 2 and "--overwrite" in r.output
    parts = [str(tmp_path / "s1"), str(tmp_path / "s0")]
    r = runner.invoke(app, ["merge", *parts, "-o", str(tmp_path / "m"), "--overwrite", "--quiet"])
    assert r.exit_code == 0 and r.stdout == ""
    r = runner.invoke(app, ["merge", *parts, "-o", str(tmp_path / "m"), "--overwrite", "--json"])
    assert r.exit_code == 0 and orjson.loads(r.stdout)["retained"] == 25
    r = runner.invoke(app, ["scan", str(source), "-o", str(tmp_path / "x"), "--tokenizer", "builtin",
                            "--shard", "2/2"])
    assert r.exit_code == 2 and "0 <= I < N" in r.output
    r = runner.invoke(app, ["show", str(tmp_path / "s1"), "--sample", "20", "--no-color"])
    assert r.exit_code == 0 and "Add 20 and 20" in r.output  # a part's store starts at its first row
    r = runner.invoke(app, ["compile", str(tmp_path / "m"), "-o", str(tmp_path / "plan"), "-q"])
    assert r.exit_code == 0, r.output


def test_more_shards_than_rows(tmp_path):
    source = write_rows(tmp_path / "d.jsonl", [{"text": "a b"}, {"text": "c"}])
    options = ScanOptions(tokenizer="builtin")
    merged = merge.merge(_parts(source, options, tmp_path / "p", 5), tmp_path / "m")
    assert merged.to_json()["retained"] == 2
    assert token_store.open_store(tmp_path / "m" / "tokens").header["rows"] == 2


def _scan_cli(source: Path, out: Path, cache: Path, fault: str | None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PLANCC_CACHE": str(cache), "PYTHONPATH": str(ROOT)}
    env.pop("PLANCC_FAULT", None)
    if fault:
        env["PLANCC_FAULT"] = fault
    return subprocess.run([sys.executable, "-m", "plancc", "scan", str(source), "-o", str(out), "--tokenizer",
                           "builtin", "--shard-rows", "10", "-q"], env=env, capture_output=True, text=True,
                          timeout=300)


@pytest.mark.slow
def test_a_killed_scan_resumes_from_its_finished_shards(tmp_path):
    source = write_rows(tmp_path / "d.jsonl", alpaca_rows(45))  # 5 shards of 10 rows
    cache = tmp_path / "cache"
    killed = _scan_cli(source, tmp_path / "out", cache, "parts_written@parts=3")
    assert killed.returncode == -signal.SIGKILL
    assert not (tmp_path / "out").exists()
    work = next((cache / "scans").glob("*.parts"))
    done = sorted(p for p in work.iterdir() if not p.name.startswith("."))
    assert [p.name for p in done] == ["000000000000-000000000010", "000000000010-000000000020",
                                      "000000000020-000000000030"]
    inodes = [(p / "tokens" / "input_ids.npy").stat().st_ino for p in done]

    again = _scan_cli(source, tmp_path / "out", cache, None)
    assert again.returncode == 0, again.stderr
    assert not work.exists()  # joined into the cache entry, nothing left behind
    parts = token_store.open_store(tmp_path / "out" / "tokens").parts
    # the finished shards were not redone: the scan's first parts are the very files the killed run wrote
    assert [(p.path / "input_ids.npy").stat().st_ino for p in parts[:3]] == inodes
    clean = scan(str(source), ScanOptions(tokenizer="builtin"), cache_dir=tmp_path / "clean")
    assert _bytes(tmp_path / "out") == (clean.tokenized_path.parent / schemas.SAMPLES_FILE).read_bytes()


def test_an_over_threshold_scan_leaves_no_parts(tmp_path):
    rows = [{"text": "x" * (200 if i % 2 else 5)} for i in range(30)]
    source = write_rows(tmp_path / "d.jsonl", rows)
    with pytest.raises(InputError, match="max-dropped"):
        scan(str(source), ScanOptions(tokenizer="builtin", sequence_len=64), cache_dir=tmp_path / "c",
             shard_rows=7)
    assert list((tmp_path / "c" / "scans").iterdir()) == []


def test_row_errors_name_the_file_and_line_in_any_shard(tmp_path):
    d = tmp_path / "src"
    d.mkdir()
    write_rows(d / "a.jsonl", alpaca_rows(12))
    bad = alpaca_rows(12)
    bad[7]["output"] = 7
    write_rows(d / "b.jsonl", bad)
    with pytest.raises(InputError, match=r"b\.jsonl row 7 \(line 8\): column 'output'"):
        scan(str(d / "*.jsonl"), ScanOptions(tokenizer="builtin"), cache_dir=tmp_path / "c", shard_rows=5)
    with pytest.raises(InputError, match=r"b\.jsonl row 7 \(line 8\): column 'output'"):
        scan_shard(str(d / "*.jsonl"), ScanOptions(tokenizer="builtin"), 1, 2, tmp_path / "part")


def test_job_round_trips_through_json(tmp_path):
    source, options = _chat(tmp_path)
    job = shard.prepare(str(source), options)
    again = shard.ScanJob.from_dict(orjson.loads(orjson.dumps(job.to_dict())))
    assert again == job
    lo, hi = shard.shard_range(job.rows, 1, 2)
    report = shard.scan_part(again, lo, hi, tmp_path / "part")
    assert report.to_json()["part"] == {"lo": lo, "hi": hi, "rows": job.rows}
    assert shard.finished_part(tmp_path / "part", job.key, lo, hi) == report
    assert shard.finished_part(tmp_path / "part", job.key, lo, hi + 1) is None


# ---------------------------------------------------------------- the multi-part token store


def _store(path: Path, rows: list[list[int]]) -> Path:
    offsets = np.concatenate([[0], np.cumsum([len(r) for r in rows])]).astype(np.int64)
    ids = np.array([t for r in rows for t in r], dtype=np.int32)
    token_writer.write_store(path, ids, ids.copy(), offsets, fingerprints={}, chunk_tokens=4)
    return path


def test_concat_indexes_like_one_array(tmp_path):
    rows = [[1, 2, 3], [4], [5, 6, 7, 8, 9], [10, 11]]
    a = _store(tmp_path / "a", rows[:2])
    b = _store(tmp_path / "b", rows[2:])
    token_writer.write_parts(tmp_path / "ab", [a, b], fingerprints={}, labels_shifted=False)
    m = token_store.open_store(tmp_path / "ab")
    flat = np.arange(1, 12, dtype=np.int32)
    assert np.array_equal(m.offsets, [0, 3, 4, 9, 11]) and m.input_ids.size == 11 and m.input_ids.max() == 11
    for s in [slice(0, 11), slice(2, 6), slice(4, 9), slice(5, 5), slice(3, 4), slice(0, 11, 3)]:
        assert np.array_equal(m.input_ids[s], flat[s])
    idx = np.array([10, 0, 4, 3, 9, 9])
    assert np.array_equal(m.labels[idx], flat[idx]) and m.input_ids[7] == 8
    assert token_store.verify_all(m) is None and token_store.layout_problem(m) is None
    assert token_store.to_table(tmp_path / "ab")["input_ids"].to_pylist() == rows
    token_writer.link_store(tmp_path / "ab", tmp_path / "linked")  # as a compile places it in a plan
    assert (tmp_path / "linked" / "part-00001" / "input_ids.npy").stat().st_ino == \
        (b / "input_ids.npy").stat().st_ino


def test_a_replaced_part_is_refused(tmp_path):
    a = _store(tmp_path / "a", [[1, 2], [3]])
    b = _store(tmp_path / "b", [[4, 5]])
    token_writer.write_parts(tmp_path / "ab", [a, b], fingerprints={}, labels_shifted=False)
    part = tmp_path / "ab" / "part-00001"
    for f in part.iterdir():
        f.unlink()
    _store(part, [[4, 6]])  # same shape, other content
    m = token_store.open_store(tmp_path / "ab")  # the header alone: a part is checked when first read
    assert m.input_ids[1] == 2
    for read in (lambda: m.input_ids[3], lambda: m.offsets[3], lambda: m.parts[1]):
        with pytest.raises(token_store.TokenStoreError, match=r"part-00001 holds .* records .*replaced or rewritten"):
            read()
    assert "part-00001 holds" in token_store.parts_problem(m)
    header = orjson.loads((tmp_path / "ab" / "tokens.json").read_bytes())
    header["parts"][0]["dir"] = "../a"
    (tmp_path / "ab" / "tokens.json").write_bytes(orjson.dumps(header))
    with pytest.raises(token_store.TokenStoreError, match=r"tokens\.json was edited"):
        token_store.open_store(tmp_path / "ab")
    header["header_hash"] = token_store.header_hash(header)  # a tool that rewrites the header consistently
    (tmp_path / "ab" / "tokens.json").write_bytes(orjson.dumps(header))
    with pytest.raises(token_store.TokenStoreError, match="not a folder in it"):
        token_store.open_store(tmp_path / "ab")


def test_validate_names_a_changed_chunk_of_a_part(tmp_path):
    source = write_rows(tmp_path / "d.jsonl", alpaca_rows(30))
    options = ScanOptions(tokenizer="builtin")
    merge.merge(_parts(source, options, tmp_path / "p", 3), tmp_path / "m")
    schema = orjson.loads((ROOT / "schemas" / "tokens-parts.schema.json").read_bytes())
    jsonschema.validate(orjson.loads((tmp_path / "m" / "tokens" / "tokens.json").read_bytes()), schema)
    api.compile(tmp_path / "m", tmp_path / "plan", **{**PLAN, "sequence_len": 4096})
    ids = tmp_path / "plan" / "tokens" / "part-00002" / "input_ids.npy"
    data = bytearray(ids.read_bytes())
    ids.unlink()  # a hard link: write a new file, the scan's stays intact
    data[-1] ^= 1
    ids.write_bytes(bytes(data))
    problems, _ = validate_plan(str(tmp_path / "plan"))
    assert any("chunk" in p and "changed" in p for p in problems), problems
    assert validate_plan(str(tmp_path / "plan"), fast=True)[0] == []


def test_two_scans_of_one_source_at_once_are_serialized(tmp_path):
    import threading

    source = write_rows(tmp_path / "d.jsonl", alpaca_rows(60))
    results, errors = [], []

    def run():
        try:
            results.append(scan(str(source), ScanOptions(tokenizer="builtin"), cache_dir=tmp_path / "c",
                                shard_rows=7))
        except Exception as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and len(results) == 2
    assert results[0].samples.equals(results[1].samples) and results[0].key == results[1].key
    assert [p.name for p in (tmp_path / "c" / "scans").iterdir()] == [results[0].key]  # no parts, no locks left


def test_an_engine_running_shards_in_any_order_gives_the_local_scan(tmp_path):
    """What a cluster engine does: the shards still to do, scanned anywhere in any order by `shard.scan_part`."""
    from concurrent.futures import ThreadPoolExecutor

    source, options = _chat(tmp_path)
    seen = []

    def engine(job, todo, work):
        seen.append(list(todo))
        job = shard.ScanJob.from_dict(orjson.loads(orjson.dumps(job.to_dict())))  # as shipped to a worker
        with ThreadPoolExecutor(3) as pool:
            list(pool.map(lambda r: shard.scan_part(job, *r, work / shard.part_name(*r), owned=True), todo[::-1]))

    other = scan(str(source), options, cache_dir=tmp_path / "c1", shard_rows=16, engine=engine)
    local = scan(str(source), options, cache_dir=tmp_path / "c2")
    assert seen == [shard.local_ranges(90, 16)]
    write_scan(other, tmp_path / "a")
    write_scan(local, tmp_path / "b")
    assert _bytes(tmp_path / "a") == _bytes(tmp_path / "b")
    assert other.report.to_json()["fingerprints"] == local.report.to_json()["fingerprints"]

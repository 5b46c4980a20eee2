"""The memory-mapped token store at run time: same tensors as in-memory loading, chunks verified before they are
fed, constant-cost open checks, sharded sources as one store, relocatable plans and explicit repointing."""

from __future__ import annotations

import pickle
import shutil
import tempfile
from pathlib import Path

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

import plancc
from benchmarks.synthetic import build_plan, make_tokenized, samples_table, write_tokens
from plancc.build import run as build
from plancc.cli import app
from plancc.config.settings import PlanSettings, ScanOptions
from plancc.runtime import (
    PlanCollator,
    PlanMismatchError,
    PlanSampler,
    TokenStore,
    load_tokens,
    verified_plan,
)
from plancc.store import parquet, schemas, token_store
from plancc.store.scan_record import ScanRecord

LAYOUTS = {
    "packed": dict(mode="packed", micro_batch_size=2),
    "packed_real": dict(mode="packed", micro_batch_size=2, real_batches=True),
    "padded": dict(mode="padded", micro_batch_size=3, pad_multiple=4),
    "flattened": dict(mode="flattened", micro_batch_size=3),
}


def _mapped_file(a: np.ndarray) -> str | None:
    """The name of the file whose mapping holds `a`'s memory (None: anonymous memory, a copy)."""
    address = a.__array_interface__["data"][0]
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split(maxsplit=5)  # address range, perms, offset, device, inode[, path]
        lo, hi = (int(x, 16) for x in fields[0].split("-"))
        if lo <= address < hi:
            return Path(fields[5]).name if len(fields) == 6 else None
    return None


def _batches(plan, tokens, world=2):
    collator = PlanCollator.from_plan(plan)
    for r in range(world):
        for mb in PlanSampler(plan, rank=r, world_size=world):
            yield mb, collator(mb, tokens)


@settings(max_examples=12, deadline=None)
@given(n=st.integers(4, 40), data_seed=st.integers(0, 10_000), layout=st.sampled_from(sorted(LAYOUTS)),
       shift=st.sampled_from(["sample", "row", "none"]))
def test_mapped_store_gives_the_same_tensors_as_in_memory_loading(n, data_seed, layout, shift):
    tok = make_tokenized(n, seed=data_seed, max_len=20, shift=shift)
    with tempfile.TemporaryDirectory() as tmp:
        plan = build_plan(Path(tmp), tok=tok, shift=shift, sequence_len=24, world_size=2, **LAYOUTS[layout])
        mapped = load_tokens(plan)
        assert [_mapped_file(a) for a in (mapped.input_ids, mapped.targets, mapped.offsets)] == [
            "input_ids.npy", "labels.npy", "offsets.npy"]  # maps of the store's files, not copies
        in_memory = TokenStore.from_table(tok, shift=shift)
        assert mapped.max_id == in_memory.max_id == int(in_memory.input_ids.max())  # the header's, no ids read
        got = list(_batches(plan, mapped))
        want = list(_batches(plan, in_memory))
        assert len(got) == len(want) > 0
        for (_, a), (_, b) in zip(got, want, strict=True):
            assert a.keys() == b.keys()
            for k in a:
                if isinstance(a[k], torch.Tensor):
                    assert torch.equal(a[k], b[k]), k
                else:
                    assert np.array_equal(a[k], b[k]) if isinstance(a[k], np.ndarray) else a[k] == b[k], k
        assert mapped.guard.pending == 0  # every chunk was read, so every chunk was verified


def _flip_token(plan: Path, sample_id: int) -> None:
    """Edit one byte of one token of `sample_id` in the plan's input_ids.npy, in place (same size)."""
    m = token_store.open_store(plan / schemas.TOKENS_DIR)
    path = plan / schemas.TOKENS_DIR / "input_ids.npy"
    data = bytearray(path.read_bytes())
    pos = len(data) - 4 * m.input_ids.size + 4 * int(m.offsets[sample_id])  # after the .npy header
    data[pos] ^= 0x01
    path.write_bytes(bytes(data))


def test_tampered_chunk_is_refused_before_any_of_it_is_fed(tmp_path):
    tok = make_tokenized(60, seed=3, max_len=20)
    plan = build_plan(tmp_path, tok=tok, mode="packed", micro_batch_size=2, sequence_len=24)
    victim = 37
    _flip_token(plan, victim)
    tokens = load_tokens(plan)  # opening reads no token: the edit is found when its chunk is first read
    m = tokens.guard.mapped
    chunk = int(np.searchsorted(m.chunks, victim, side="right") - 1)  # the chunk holding the row
    collator = PlanCollator.from_plan(plan)
    fed = 0
    with pytest.raises(PlanMismatchError, match=rf"chunk {chunk} .*first: sample_id {victim}\)"):
        for mb in PlanSampler(plan):
            touched = set((np.searchsorted(m.chunks, np.asarray(mb), side="right") - 1).tolist())
            batch = collator(mb, tokens)
            assert chunk not in touched, "a batch holding a sample of the changed chunk was returned"
            fed += batch["label_count"] >= 0
    assert fed < len(PlanSampler(plan))
    with pytest.raises(PlanMismatchError, match=rf"first: sample_id {victim}\)"):
        load_tokens(plan, verify="hash")  # the full check at open finds it too
    allowed = load_tokens(plan, allow_dataset_change=True)
    with pytest.warns(UserWarning, match="allowed by allow_dataset_change"):
        for mb in PlanSampler(plan):
            collator(mb, allowed)
    res = CliRunner().invoke(app, ["validate", str(plan)])
    assert res.exit_code == 1 and f"first: sample_id {victim})" in res.output


@pytest.mark.parametrize("damage", ["truncate", "append", "index", "blocks", "foreign"])
def test_open_refuses_a_damaged_or_foreign_store_at_constant_cost(tmp_path, damage):
    plan = build_plan(tmp_path, n=30, mode="padded", micro_batch_size=2, sequence_len=24)
    tokens = plan / schemas.TOKENS_DIR
    if damage == "truncate":
        path = tokens / "labels.npy"
        path.write_bytes(path.read_bytes()[:-4])
        match = "labels.npy"
    elif damage == "append":
        with open(tokens / "offsets.npy", "ab") as f:
            f.write(b"\0" * 8)
        match = "offsets.npy has 8 bytes beyond its array"
    elif damage in ("index", "blocks"):
        name = {"index": "chunks", "blocks": "blocks"}[damage]
        h = np.load(tokens / f"{name}.npy")
        h[-1] ^= 1
        np.save(tokens / f"{name}.npy", h)
        match = f"{name}.npy"  # a chunk bound moved: the span or the index hash refuses it
    else:  # another dataset's store in its place
        other = make_tokenized(30, seed=99, max_len=20)
        shutil.rmtree(tokens)
        write_tokens(tokens, other, samples_table(other))
        match = "is not the token store this plan was compiled with"
    with pytest.raises(PlanMismatchError, match=match):
        load_tokens(plan)


def test_sharded_tokenized_source_is_one_store_and_the_plan_moves_as_one_folder(tmp_path):
    tok = make_tokenized(50, seed=5, max_len=30)
    (tmp_path / "src").mkdir()
    pq.write_table(tok.slice(0, 20), tmp_path / "src" / "part-0.parquet")
    pq.write_table(tok.slice(20), tmp_path / "src" / "part-1.parquet")
    plan = tmp_path / "plan"
    plancc.compile(str(tmp_path / "src" / "part-*.parquet"), plan, cache_dir=tmp_path / "cache",
                   scan=ScanOptions(sequence_len=32), plan=PlanSettings(mode="packed", micro_batch_size=2,
                                                                        sequence_len=32))
    manifest = orjson.loads((plan / schemas.MANIFEST_FILE).read_bytes())
    assert manifest["data"]["tokens"] == schemas.TOKENS_DIR
    assert manifest["data"]["source_relative"] == ["../src/part-0.parquet", "../src/part-1.parquet"]
    shutil.rmtree(tmp_path / "src")  # the plan no longer needs the user's files
    moved = tmp_path / "elsewhere" / "plan"
    shutil.move(plan, moved)
    shutil.rmtree(tmp_path / "cache")
    tokens = load_tokens(verified_plan(moved), verify="hash")
    whole = TokenStore.from_table(tok)
    assert np.array_equal(tokens.input_ids, whole.input_ids) and np.array_equal(tokens.offsets, whole.offsets)
    assert np.array_equal(tokens.targets, whole.targets)


def test_repointing_a_plan_at_moved_data_and_refusing_wrong_data(tmp_path):
    tok = make_tokenized(40, seed=7, max_len=20)
    table = samples_table(tok)
    write_tokens(tmp_path / "data" / schemas.TOKENS_DIR, tok, table)  # a scan-like folder holding the store
    s = parquet.sample_arrays(table)
    ps = PlanSettings(mode="packed", micro_batch_size=2, sequence_len=24)
    from plancc.planner.pipeline import compile_plan

    plan = tmp_path / "plan"
    build.write_plan_dir(plan, table, s, ps, compile_plan(s, ps), ScanRecord(), None)  # compiled from a bare samples table
    with pytest.raises(PlanMismatchError, match=r"holds no tokenized data .* pass data="):
        load_tokens(plan)
    shutil.move(tmp_path / "data", tmp_path / "moved")
    for data in (tmp_path / "moved", tmp_path / "moved" / schemas.TOKENS_DIR):
        tokens = load_tokens(plan, data=data)
        assert sum(1 for _ in _batches(plan, tokens, world=1)) == len(PlanSampler(plan))
    with pytest.raises(PlanMismatchError, match="does not exist"):
        load_tokens(plan, data=tmp_path / "data")
    other = make_tokenized(40, seed=8, max_len=20)
    write_tokens(tmp_path / "other", other, samples_table(other))
    with pytest.raises(PlanMismatchError, match=r"other does not match the plan .*changed"):
        load_tokens(plan, data=tmp_path / "other")
    runner = CliRunner()
    res = runner.invoke(app, ["validate", str(plan), "--dataset", str(tmp_path / "moved")])
    assert res.exit_code == 0 and "token data" in res.output, res.output
    res = runner.invoke(app, ["validate", str(plan), "--dataset", str(tmp_path / "other")])
    assert res.exit_code == 1 and "dataset fingerprint" in res.output


def test_a_plan_without_a_store_never_follows_the_source_paths_it_records(tmp_path):
    """A plan without a store (bare samples table) records its source's paths for people; the runtime reads no path
    from a plan's metadata (an edited one could name any file): it asks for data=, and trains on the file given."""
    tok = make_tokenized(25, seed=4, max_len=20)
    table = samples_table(tok)
    (tmp_path / "job").mkdir()
    pq.write_table(tok, tmp_path / "job" / "train.parquet")
    s = parquet.sample_arrays(table)
    ps = PlanSettings(mode="flattened", micro_batch_size=2, sequence_len=24)
    from plancc.planner.pipeline import compile_plan

    build.write_plan_dir(tmp_path / "job" / "plan", table, s, ps, compile_plan(s, ps),
                         ScanRecord.from_json({"source_paths": [str(tmp_path / "job" / "train.parquet")]}, "test"), None)
    with pytest.raises(PlanMismatchError, match=r"holds no tokenized data .* pass data="):
        load_tokens(tmp_path / "job" / "plan")
    tokens = load_tokens(tmp_path / "job" / "plan", data=tmp_path / "job" / "train.parquet")
    assert np.array_equal(tokens.input_ids, TokenStore.from_table(tok).input_ids)


def test_data_files_are_read_by_the_table_a_scan_reads_sources_with(tmp_path):
    """data= a tokenized file: every file type a scan reads gives the same tokens (a JSON array file was refused);
    another type, and a malformed line, are one error naming the file (and line)."""
    tok = make_tokenized(25, seed=4, max_len=20)
    table = samples_table(tok)
    s = parquet.sample_arrays(table)
    ps = PlanSettings(mode="flattened", micro_batch_size=2, sequence_len=24)
    from plancc.planner.pipeline import compile_plan

    build.write_plan_dir(tmp_path / "plan", table, s, ps, compile_plan(s, ps), ScanRecord(), None)
    rows = tok.to_pylist()
    pq.write_table(tok, tmp_path / "d.parquet")
    (tmp_path / "d.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    (tmp_path / "d.json").write_bytes(orjson.dumps(rows))
    (tmp_path / "columns.json").write_bytes(orjson.dumps(tok.to_pydict()))
    whole = TokenStore.from_table(tok)
    for name in ("d.parquet", "d.jsonl", "d.json", "columns.json"):
        tokens = load_tokens(tmp_path / "plan", data=tmp_path / name)
        assert np.array_equal(tokens.input_ids, whole.input_ids) and np.array_equal(tokens.targets, whole.targets)
    (tmp_path / "d.txt").write_text("x")
    with pytest.raises(PlanMismatchError, match=r"d.txt: unsupported file type '.txt' \(use one of .jsonl"):
        load_tokens(tmp_path / "plan", data=tmp_path / "d.txt")
    (tmp_path / "bad.jsonl").write_bytes(orjson.dumps(rows[0]) + b"\n{not json\n")
    with pytest.raises(PlanMismatchError, match=r"bad.jsonl line 2: malformed JSON"):
        load_tokens(tmp_path / "plan", data=tmp_path / "bad.jsonl")


def test_worker_copies_reopen_the_maps_and_verify_their_own_reads(tmp_path):
    plan = build_plan(tmp_path, n=30, mode="packed", micro_batch_size=2, sequence_len=24)
    tokens = load_tokens(plan)
    copy = pickle.loads(pickle.dumps(tokens))  # what a spawned DataLoader worker receives
    assert _mapped_file(copy.input_ids) == "input_ids.npy" and copy.guard.pending == copy.guard.mapped.num_chunks
    assert len(pickle.dumps(tokens)) < 1000  # paths, not tokens
    _flip_token(plan, 5)
    with pytest.raises(PlanMismatchError, match=r"first: sample_id 5\)"):
        copy.check(np.array([5]))


def test_to_table_is_an_arrow_view_of_the_store(tmp_path):
    tok = make_tokenized(12, seed=2)
    write_tokens(tmp_path / "t", tok, samples_table(tok))
    table = token_store.to_table(tmp_path / "t")
    assert table.column("input_ids").to_pylist() == tok.column("input_ids").to_pylist()
    assert table.column("labels").type == pa.large_list(pa.int32())
    import datasets

    assert datasets.Dataset(table)[3]["labels"] == tok.column("labels")[3].as_py()  # the documented access


@pytest.mark.parametrize("damage", ["deleted", "file deleted", "emptied", "truncated", "swapped"])
def test_validate_checks_the_plans_token_data(tmp_path, damage):
    plan = build_plan(tmp_path / "a", n=30, mode="padded", micro_batch_size=2, sequence_len=24)
    tokens = plan / schemas.TOKENS_DIR
    assert CliRunner().invoke(app, ["validate", str(plan)]).exit_code == 0
    if damage == "deleted":
        shutil.rmtree(tokens)
    elif damage == "file deleted":
        (tokens / "offsets.npy").unlink()
    elif damage == "emptied":
        (tokens / "input_ids.npy").write_bytes(b"")
    elif damage == "truncated":
        data = (tokens / "labels.npy").read_bytes()
        (tokens / "labels.npy").write_bytes(data[: len(data) // 2])
    else:
        other = build_plan(tmp_path / "b", n=30, data_seed=5, mode="padded", micro_batch_size=2, sequence_len=24)
        shutil.rmtree(tokens)
        shutil.copytree(other / schemas.TOKENS_DIR, tokens)
    res = CliRunner().invoke(app, ["validate", str(plan)])
    if damage == "deleted":  # a plan kept without its store (as in git): what it holds checked, token data skipped
        assert res.exit_code == 0 and "skipped: token data" in res.output, res.output
    else:
        assert res.exit_code == 1 and "tokens" in res.output, res.output


def test_a_change_in_a_row_the_plan_does_not_use_is_a_warning(tmp_path):
    tok = make_tokenized(30, seed=6, max_len=20)
    full = samples_table(tok)
    kept = full.filter(pa.array(np.arange(30) != 12))  # row 12 dropped by the scan: in the store, not in the plan
    write_tokens(tmp_path / "data" / schemas.TOKENS_DIR, tok, kept)
    s = parquet.sample_arrays(kept)
    ps = PlanSettings(mode="padded", micro_batch_size=2, sequence_len=24)
    from plancc.planner.pipeline import compile_plan

    build.write_plan_dir(tmp_path / "plan", kept, s, ps, compile_plan(s, ps), ScanRecord(), tmp_path / "data" / schemas.TOKENS_DIR)
    plan = tmp_path / "plan"
    _flip_token(plan, 12)
    tokens, collator = load_tokens(plan), PlanCollator.from_plan(plan)
    with pytest.warns(UserWarning, match="not in any sample of the plan"):
        batches = [collator(mb, tokens) for mb in PlanSampler(plan)]
    assert len(batches) == len(PlanSampler(plan)) and tokens.guard.pending == 0


def test_a_plan_whose_store_was_moved_away_trains_on_it_given_as_data(tmp_path):
    """The plan's tokens/ moved elsewhere: the plan still opens, load_tokens says where it looked and what to pass,
    and the moved store (the one the plan binds: its digest matches) is accepted with the open-time checks."""
    plan = build_plan(tmp_path, n=30, mode="packed", micro_batch_size=2, sequence_len=24)
    shutil.move(plan / schemas.TOKENS_DIR, tmp_path / "moved")
    with pytest.raises(PlanMismatchError, match=r"tokens does not exist.* pass data="):
        load_tokens(plan)
    tokens = load_tokens(plan, data=tmp_path / "moved")
    assert tokens.guard.pending == tokens.guard.mapped.num_chunks  # chunks checked on first read, not all at open
    assert sum(1 for _ in _batches(plan, tokens, world=1)) == len(PlanSampler(plan))


def test_a_worker_copy_refuses_a_store_replaced_since_the_parent_opened_it(tmp_path):
    """A copy pickled outside a process start (no descriptor to pass) reopens the store by path: replaced meanwhile,
    it would hold other tokens than the parent's batches expect, so it refuses them. (A spawned worker reopens
    through the directory its parent holds: tests/adversarial/test_live_recompile.py.)"""
    plan = build_plan(tmp_path / "a", n=30, mode="packed", micro_batch_size=2, sequence_len=24)
    other = build_plan(tmp_path / "b", n=30, seed=1, data_seed=9, mode="packed", micro_batch_size=2, sequence_len=24)
    tokens = load_tokens(plan)
    shutil.rmtree(plan / schemas.TOKENS_DIR)
    shutil.copytree(other / schemas.TOKENS_DIR, plan / schemas.TOKENS_DIR)
    assert len(tokens) == 30 and tokens.input_ids.size  # the parent keeps what it opened
    with pytest.raises(PlanMismatchError, match="was replaced since this run opened it"):
        pickle.loads(pickle.dumps(tokens))

"""Opening a plan for training: the plan file's body digest vouches for every row of every epoch at open (on every
rank, before its first microbatch), and each rank then decodes only its own rows (`plancc.store.plan_body`).

The edits here keep the footer's digest (a rewrite that copies every footer key, a byte changed in place), so that
only the digest can catch them; edits that drop it fall back to verifying each epoch's rows against its plan
fingerprint (`test_a_plan_without_a_digest_is_verified_epoch_by_epoch`)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import plancc
from benchmarks.synthetic import build_plan
from plancc.errors import PlanMismatchError
from plancc.runtime import PlanSampler, verified_plan
from plancc.store import plan_body, schemas
from tests.support.plans import write_plan_rows

W, G = 3, 2


@pytest.fixture(scope="module")
def plan_dir(tmp_path_factory) -> Path:
    return build_plan(tmp_path_factory.mktemp("open"), n=300, world_size=W, grad_accum=G, epochs=2, mode="packed",
                      sequence_len=64, micro_batch_size=2)


@pytest.fixture
def plan(plan_dir, tmp_path) -> Path:
    return Path(shutil.copytree(plan_dir, tmp_path / "plan"))


def _footer_keys(path: Path) -> dict[bytes, bytes]:
    return dict(pq.read_metadata(path).metadata)


def _rewrite_keeping_the_footer(path: Path, rows: pa.Table, footer: dict[bytes, bytes]) -> None:
    """Write `rows` with the plan file's footer keys as they were (its digest included)."""
    schema = rows.schema.with_metadata({schemas.META_KEY: footer[schemas.META_KEY]})
    with pq.ParquetWriter(path, schema, compression="zstd", use_dictionary=False) as writer:
        writer.write_table(rows.replace_schema_metadata(schema.metadata))
        writer.add_key_value_metadata({schemas.ROWS_KEY: footer[schemas.ROWS_KEY]})


def _change_one_id(rows: pa.Table, epoch: int, rank: int) -> pa.Table:
    """One sample id of the first row of `epoch` held by `rank` replaced by another sample's."""
    table = rows.to_pylist()
    row = next(r for r in table if r["epoch"] == epoch and r["rank"] == rank)
    other = next(r for r in table if r["epoch"] == epoch and r is not row)
    row["sample_ids"][0][0], other["sample_ids"][0][0] = other["sample_ids"][0][0], row["sample_ids"][0][0]
    return pa.Table.from_pylist(table, schema=rows.schema)


def _refused_by_every_rank(plan: Path, match: str) -> None:
    for rank in range(W):
        with pytest.raises(PlanMismatchError, match=match):
            sampler = PlanSampler(plan, rank=rank, world_size=W, epoch=0)
            next(iter(sampler))  # never reached: the open refuses before any microbatch


@pytest.mark.parametrize(("epoch", "owner"), [(1, 2), (1, 0), (0, 1)])
def test_every_rank_refuses_a_changed_row_of_any_epoch_at_open(plan, epoch, owner):
    """A sample id exchanged between two rows of `epoch` (one of them `owner`'s), the file rewritten with its
    footer (digest included) as it was: every rank's sampler refuses at open, before the first microbatch of epoch
    0, whichever rank holds the row and whichever epoch it is in."""
    path = plan / schemas.PLAN_FILE
    footer = _footer_keys(path)
    _rewrite_keeping_the_footer(path, _change_one_id(pq.read_table(path), epoch, owner), footer)
    assert _footer_keys(path)[schemas.ROWS_KEY] == footer[schemas.ROWS_KEY]
    _refused_by_every_rank(plan, "do not hash to its plancc.rows digest")


def _chunk(path: Path, group: int, name: str) -> tuple[int, int]:
    meta = pq.read_metadata(path).row_group(group)
    col = next(meta.column(c) for c in range(meta.num_columns) if meta.column(c).path_in_schema.startswith(name))
    return col.data_page_offset, col.total_compressed_size


def test_a_byte_changed_in_another_ranks_rows_is_refused_by_every_rank(plan):
    """One byte of the last epoch's last rank's sample ids changed in place (no rewrite): every rank refuses at
    open, although none but that rank would decode those rows."""
    path = plan / schemas.PLAN_FILE
    last = pq.read_metadata(path).num_row_groups - 1
    start, size = _chunk(path, last, "sample_ids")
    data = bytearray(path.read_bytes())
    data[start + size // 2] ^= 0x5A
    path.write_bytes(bytes(data))
    _refused_by_every_rank(plan, "do not hash to its plancc.rows digest")


def test_an_epoch_count_that_disagrees_with_the_rows_is_refused(plan):
    """The manifest's epochs[0].batches (what samplers size an epoch by) raised by one, the rows and so the digest
    untouched: refused at open, naming both counts."""
    path = plan / schemas.PLAN_FILE
    rows = pq.read_table(path)
    meta = json.loads(rows.schema.metadata[schemas.META_KEY])
    meta["epochs"][0]["batches"] += 1
    raw = json.dumps(meta, sort_keys=True).encode()
    (plan / schemas.MANIFEST_FILE).write_text(json.dumps({k: v for k, v in meta.items() if k != "kind"}))
    write_plan_rows(rows.replace_schema_metadata(None), path, {schemas.META_KEY: raw})
    with pytest.raises(PlanMismatchError, match=r"its epochs hold \[\d+, \d+\] rows .* epochs\[\]\.batches say"):
        verified_plan(plan)


def test_a_plan_without_a_digest_is_verified_epoch_by_epoch(plan):
    """A plan file rewritten without the digest (as plans of earlier plancc versions are) is read, and a changed
    row of its last epoch is still refused at open, by its plan fingerprint."""
    path = plan / schemas.PLAN_FILE
    table = pq.read_table(path)
    pq.write_table(table, path)
    assert schemas.ROWS_KEY not in _footer_keys(path)
    assert not plancc.open_plan(plan).files.has_rows_digest
    assert verified_plan(plan).epoch(1, 0).total_batches
    pq.write_table(_change_one_id(table, 1, 1).replace_schema_metadata(table.schema.metadata), path)
    _refused_by_every_rank(plan, "epoch 1: its .* rows do not hash to the epoch's plan fingerprint")


def _reads(plan: plancc.Plan, epoch: int, world_size: int, grad_accum: int) -> list:
    out = []
    for rank in [None, *range(world_size)]:
        e = plan.epoch(epoch, rank, world_size=world_size, grad_accum=grad_accum)
        out.append((e.index.tolist(), e.sample_ids.tolist(), e.row_bounds.tolist(), e.batch_bounds.tolist(),
                    e.tokens.tolist(), e.label_count.tolist(), e.num_items.tolist(), e.update.tolist(),
                    e.rank.tolist(), e.micro_step.tolist(), e.total_batches, e.tail_num_items))
    return out


@pytest.mark.parametrize(("world_size", "grad_accum"), [(W, G), (1, W * G), (W * G, 1)])
def test_reads_by_row_group_equal_the_verified_whole_epoch(plan_dir, tmp_path, world_size, grad_accum):
    """Every share (each rank's, all of them, elastic replays) read from its own row groups equals the share taken
    from the whole epoch read and checked against its plan fingerprint (the path plans without a digest take)."""
    fast = plancc.open_plan(plan_dir)
    assert fast.files.has_rows_digest
    copy = Path(shutil.copytree(plan_dir, tmp_path / "copy"))
    pq.write_table(pq.read_table(copy / schemas.PLAN_FILE), copy / schemas.PLAN_FILE)  # the rows without the digest
    slow = plancc.open_plan(copy)
    assert not slow.files.has_rows_digest
    for epoch in (0, 1):
        assert _reads(fast, epoch, world_size, grad_accum) == _reads(slow, epoch, world_size, grad_accum)


@settings(max_examples=60, deadline=None)
@given(blocks=st.lists(st.tuples(st.integers(0, 3), st.integers(1, 40)), min_size=0, max_size=30),
       max_rows=st.integers(1, 50), min_rows=st.integers(1, 60))
def test_row_groups_start_at_blocks_and_stay_bounded(blocks, max_rows, min_rows):
    """Row groups cover the rows in order, none longer than `max_rows`; a block (rows of one epoch and rank)
    starts a group whenever the open one holds `min_rows` or more."""
    epoch = np.repeat(np.arange(len(blocks)), [n for _, n in blocks]).astype(np.int32)
    rank = np.repeat(np.array([r for r, _ in blocks], dtype=np.int32), [n for _, n in blocks])
    bounds = plan_body.group_bounds(epoch, rank, max_rows, min_rows)
    sizes = np.diff(bounds)
    assert bounds[0] == 0 and bounds[-1] == epoch.size and (sizes > 0).all() and (sizes <= max_rows).all()
    starts = np.flatnonzero(np.r_[True, (epoch[1:] != epoch[:-1]) | (rank[1:] != rank[:-1])]) if epoch.size else []
    for a in starts:
        before = max(b for b in bounds if b <= a)
        assert a in bounds or a - before < min_rows


def _every_share(plan: Path) -> list:
    """What every rank of the plan's world reads of every epoch, through the runtime's open."""
    opened = verified_plan(plan)
    return [_reads(opened, epoch, W, G) for epoch in opened.epochs]


@pytest.mark.slow
def test_every_byte_flip_of_the_plan_file_is_refused_or_changes_no_rank_s_rows(plan):
    """Seeded flips (a byte XOR a random non-zero value), half in the body and half in the footer: each one is
    refused by the runtime's open or reads (a `PlanccError`, never another exception), or every rank reads exactly
    the rows it read before. Footer bytes that decide nothing a rank reads (statistics, the created-by string) are
    the harmless ones."""
    from plancc.errors import PlanccError

    path = plan / schemas.PLAN_FILE
    original = path.read_bytes()
    before = _every_share(plan)
    body_end = plan_body.footer_start(len(original), original[-8:])
    rng = np.random.default_rng(11)
    where = np.concatenate([rng.integers(0, body_end, 100), rng.integers(body_end, len(original) - 8, 100)])
    tally, silent = {"refused": 0, "harmless": 0}, []
    for at in where.tolist():
        flipped = bytearray(original)
        flipped[at] ^= int(rng.integers(1, 256))
        path.write_bytes(bytes(flipped))
        try:
            after = _every_share(plan)
        except PlanccError:
            tally["refused"] += 1
            continue
        if after == before:
            tally["harmless"] += 1
        else:
            silent.append(at)
    path.write_bytes(original)
    print("plan.parquet byte flips:", tally, "body ends at", body_end)
    assert not silent, f"flips at {silent} changed what a rank reads and were not refused"
    assert tally["refused"] >= 100  # every body flip, at least

"""Collator: tensors per layout and shift mode, counts equal to the plan's, clear errors when the data changed."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.synthetic import build_plan, make_tokenized
from plancc.runtime import PlanCollator, PlanMismatchError, PlanSampler, TokenStore, load_tokens, model_inputs
from plancc.store import schemas
from tests.support.training import tiny_model


def expected_row(samples, tokens: TokenStore, shift: str):
    """Reference semantics (docs/spec.md §3), written independently of the collator with plain lists."""
    ids, targets, pos = [], [], []
    for sid in samples:
        a, b = int(tokens.offsets[sid]), int(tokens.offsets[sid + 1])
        x, y = tokens.input_ids[a:b].tolist(), tokens.targets[a:b].tolist()
        ids += x
        pos += list(range(len(x)))
        if shift == "sample":
            targets += [*y[1:], -100]
        else:
            targets += y
    if shift == "row":
        targets = [*targets[1:], -100]
    return ids, targets, pos


def check_microbatch(batch, mb, tokens, shift, mode):
    rows = [list(mb)[int(mb.rows[k]):int(mb.rows[k + 1])] for k in range(len(mb.rows) - 1)]
    check_segments(batch)
    if mb.placeholder:
        assert batch["shift_labels"].eq(-100).all() and batch["label_count"] == 0
        return
    assert batch["input_ids"].shape[0] == len(rows)
    for r, samples in enumerate(rows):
        ids, targets, pos = expected_row(samples, tokens, shift)
        n = len(ids)
        assert batch["input_ids"][r, :n].tolist() == ids
        assert batch["shift_labels"][r, :n].tolist() == targets
        assert batch["shift_labels"][r, n:].eq(-100).all()
        assert batch["position_ids"][r, :n].tolist() == pos
        assert batch["labels"][r, 1:].tolist() == batch["shift_labels"][r, :-1].tolist()
        if mode == "padded":
            assert batch["attention_mask"][r].sum() == n
    assert int((batch["shift_labels"] != -100).sum()) == mb.label_count == batch["label_count"]


def check_segments(batch):
    """One rule in every layout: `position_ids` restart at 0 exactly at the bounds of `cu_seqlens` (pad tails are
    segments of their own), so the varlen kwargs say what the position ids say."""
    pos = batch["position_ids"].reshape(-1)
    starts = torch.nonzero(pos == 0).reshape(-1)
    bounds = torch.cat([starts, torch.tensor([pos.numel()])]).to(torch.int32)
    cu = batch["cu_seqlens"]
    assert cu.dtype == torch.int32 and torch.equal(cu, bounds)
    assert batch["max_seqlen"] == int((bounds[1:] - bounds[:-1]).max())
    kw = model_inputs(batch, "flash_attention_2")
    assert torch.equal(kw["cu_seq_lens_q"], bounds) and torch.equal(kw["cu_seq_lens_k"], bounds)
    assert kw["max_length_q"] == kw["max_length_k"] == batch["max_seqlen"] and "attention_mask" not in kw


@settings(max_examples=30)
@given(
    n=st.integers(3, 40),
    data_seed=st.integers(0, 2**16),
    layout=st.sampled_from(["packed", "packed_real", "padded", "flattened"]),
    shift=st.sampled_from(["sample", "row", "none"]),
    mbs=st.integers(1, 3),
    ranks=st.sampled_from([(1, 1), (1, 3), (2, 2), (3, 1)]),
    pad_multiple=st.sampled_from([1, 8]),
    drop_last=st.booleans(),
    loop_threshold=st.sampled_from([0, 3, 48]),  # vectorized gather, mixed, per-sample slice copies
)
def test_collated_counts_equal_plan_counts(n, data_seed, layout, shift, mbs, ranks, pad_multiple, drop_last,
                                           loop_threshold):
    world, accum = ranks
    mode = "packed" if layout.startswith("packed") else layout
    kw = dict(mode=mode, shift=shift, micro_batch_size=mbs, sequence_len=24, world_size=world, grad_accum=accum,
              pad_multiple=pad_multiple, drop_last=drop_last, real_batches=layout == "packed_real")
    with tempfile.TemporaryDirectory() as tmp:
        try:
            plan = build_plan(Path(tmp), n=n, data_seed=data_seed, max_len=20, **kw)
        except Exception as exc:  # e.g. drop_last dropping every microbatch
            if "empty" in str(exc) or "nothing" in str(exc):
                return
            raise
        tokens = load_tokens(plan)
        collator = PlanCollator.from_plan(plan, loop_threshold=loop_threshold)
        per_update: dict[int, int] = {}
        num_items: dict[int, int] = {}
        for r in range(world):
            for mb in PlanSampler(plan, rank=r, world_size=world):
                batch = collator(mb, tokens)
                check_microbatch(batch, mb, tokens, shift, mode)
                assert batch["input_ids"].shape[1] % pad_multiple == 0
                per_update[mb.update] = per_update.get(mb.update, 0) + batch["label_count"]
                num_items.setdefault(mb.update, int(batch["num_items_in_batch"]))
                assert int(batch["num_items_in_batch"]) == num_items[mb.update]
        assert per_update == num_items  # the plan's global count per update is what the loss will see


def test_changed_labels_are_a_clear_error(tmp_path):
    tok = make_tokenized(20, seed=1)
    plan = build_plan(tmp_path, tok=tok, mode="packed", micro_batch_size=2, sequence_len=24)
    labels = tok.column("labels").to_pylist()
    k = next(i for i, row in enumerate(labels) if row.count(-100) >= 1)
    labels[k] = [t if t != -100 else 1 for t in labels[k]]  # unmask one sample's prompt
    changed = tok.set_column(1, "labels", pa.array(labels, pa.list_(pa.int32())))
    with pytest.raises(PlanMismatchError, match="supervised label count"):
        load_tokens(plan, data=changed)
    tokens = load_tokens(plan, data=changed, verify="none")
    collator = PlanCollator.from_plan(plan)
    with pytest.raises(PlanMismatchError, match=r"collates to \d+ supervised targets but the plan counted"):
        for mb in PlanSampler(plan):
            collator(mb, tokens)


def test_missing_data_is_a_clear_error(tmp_path):
    plan = build_plan(tmp_path, n=10, mode="padded", micro_batch_size=2, sequence_len=24)
    shutil.rmtree(plan / schemas.TOKENS_DIR)
    with pytest.raises(PlanMismatchError, match="does not exist"):
        load_tokens(plan)


def test_packed_samples_do_not_see_each_other(tmp_path):
    """A sample's logits inside a packed row equal its logits alone: position_ids isolate packed samples."""
    plan = build_plan(tmp_path, n=12, mode="packed", micro_batch_size=3, sequence_len=24)
    tokens = load_tokens(plan)
    collator = PlanCollator.from_plan(plan)
    mb = next(mb for mb in PlanSampler(plan) if len(mb) >= 3)
    batch = collator(mb, tokens)
    model = tiny_model().eval()
    with torch.no_grad():
        packed = model(**model_inputs(batch)).logits[0]
        start = 0
        for sid in mb:
            a, b = int(tokens.offsets[sid]), int(tokens.offsets[sid + 1])
            alone = model(input_ids=torch.from_numpy(tokens.input_ids[a:b].astype(np.int64))[None]).logits[0]
            assert torch.allclose(packed[start:start + b - a], alone, atol=1e-5)
            start += b - a

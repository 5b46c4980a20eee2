"""Exact resume over several epochs of different lengths, with and without --drop-last: stop after k microbatches
(at and between update boundaries, at and across epoch boundaries), restore, finish: the consumed sequence and the
final weights equal the uninterrupted run's bit for bit."""

from __future__ import annotations

import io
import json

import pytest
import torch

from plancc.runtime import (
    PlanCollator,
    PlanSampler,
    checkpoint_state,
    load_tokens,
    model_inputs,
    restore_checkpoint_state,
    token_loss,
    verified_plan,
)
from tests.support.training import build_uneven_plan, tiny_model

EPOCHS = 3


@pytest.fixture(scope="module", params=[False, True], ids=["keep_last", "drop_last"])
def setup(request, tmp_path_factory):
    plan = build_uneven_plan(tmp_path_factory.mktemp("resume"), grad_accum=3, drop_last=request.param)
    return plan, load_tokens(plan), PlanCollator.from_plan(plan)


def train(setup, *, stop_after: int | None = None, checkpoint: bytes | None = None):
    """Train EPOCHS epochs; returns (consumed, model) or, when stopping, the serialized checkpoint."""
    plan, tokens, collator = setup
    model = tiny_model(seed=1)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sampler = PlanSampler(plan)
    consumed: list = []
    if checkpoint is not None:
        ckpt = torch.load(io.BytesIO(checkpoint))
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["optim"])
        restore_checkpoint_state(ckpt["data"], sampler, model=model)
        consumed = ckpt["consumed"]
    for epoch in range(sampler.epoch, EPOCHS):
        sampler.set_epoch(epoch)
        for mb in sampler:
            batch = collator(mb, tokens)
            logits = model(**model_inputs(batch)).logits
            token_loss(logits, batch["shift_labels"], batch["num_items_in_batch"]).backward()
            if mb.last_in_update:
                opt.step()
                opt.zero_grad(set_to_none=True)
            consumed.append((mb.epoch, mb.index, tuple(mb)))
            if stop_after is not None and len(consumed) == stop_after:
                data = checkpoint_state(sampler, model=model)
                json.dumps(data["sampler"])  # the sampler state is plain JSON
                buf = io.BytesIO()
                torch.save({"model": model.state_dict(), "optim": opt.state_dict(), "data": data,
                            "consumed": consumed}, buf)
                return buf.getvalue()
    return consumed, model


@pytest.fixture(scope="module")
def reference(setup):
    return train(setup)


def test_plan_shape(setup, reference):
    consumed, _ = reference
    plan = setup[0]
    lengths = PlanSampler(plan).epoch_lengths()
    assert len(consumed) == sum(lengths) and len(set(lengths)) == EPOCHS  # epochs of different lengths
    tails = [n % 3 for n in lengths]
    assert any(tails) != verified_plan(plan).settings.drop_last  # tail updates exactly without --drop-last


@pytest.mark.parametrize("k", [3, 4, "epoch_boundary", "across_epoch", "mid_update_epoch_1", "last"])
def test_resume_is_exact(setup, reference, k):
    consumed, model = reference
    lengths = PlanSampler(setup[0]).epoch_lengths()
    k = {"epoch_boundary": lengths[0], "across_epoch": lengths[0] + 1, "mid_update_epoch_1": lengths[0] + 4,
         "last": len(consumed) - 1}.get(k, k)
    ckpt = train(setup, stop_after=k)
    resumed, resumed_model = train(setup, checkpoint=ckpt)
    assert resumed == consumed
    for (name, a), b in zip(model.named_parameters(), resumed_model.parameters(), strict=True):
        assert torch.equal(a, b), name

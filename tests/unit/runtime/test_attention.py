"""Attention inputs: with `explicit_mask=True` (sdpa and eager) every sample of a collated batch gets the logits it
gets alone, in every layout; the flash-attention kwargs are the collator's segment bounds (see also
tests/unit/runtime/test_collator.py, and benchmarks/gpu_flash_check.py for the same check on a GPU)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from benchmarks.synthetic import build_plan
from plancc.runtime import PlanCollator, PlanSampler, block_causal_mask, load_tokens, model_inputs
from tests.support.training import tiny_model

LAYOUTS = {
    "packed": dict(mode="packed", micro_batch_size=3, sequence_len=24),
    "packed_real_batches": dict(mode="packed", micro_batch_size=3, sequence_len=24, real_batches=True),
    "padded": dict(mode="padded", micro_batch_size=3, sequence_len=24, pad_multiple=8),
    "flattened": dict(mode="flattened", micro_batch_size=3, sequence_len=24),
}


@pytest.fixture(scope="module")
def plans(tmp_path_factory):
    root = tmp_path_factory.mktemp("attn")
    return {name: build_plan(root / name, n=18, data_seed=5, max_len=20, **kw) for name, kw in LAYOUTS.items()}


def standalone_logits(model, tokens, sid):
    a, b = int(tokens.offsets[sid]), int(tokens.offsets[sid + 1])
    return model(input_ids=torch.from_numpy(tokens.input_ids[a:b].astype(np.int64))[None]).logits[0]


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_explicit_mask_gives_each_sample_its_standalone_logits(plans, layout, attn):
    plan = plans[layout]
    tokens = load_tokens(plan)
    collator = PlanCollator.from_plan(plan)
    model = tiny_model(seed=2, layers=2, hidden=32).eval()
    model.config._attn_implementation = attn
    checked = 0
    with torch.no_grad():
        for mb in list(PlanSampler(plan))[:3]:
            batch = collator(mb, tokens)
            kw = model_inputs(batch, attn, explicit_mask=True, dtype=model.dtype)
            assert kw["attention_mask"].shape == (batch["input_ids"].shape[0], 1, *batch["input_ids"].shape[1:2] * 2)
            logits = model(**kw).logits
            for r in range(len(mb.rows) - 1):
                start = 0
                for sid in list(mb)[int(mb.rows[r]):int(mb.rows[r + 1])]:
                    alone = standalone_logits(model, tokens, sid)
                    n = alone.shape[0]
                    assert torch.allclose(logits[r, start:start + n], alone, atol=1e-5, rtol=0), (layout, sid)
                    start += n
                    checked += 1
    assert checked >= 6


def test_block_causal_mask_is_block_diagonal_and_causal():
    pos = torch.tensor([[0, 1, 2, 0, 1, 0, 1]])  # samples of 3 and 2 tokens, then a pad tail of 2
    mask = block_causal_mask(pos, dtype=torch.bfloat16)
    assert mask.shape == (1, 1, 7, 7) and mask.dtype == torch.bfloat16
    allowed = (mask[0, 0] == 0).int()
    expected = torch.tensor([
        [1, 0, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0, 0],
        [0, 0, 0, 1, 0, 0, 0],
        [0, 0, 0, 1, 1, 0, 0],
        [0, 0, 0, 0, 0, 1, 0],
        [0, 0, 0, 0, 0, 1, 1],
    ])
    assert torch.equal(allowed, expected)
    assert float(mask[0, 0, 0, 1]) == torch.finfo(torch.bfloat16).min


def test_model_inputs_per_implementation(plans):
    plan = plans["padded"]
    batch = PlanCollator.from_plan(plan)(next(iter(PlanSampler(plan))), load_tokens(plan))
    plain = model_inputs(batch, "sdpa")
    assert set(plain) == {"input_ids", "position_ids", "attention_mask", "use_cache"}
    assert plain["attention_mask"].ndim == 2
    assert model_inputs(batch)["use_cache"] is False
    flash = model_inputs(batch, "flash_attention_3")
    assert "attention_mask" not in flash and flash["cu_seq_lens_q"].dtype == torch.int32
    assert isinstance(flash["max_length_q"], int)
    with pytest.raises(ValueError, match="varlen kwargs, not a mask"):
        model_inputs(batch, "flash_attention_2", explicit_mask=True)

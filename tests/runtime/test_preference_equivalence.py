"""The pair-mean proof (docs/preference.md): for every loss type, the gradient of each update trained on the plan's
microbatches (one process accumulating, an elastic replay, 2-rank DDP on gloo) equals an independent reference
over the update's whole pair set, to fp32 round-off; a naive per-microbatch mean does not.

Real pairs: Alpaca rows, each output chosen against another row's output of a different length (byte tokens, so
the tiny model's vocabulary stays small); KTO on the same completions unpaired, as TRL unpairs them. fp32, dropout
off, a tiny Llama from a config. The DDP plans are compiled for (W=2, G=2) and replayed on one process as (1, 4).
"""

from __future__ import annotations

import contextlib
import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from benchmarks.preference_data import alpaca_pairs, build_preference_plan, tokenize_pairs, unpaired
from plancc.runtime import PlanCollator, PlanSampler, load_tokens
from plancc.store.parquet import sample_arrays
from plancc.store.plan import verified_plan
from tests.support.preference import (
    grads,
    one_at_a_time,
    plan_update,
    reference_kto_loss,
    reference_pair_loss,
    whole_update,
)
from tests.support.training import merge_microbatches, rel_err, tiny_model

pytestmark = pytest.mark.slow  # trains a model on every update, spawns a 2-rank gloo group

LOSS_TYPES = ("sigmoid", "hinge", "ipo", "simpo", "orpo", "kto")
TOL = 1e-5
VOCAB = 260  # bytes and the end token
SEQUENCE_LEN = 384
COMMON = dict(mode="packed", micro_batch_size=1, sequence_len=SEQUENCE_LEN)


def _models():
    return tiny_model(seed=0, vocab=VOCAB), tiny_model(seed=1, vocab=VOCAB).eval()


@pytest.fixture(scope="module")
def plans(tmp_path_factory):
    root = tmp_path_factory.mktemp("preference")
    tok = tokenize_pairs(alpaca_pairs(600, seed=2), lambda t: list(t.encode()), 256, limit=SEQUENCE_LEN)
    kto = unpaired(tok, seed=3)
    return {  # one process: microbatches of 2 to 4 pairs; DDP: one pair each, a tail with a placeholder
        ("pairs", "acc"): str(build_preference_plan(root / "pa", tok, world_size=1, grad_accum=2,
                                                    **{**COMMON, "micro_batch_size": 2})),
        ("pairs", "ddp"): str(build_preference_plan(root / "pd", tok.slice(0, tok.num_rows - 2), world_size=2,
                                                    grad_accum=2, shift="row", **COMMON)),
        ("kto", "acc"): str(build_preference_plan(root / "ka", kto, world_size=1, grad_accum=2,
                                                  **{**COMMON, "micro_batch_size": 2})),
        ("kto", "ddp"): str(build_preference_plan(root / "kd", kto.slice(0, kto.num_rows - 1), world_size=2,
                                                  grad_accum=2, **COMMON)),
    }


def _plan_of(plans, loss_type: str, kind: str) -> str:
    return plans[("kto" if loss_type == "kto" else "pairs", kind)]


def _updates(plan: str):
    """Each update's microbatches in global order."""
    p = verified_plan(plan)
    out: dict[tuple[int, int], list] = {}
    for epoch in p.epochs:
        for mb in PlanSampler(p, rank=0, world_size=1, grad_accum=p.settings.batches_per_update, epoch=epoch):
            if not mb.placeholder:
                out.setdefault((epoch, mb.update), []).append(mb)
    return out


def reference_grads(plan: str, loss_type: str, *, dtype: torch.dtype = torch.float32,
                    one_by_one: bool = False) -> list[torch.Tensor]:
    """The independent reference's gradient of every update of `plan`: each update's loss from its definition
    over the update's whole pair set, the log-probs from one forward of the update as one batch (or, `one_by_one`,
    of each sequence on its own)."""
    p = verified_plan(plan)
    tokens, shift = load_tokens(p), p.settings.shift
    s = sample_arrays(p.samples_table())
    single = PlanCollator(mode=p.settings.mode, shift=shift, pad_multiple=p.settings.pad_multiple)
    out = []
    for mbs in _updates(plan).values():
        policy, ref = (m.to(dtype) for m in _models())
        ids = [k for mb in mbs for k in mb]
        if one_by_one:
            logps, ref_logps = one_at_a_time(policy, tokens, shift), one_at_a_time(ref, tokens, shift)
        else:
            batch = single(merge_microbatches(mbs), tokens)
            batch["rows"] = merge_microbatches(mbs).rows.tolist()
            logps = whole_update(policy, batch, ids, shift)
            with torch.no_grad():
                ref_logps = whole_update(ref, batch, ids, shift)
        if loss_type == "kto":
            desirable = dict(zip(s.sample_id.tolist(), s.desirable.tolist(), strict=True))
            loss = reference_kto_loss(policy, ref, logps, ref_logps, tokens, [list(mb) for mb in mbs], desirable,
                                      shift, p.settings.sequence_len)
        else:
            by_pair: dict[int, dict[bool, int]] = {}
            for sid, pid, chosen in zip(s.sample_id.tolist(), s.pair_id.tolist(), s.chosen.tolist(), strict=True):
                by_pair.setdefault(pid, {})[chosen] = sid
            held = set(ids)
            loss = reference_pair_loss(logps, ref_logps, [(v[True], v[False]) for v in by_pair.values()
                                                          if v[True] in held], loss_type)
        loss.backward()
        out.append(grads(policy))
    return out


def accumulated_grads(plan: str, loss_type: str, *, naive: bool = False,
                      dtype: torch.dtype = torch.float32) -> list[torch.Tensor]:
    """Each update's gradient trained on the plan's microbatches on one process (W=1, G=W*G of the plan)."""
    p = verified_plan(plan)
    sampler = PlanSampler(p, rank=0, world_size=1, grad_accum=p.settings.batches_per_update)
    collator, tokens = PlanCollator.from_plan(p), load_tokens(p)
    out = []
    for epoch in p.epochs:
        sampler.set_epoch(epoch)
        batches = [collator(mb, tokens) for mb in sampler]
        for update in sorted({b["plan"]["update"] for b in batches}):
            policy, ref = (m.to(dtype) for m in _models())
            plan_update(policy, ref, [b for b in batches if b["plan"]["update"] == update], loss_type, naive=naive)
            out.append(grads(policy))
    return out


@pytest.fixture(scope="module")
def references(plans):
    return {(loss_type, kind): reference_grads(_plan_of(plans, loss_type, kind), loss_type)
            for loss_type in LOSS_TYPES for kind in ("acc", "ddp")}


def _max_rel(got: list[torch.Tensor], want: list[torch.Tensor]) -> float:
    assert len(got) == len(want) and len(want) > 2
    return max(rel_err(g, w) for g, w in zip(got, want, strict=True))


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_accumulation_equals_the_update_reference(plans, references, loss_type):
    err = _max_rel(accumulated_grads(_plan_of(plans, loss_type, "acc"), loss_type), references[(loss_type, "acc")])
    print(f"{loss_type}: accumulation max relative gradient error {err:.2e}")
    assert err <= TOL


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_elastic_replay_equals_the_update_reference(plans, references, loss_type):
    err = _max_rel(accumulated_grads(_plan_of(plans, loss_type, "ddp"), loss_type), references[(loss_type, "ddp")])
    print(f"{loss_type}: elastic replay (2x2 on 1x4) max relative gradient error {err:.2e}")
    assert err <= TOL


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_float64_equals_each_sequence_run_alone(plans, loss_type):
    """In float64 the plan's accumulated gradient is the pair mean's exactly (the fp32 tests' differences are
    round-off), with the reference's log-probs taken from each sequence run through the model on its own."""
    plan = _plan_of(plans, loss_type, "acc")
    got = accumulated_grads(plan, loss_type, dtype=torch.float64)
    err = _max_rel(got, reference_grads(plan, loss_type, dtype=torch.float64, one_by_one=True))
    print(f"{loss_type}: float64, sequences one by one: max relative gradient error {err:.2e}")
    assert err <= 1e-10


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_naive_microbatch_mean_is_off(plans, references, loss_type):
    err = _max_rel(accumulated_grads(_plan_of(plans, loss_type, "acc"), loss_type, naive=True),
                   references[(loss_type, "acc")])
    print(f"{loss_type}: naive per-microbatch mean max relative gradient error {err:.2e}")
    assert err > 100 * TOL


def _ddp_worker(rank: int, plans: dict, out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{out_dir}/store", rank=rank, world_size=2)
    torch.set_num_threads(1)
    try:
        results = {}
        for loss_type in LOSS_TYPES:
            plan = _plan_of(plans, loss_type, "ddp")
            sampler, collator, tokens = PlanSampler(plan), PlanCollator.from_plan(plan), load_tokens(plan)
            batches = [collator(mb, tokens) for mb in sampler]
            out = []
            for update in sorted({b["plan"]["update"] for b in batches}):
                policy, ref = _models()
                ddp = torch.nn.parallel.DistributedDataParallel(policy)
                plan_update(ddp, ref, [b for b in batches if b["plan"]["update"] == update], loss_type,
                            world_size=2, sync=lambda last, ddp=ddp: contextlib.nullcontext() if last else ddp.no_sync())
                out.append(grads(policy))
            results[loss_type] = out
            results[f"{loss_type} placeholders"] = sum(b["plan"]["placeholder"] for b in batches)
        torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def ddp_grads(plans, tmp_path_factory):
    out_dir = str(tmp_path_factory.mktemp("ddp"))
    mp.spawn(_ddp_worker, args=(plans, out_dir), nprocs=2, join=True)
    return torch.load(os.path.join(out_dir, "rank0.pt")), torch.load(os.path.join(out_dir, "rank1.pt"))


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_ddp_equals_the_update_reference(ddp_grads, references, loss_type):
    rank0, rank1 = ddp_grads
    assert all(torch.equal(a, b) for a, b in zip(rank0[loss_type], rank1[loss_type], strict=True))  # synced
    assert rank1[f"{loss_type} placeholders"] == 1  # the tail's last micro-step: rank 1 has no microbatch
    err = _max_rel(rank0[loss_type], references[(loss_type, "ddp")])
    print(f"{loss_type}: 2-rank DDP max relative gradient error {err:.2e}")
    assert err <= TOL

"""The proof (docs/spec.md §8): one batch of an update = G accumulated microbatches = 2-rank DDP (gloo), to round-off.

fp32, dropout off, a tiny Llama built from a config. Plans are compiled for (W=2, G=2) with a tail update whose
last micro-step is a placeholder on rank 1. The single-process runs replay the same plan elastically as (W=1,
G=4), so the DDP comparison is also the elastic-replay proof. The naive mean-of-means loop must differ.
"""

from __future__ import annotations

import contextlib
import os
from collections import defaultdict

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from benchmarks.synthetic import build_plan
from plancc.runtime import PlanCollator, PlanSampler, load_tokens
from tests.support.training import merge_microbatches, rel_err, tiny_model, update_gradients

pytestmark = pytest.mark.slow  # spawns 2-rank gloo process groups

# layout -> (plan settings, samples); each plan ends with a tail update of 1 or 3 microbatches, so rank 1 gets a
# placeholder at its last micro-step
LAYOUTS = {
    "packed": (dict(mode="packed", micro_batch_size=2, sequence_len=24, shift="sample"), 40),
    "packed_real_batches": (dict(mode="packed", micro_batch_size=2, sequence_len=24, real_batches=True,
                                 shift="row"), 39),
    "padded": (dict(mode="padded", micro_batch_size=2, sequence_len=24, pad_multiple=4, shift="sample"), 26),
    "flattened": (dict(mode="flattened", micro_batch_size=2, sequence_len=24, shift="none"), 26),
}
TOL = 1e-5


def _ddp_worker(rank: int, plans: dict, out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{out_dir}/store", rank=rank, world_size=2)
    torch.set_num_threads(1)
    try:
        results = {}
        for name, plan in plans.items():
            model = tiny_model(seed=0)
            ddp = torch.nn.parallel.DistributedDataParallel(model)
            sampler = PlanSampler(plan)  # rank and world size from torch.distributed
            collator = PlanCollator.from_plan(plan)
            tokens = load_tokens(plan)
            batches = [collator(mb, tokens) for mb in sampler]
            res = update_gradients(ddp, batches, world_size=2,
                                   sync=lambda last, ddp=ddp: contextlib.nullcontext() if last else ddp.no_sync())
            losses = torch.tensor([loss for loss, _ in res], dtype=torch.float64)
            dist.all_reduce(losses)
            results[name] = {"losses": losses.tolist(), "grads": [g for _, g in res],
                             "placeholders": sum(b["plan"]["placeholder"] for b in batches)}
        torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def plans(tmp_path_factory):
    root = tmp_path_factory.mktemp("equiv")
    out = {}
    for name, (kw, n) in LAYOUTS.items():
        out[name] = str(build_plan(root / name, n=n, data_seed=7, max_len=20, world_size=2, grad_accum=2, **kw))
    return out


@pytest.fixture(scope="module")
def ddp_results(plans, tmp_path_factory):
    out_dir = str(tmp_path_factory.mktemp("ddp"))
    mp.spawn(_ddp_worker, args=(plans, out_dir), nprocs=2, join=True)
    return torch.load(os.path.join(out_dir, "rank0.pt")), torch.load(os.path.join(out_dir, "rank1.pt"))


def single_process(plan: str):
    """(accumulated, one batch per update, naive) per-update (loss, grads) on one process, W=1 x G=4."""
    sampler = PlanSampler(plan, rank=0, world_size=1, grad_accum=4)
    collator = PlanCollator.from_plan(plan)
    tokens = load_tokens(plan)
    mbs = list(sampler)
    batches = [collator(mb, tokens) for mb in mbs]
    accumulated = update_gradients(tiny_model(seed=0), batches)
    naive = update_gradients(tiny_model(seed=0), batches, naive=True)
    by_update = defaultdict(list)
    for mb in mbs:
        by_update[mb.update].append(mb)
    whole = [collator(merge_microbatches(group), tokens) for _, group in sorted(by_update.items())]
    one_batch = update_gradients(tiny_model(seed=0), whole)
    return accumulated, one_batch, naive


def max_rel(res_a, res_b):
    loss = max(abs(la - lb) / abs(lb) for (la, _), (lb, _) in zip(res_a, res_b, strict=True))
    grad = max(rel_err(ga[k], gb[k]) for (_, ga), (_, gb) in zip(res_a, res_b, strict=True) for k in gb)
    return loss, grad


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_one_batch_equals_accumulation_equals_ddp(layout, plans, ddp_results):
    accumulated, one_batch, naive = single_process(plans[layout])
    total = PlanSampler(plans[layout], rank=0, world_size=1, grad_accum=4).plan.manifest.epochs[0].batches
    assert total % 2 == 1 and len(accumulated) == len(one_batch) == -(-total // 4)  # complete updates + tail
    loss_err, grad_err = max_rel(accumulated, one_batch)
    assert loss_err < TOL and grad_err < TOL, (loss_err, grad_err)

    rank0, rank1 = ddp_results
    assert rank1[layout]["placeholders"] == 1  # the tail's last micro-step has no microbatch on rank 1
    ddp = [(loss, g) for loss, g in zip(rank0[layout]["losses"], rank0[layout]["grads"], strict=True)]
    loss_err, grad_err = max_rel(ddp, one_batch)
    assert loss_err < TOL and grad_err < TOL, (loss_err, grad_err)
    for g0, g1 in zip(rank0[layout]["grads"], rank1[layout]["grads"], strict=True):  # DDP: ranks agree
        assert all(torch.allclose(g0[k], g1[k], rtol=0, atol=0) for k in g0)

    _, naive_err = max_rel(naive, one_batch)
    assert naive_err > 1e-3, naive_err  # the mean-of-means loop optimizes another objective


def test_elastic_replay_gives_equal_update_gradients(plans, ddp_results):
    """(W=2, G=2) under DDP vs (W=1, G=4) on one process: the same plan, the same update gradients."""
    rank0, _ = ddp_results
    for layout, plan in plans.items():
        sampler = PlanSampler(plan, rank=0, world_size=1, grad_accum=4)
        collator, tokens = PlanCollator.from_plan(plan), load_tokens(plan)
        elastic = update_gradients(tiny_model(seed=0), [collator(mb, tokens) for mb in sampler])
        ddp = list(zip(rank0[layout]["losses"], rank0[layout]["grads"], strict=True))
        loss_err, grad_err = max_rel(ddp, elastic)
        assert loss_err < TOL and grad_err < TOL, (layout, loss_err, grad_err)

"""FSDP2 (`fully_shard`) on 2 gloo CPU ranks: the same plan trains with the loss and gradients of DDP (relative
1e-5, every update), and a sharded checkpoint (each rank its shards and its sampler state) resumes bit for bit."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from benchmarks.synthetic import build_plan
from plancc.runtime import PlanCollator, PlanSampler, load_checkpoint, load_tokens, save_checkpoint
from plancc.runtime.forward import microbatch_loss
from tests.support.training import rel_err, tiny_model

pytestmark = pytest.mark.slow  # spawns 2-rank gloo process groups

WORLD, EPOCHS, LR = 2, 2, 1e-2


def shard(model):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (WORLD,))
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def train(plan, rank, kind, *, stop_after=None, resume_from=None, save_to=None, seed=1):
    """Train the plan's epochs on this rank with DDP or FSDP2 and AdamW; returns per-update (loss, full grads)
    and the final full weights. `save_to`/`stop_after`: save a sharded checkpoint after that many updates and
    stop; `resume_from`: continue from one."""
    from plancc.runtime.shards import local_shards, restore_optimizer_shards, restore_shards

    model = tiny_model(seed=seed, layers=2)
    if kind == "ddp":
        model = torch.nn.parallel.DistributedDataParallel(model)
    else:
        shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    sampler, collator, tokens = PlanSampler(plan, rank=rank, world_size=WORLD), PlanCollator.from_plan(plan), \
        load_tokens(plan)
    step = 0
    if resume_from is not None:
        r = load_checkpoint(resume_from, sampler=sampler)
        model.load_state_dict(restore_shards(r.state["model"], model.state_dict()))
        opt.load_state_dict(restore_optimizer_shards(r.state["optim"], opt))
        step = r.step
    out, loss_sum = [], 0.0
    for epoch in range(sampler.epoch, EPOCHS):
        sampler.set_epoch(epoch)
        for mb in sampler:
            batch = collator(mb, tokens)
            last = batch["plan"]["last_in_update"]
            if kind == "ddp":
                ctx = contextlib.nullcontext() if last else model.no_sync()
            else:
                model.set_requires_gradient_sync(last)
                ctx = contextlib.nullcontext()
            with ctx:
                _, loss = microbatch_loss(model, batch, batch["num_items_in_batch"], world_size=WORLD)
                loss.backward()
            loss_sum += float(loss.detach())
            if last:
                inner = getattr(model, "module", model)
                out.append((loss_sum, {n: full(p.grad).clone() for n, p in inner.named_parameters()}))
                opt.step()
                opt.zero_grad(set_to_none=True)
                loss_sum, step = 0.0, step + 1
                if save_to is not None and step == stop_after:
                    save_checkpoint(save_to, step, {"model": local_shards(model.state_dict()),
                                                    "optim": local_shards(opt.state_dict())}, sampler=sampler)
                    return out, None
    inner = getattr(model, "module", model)
    return out, {n: full(p.detach()).clone() for n, p in inner.named_parameters()}


def _worker(rank: int, plan: str, tmp: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=rank, world_size=WORLD)
    torch.set_num_threads(1)
    try:
        results = {"ddp": train(plan, rank, "ddp"), "fsdp": train(plan, rank, "fsdp")}
        train(plan, rank, "fsdp", stop_after=3, save_to=f"{tmp}/ckpt")
        results["resumed"] = train(plan, rank, "fsdp", resume_from=f"{tmp}/ckpt", seed=7)
        torch.save(results, f"{tmp}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fsdp")
    plan = build_plan(tmp, n=24, data_seed=6, max_len=16, mode="packed", sequence_len=24, world_size=WORLD,
                      grad_accum=2, epochs=EPOCHS)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    mp.spawn(_worker, args=(str(plan), str(tmp)), nprocs=WORLD, join=True)
    return [torch.load(Path(tmp) / f"rank{r}.pt", weights_only=True) for r in range(WORLD)]


def test_fsdp_gives_ddps_losses_and_gradients(results):
    for ranks in results:
        ddp, fsdp = ranks["ddp"][0], ranks["fsdp"][0]
        assert len(ddp) == len(fsdp) > 3
        for (loss_d, grads_d), (loss_f, grads_f) in zip(ddp, fsdp, strict=True):
            assert abs(loss_d - loss_f) <= 1e-5 * abs(loss_d)
            assert max(rel_err(grads_f[k], grads_d[k]) for k in grads_d) < 1e-5
        assert max(rel_err(ranks["fsdp"][1][k], ranks["ddp"][1][k]) for k in ranks["ddp"][1]) < 1e-5


def test_a_sharded_checkpoint_resumes_exactly(results):
    for ranks in results:
        whole, resumed = ranks["fsdp"], ranks["resumed"]
        assert len(resumed[0]) == len(whole[0]) - 3  # the updates after the checkpoint
        assert all(torch.equal(whole[1][k], resumed[1][k]) for k in whole[1])

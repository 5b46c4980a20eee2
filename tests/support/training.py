"""Shared builders for the runtime tests: plans whose epochs differ in length, tiny models, gradient helpers.

The tokenized data and plans themselves come from `benchmarks.synthetic` (benchmarks use them too)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from benchmarks.synthetic import VOCAB, make_tokenized, samples_table, write_tokens
from plancc.build import run as build
from plancc.config.settings import PlanSettings
from plancc.store import parquet
from plancc.store.scan_record import ScanRecord


def build_uneven_plan(tmp: Path, *, capacities: tuple[int, ...] = (24, 12, 18), n: int = 24, data_seed: int = 3,
                      **settings) -> Path:
    """A packed plan whose epochs have different numbers of microbatches: epoch `e` is packed into rows of
    `capacities[e]` tokens (the plan records the largest, so no row exceeds the stored capacity). Plans compiled
    today keep one count for every epoch, but the runtime must not assume it."""
    from dataclasses import replace

    from plancc.planner.pipeline import plan_epoch

    tok = make_tokenized(n, seed=data_seed, min_len=3, max_len=min(capacities))
    tmp.mkdir(parents=True, exist_ok=True)
    table = samples_table(tok)
    path = write_tokens(tmp / "tokens", tok, table)
    s = parquet.sample_arrays(table)
    ps = PlanSettings(mode="packed", sequence_len=max(capacities), epochs=len(capacities), **settings)
    epochs = [plan_epoch(s, replace(ps, sequence_len=c), e) for e, c in enumerate(capacities)]
    out = tmp / "plan"
    build.write_plan_dir(out, table, s, ps, epochs, ScanRecord(), path)
    return out


def tiny_model(seed: int = 0, vocab: int = VOCAB, *, layers: int = 1, hidden: int = 16):
    """A tiny Llama from a config (no downloads; default 1 layer of width 16), fp32, dropout off."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=512,
                      attention_dropout=0.0, tie_word_embeddings=False)
    cfg._attn_implementation = "sdpa"
    model = LlamaForCausalLM(cfg).float()
    model.train()
    return model


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / max(float(b.norm()), 1e-30))


# ---------------------------------------------------------------- training-step references


def merge_microbatches(mbs):
    """One Microbatch holding every row of `mbs` (the whole update as one batch), counts summed."""
    from plancc.runtime import Microbatch

    ids, rows = [], [0]
    for mb in mbs:
        if mb.placeholder:
            continue
        ids += list(mb)
        rows += (np.asarray(mb.rows[1:]) + rows[-1]).tolist()
    first = mbs[0]
    return Microbatch(ids, epoch=first.epoch, index=first.index, update=first.update, micro_step=0, position=0,
                      last_in_update=True, rows=np.asarray(rows, dtype=np.int64),
                      label_count=sum(mb.label_count for mb in mbs), num_items=first.num_items)


def forward_logits(model, batch):
    from plancc.runtime import model_inputs

    return model(**model_inputs(batch)).logits


def grads_of(model) -> dict[str, torch.Tensor]:
    m = getattr(model, "module", model)
    return {n: (p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p)) for n, p in m.named_parameters()}


def update_gradients(model, batches, *, world_size: int = 1, naive: bool = False, sync=None, path: str = "chunked"):
    """Per update: (loss, gradients) from the token-mean loss over `batches` (collated, in sampler order), by the
    loss path `path` (`plancc.runtime.forward`; the trainers' default, so their arithmetic is the same).

    `naive=True` is the buggy mean-of-means loop: mean CE per microbatch, averaged over the update's microbatches.
    `sync(is_last)` returns the context to run a micro-step in (DDP no_sync for all but the last).
    """
    import contextlib

    import torch.nn.functional as F

    from plancc.runtime.forward import microbatch_loss

    out, loss_sum, per_update = [], 0.0, 0
    model.zero_grad(set_to_none=True)
    for batch in batches:
        per_update += 1
        ctx = sync(batch["plan"]["last_in_update"]) if sync else contextlib.nullcontext()
        with ctx:  # DDP decides at forward time whether the backward all-reduces
            if naive:
                logits = forward_logits(model, batch)
                n_mb = len([b for b in batches if b["plan"]["update"] == batch["plan"]["update"]])
                loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(),
                                       batch["shift_labels"].reshape(-1), ignore_index=-100) / n_mb
            else:
                loss = microbatch_loss(model, batch, batch["num_items_in_batch"], world_size=world_size, path=path)[1]
            loss.backward()
        loss_sum += float(loss.detach()) / world_size
        if batch["plan"]["last_in_update"]:
            out.append((loss_sum, grads_of(model)))
            model.zero_grad(set_to_none=True)
            loss_sum, per_update = 0.0, 0
    return out


def plain_loop_grads(plan, model, lr: float, steps: int | None = None, **sampler_kw):
    """Per-update gradients of the plain loop over the plan's epochs (the first `steps` updates), stepping SGD
    between updates like a Trainer does; returns them and the trained model."""
    from plancc.runtime import PlanCollator, PlanSampler, load_tokens

    opt = torch.optim.SGD(model.parameters(), lr=lr)
    collator, tokens = PlanCollator.from_plan(plan), load_tokens(plan)
    sampler = PlanSampler(plan, **sampler_kw)
    out = []
    for epoch in sampler.plan.epochs:
        sampler.set_epoch(epoch)
        batches = [collator(mb, tokens) for mb in sampler]
        for u in range(sampler.updates_per_epoch()):
            if steps is not None and len(out) == steps:
                return out, model
            (_, g), = update_gradients(model, [b for b in batches if b["plan"]["update"] == u])
            for n, p in model.named_parameters():
                p.grad = g[n].clone()
            opt.step()
            opt.zero_grad(set_to_none=True)
            out.append(g)
    return out, model

"""Shared builders for the runtime tests: synthetic tokenized data with lopsided label masks, plans, tiny models."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from plancc import build
from plancc.config import PlanSettings
from plancc.fingerprint import token_hashes
from plancc.pipeline import compile_plan

VOCAB = 48


def make_tokenized(n: int, *, seed: int = 0, min_len: int = 3, max_len: int = 24, shift: str = "sample",
                   vocab: int = VOCAB) -> pa.Table:
    """Samples with a masked prompt and a supervised completion of very uneven length (1 token .. most of it)."""
    rng = np.random.default_rng(seed)
    ids, labels, shifted = [], [], []
    for _ in range(n):
        length = int(rng.integers(min_len, max_len + 1))
        x = rng.integers(1, vocab, length).astype(np.int32)
        prompt = int(rng.integers(0, length)) if rng.random() < 0.85 else 0  # some fully supervised
        if rng.random() < 0.3:
            prompt = length - 1  # one supervised token: the lopsided case
        y = x.copy()
        y[:prompt] = -100
        if rng.random() < 0.1:  # a hole inside the completion
            y[rng.integers(0, length)] = -100
        s = np.full(length, -100, dtype=np.int32)
        s[:-1] = y[1:]
        ids.append(x.tolist())
        labels.append(y.tolist())
        shifted.append(s.tolist())
    cols = {"input_ids": pa.array(ids, pa.list_(pa.int32())), "labels": pa.array(labels, pa.list_(pa.int32()))}
    if shift == "none":
        cols["shift_labels"] = pa.array(shifted, pa.list_(pa.int32()))
    return pa.table(cols)


def samples_table(tok: pa.Table, shift: str = "sample") -> pa.Table:
    """The samples table (SPEC 2) of a tokenized table, with the scan's definitions."""
    target_col = "shift_labels" if shift == "none" else "labels"
    ids = tok.column("input_ids").combine_chunks()
    lab = tok.column(target_col).combine_chunks()
    off = np.asarray(ids.offsets, dtype=np.int64)
    ids_flat = ids.flatten().to_numpy()
    lab_flat = lab.flatten().to_numpy()
    sup = np.concatenate([[0], np.cumsum(lab_flat != -100)])
    return pa.table({
        "sample_id": pa.array(np.arange(len(tok), dtype=np.int64)),
        "length": pa.array(np.diff(off).astype(np.int32)),
        "label_count": pa.array((sup[off[1:]] - sup[off[:-1]]).astype(np.int32)),
        "first_label_supervised": pa.array(lab_flat[off[:-1]] != -100),
        "token_hash": pa.array(token_hashes(ids_flat, off, lab_flat, off)),
    })


def build_plan(tmp: Path, *, n: int = 40, seed: int = 0, data_seed: int = 0, min_len: int = 3, max_len: int = 24,
               tok: pa.Table | None = None, **settings) -> Path:
    """Write a tokenized Parquet and a compiled plan directory for it under `tmp`; returns the plan dir."""
    shift = settings.get("shift", "sample")
    if tok is None:
        tok = make_tokenized(n, seed=data_seed, min_len=min_len, max_len=max_len, shift=shift)
    tmp.mkdir(parents=True, exist_ok=True)
    path = tmp / "tokenized.parquet"
    pq.write_table(tok, path)
    table = samples_table(tok, shift)
    s = build.sample_arrays(table)
    ps = PlanSettings(seed=seed, **settings)
    epochs = compile_plan(s, ps)
    out = tmp / "plan"
    build.write_plan_dir(out, table, s, ps, epochs, {}, path)
    return out


def tiny_model(seed: int = 0, vocab: int = VOCAB):
    """A 1-layer Llama from a config (no downloads), fp32, dropout off."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
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


def update_gradients(model, batches, *, world_size: int = 1, naive: bool = False, sync=None):
    """Per update: (loss, gradients) from the token-mean loss over `batches` (collated, in sampler order).

    `naive=True` is the buggy mean-of-means loop: mean CE per microbatch, averaged over the update's microbatches.
    `sync(is_last)` returns the context to run a micro-step in (DDP no_sync for all but the last).
    """
    import contextlib

    import torch.nn.functional as F

    from plancc.runtime import token_loss

    out, loss_sum, per_update = [], 0.0, 0
    model.zero_grad(set_to_none=True)
    for batch in batches:
        per_update += 1
        ctx = sync(batch["plan"]["last_in_update"]) if sync else contextlib.nullcontext()
        with ctx:  # DDP decides at forward time whether the backward all-reduces
            logits = forward_logits(model, batch)
            if naive:
                n_mb = len([b for b in batches if b["plan"]["update"] == batch["plan"]["update"]])
                loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(),
                                       batch["shift_labels"].reshape(-1), ignore_index=-100) / n_mb
            else:
                loss = token_loss(logits, batch["shift_labels"], batch["num_items_in_batch"], world_size=world_size)
            loss.backward()
        loss_sum += float(loss.detach()) / world_size
        if batch["plan"]["last_in_update"]:
            out.append((loss_sum, grads_of(model)))
            model.zero_grad(set_to_none=True)
            loss_sum, per_update = 0.0, 0
    return out

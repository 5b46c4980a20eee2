"""Synthetic plan inputs for benchmarks and tests: the SFT mix of the reference run (no tokenizer, no files), and tokenized
samples with lopsided label masks written as a token store and a compiled plan directory.

The SFT mix:

prompt ~ lognormal(5.5, 0.9) clipped to [8, 3000], completion ~ lognormal(4.8, 1.2) clipped to [1, 3000],
length = min(prompt + completion, 4096), supervised labels = min(completion, length - 1).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa

from plancc.build import run as build
from plancc.config.settings import PlanSettings
from plancc.core.plan_arrays import SampleArrays
from plancc.planner.pipeline import compile_run
from plancc.store import parquet, token_writer
from plancc.store.fingerprint import token_hashes
from plancc.store.samples import samples_fingerprints
from plancc.store.scan_record import ScanRecord


def sft_mix(n: int, seed: int = 0, sequence_len: int = 4096) -> SampleArrays:
    """`n` samples of the mix drawn with `seed` (lengths capped at `sequence_len`), no first label supervised."""
    rng = np.random.default_rng(seed)
    prompt = np.clip(np.rint(rng.lognormal(5.5, 0.9, n)), 8, 3000).astype(np.int64)
    completion = np.clip(np.rint(rng.lognormal(4.8, 1.2, n)), 1, 3000).astype(np.int64)
    length = np.minimum(prompt + completion, sequence_len)
    labels = np.minimum(completion, length - 1)
    return SampleArrays(
        sample_id=np.arange(n, dtype=np.int64),
        length=length,
        label_count=labels,
        first_label_supervised=np.zeros(n, dtype=bool),
    )


VOCAB = 48


def mix_table(s: SampleArrays, first_id: int = 0) -> pa.Table:
    """A samples table of the synthetic mix as `plancc compile` reads one, ids from `first_id` (token hashes derived
    from the ids: the compile only fingerprints them)."""
    ids = s.sample_id + first_id
    return pa.table({
        "sample_id": ids,
        "length": s.length.astype(np.int32),
        "label_count": s.label_count.astype(np.int32),
        "first_label_supervised": s.first_label_supervised,
        "token_hash": ids.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15),
    })


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
    """The samples table (docs/spec.md §2) of a tokenized table, with the scan's definitions."""
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
               tok: pa.Table | None = None, parts: int | None = None, **settings) -> Path:
    """Write a tokenized Parquet and a compiled plan directory for it under `tmp`; returns the plan dir. `parts`: the
    token store cut into that many parts (`write_tokens`)."""
    shift = settings.get("shift", "sample")
    if tok is None:
        tok = make_tokenized(n, seed=data_seed, min_len=min_len, max_len=max_len, shift=shift)
    tmp.mkdir(parents=True, exist_ok=True)
    table = samples_table(tok, shift)
    path = write_tokens(tmp / "tokens", tok, table, shift, parts=parts)
    s = parquet.sample_arrays(table)
    ps = PlanSettings(seed=seed, **settings)
    run = compile_run(s, ps)
    out = tmp / "plan"
    build.write_plan_dir(out, table, run.train, ps, run.epochs, ScanRecord(), path, evaluation=run.evaluation)
    return out


def write_tokens(path: Path, tok: pa.Table, samples: pa.Table, shift: str = "sample", *,
                 parts: int | None = None) -> Path:
    """A token store of `tok` (the targets column the shift reads), as a scan writes it; with `parts`, a
    multi-part store of that many parts of consecutive rows (as a sharded scan writes it)."""
    ids = tok.column("input_ids").combine_chunks()
    lab = tok.column("shift_labels" if shift == "none" else "labels").combine_chunks()
    ids_flat, lab_flat = ids.flatten().to_numpy(), lab.flatten().to_numpy()
    off = np.asarray(ids.offsets, dtype=np.int64)
    kw = dict(fingerprints=samples_fingerprints(samples), labels_shifted=shift == "none")
    if parts is None:
        token_writer.write_store(path, ids_flat, lab_flat, off, chunk_tokens=64, **kw)
        return path
    bounds = np.linspace(0, len(tok), parts + 1).astype(np.int64)
    singles = [path.parent / f".{path.name}-part-{k}" for k in range(parts)]
    for single, lo, hi in zip(singles, bounds, bounds[1:], strict=False):
        a, b = off[lo], off[hi]
        token_writer.write_store(single, ids_flat[a:b], lab_flat[a:b], off[lo:hi + 1] - a, chunk_tokens=64, **kw)
    token_writer.write_parts(path, singles, **kw)  # hard links to the singles, removed once joined
    for single in singles:
        shutil.rmtree(single)
    return path

"""Preference pairs for benchmarks and tests: real pairs built from the Alpaca rows, tokenized pairs written as a
token store and a compiled plan, and synthetic pair lengths at scale.

Real pairs (`alpaca_pairs`): each row's prompt (its instruction and input in the Alpaca prompt), its own output as
the chosen completion and another row's output of a different length as the rejected one, so chosen and rejected
lengths differ in every pair as they do in real preference data.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa

from benchmarks.synthetic import sft_mix
from plancc.build import run as build
from plancc.config.settings import PlanSettings
from plancc.core.plan_arrays import SampleArrays
from plancc.planner.pipeline import compile_run
from plancc.store import parquet, token_writer
from plancc.store.fingerprint import token_hashes
from plancc.store.samples import samples_fingerprints
from plancc.store.scan_record import ScanRecord

# the shared data folder beside the checkout (a worktree sits one folder deeper than the main checkout)
ALPACA = next((p / "shared" / "data" / "alpaca-cleaned-1000.json" for p in Path(__file__).resolve().parents[2:4]
               if (p / "shared" / "data" / "alpaca-cleaned-1000.json").is_file()),
              Path(__file__).resolve().parents[2] / "shared" / "data" / "alpaca-cleaned-1000.json")
PROMPT = ("Below is an instruction that describes a task{ctx}. Write a response that appropriately completes the "
          "request.\n\n### Instruction:\n{instruction}\n\n{input}### Response:\n")


def alpaca_rows() -> list[dict]:
    """The shared Alpaca rows (1000 instruction, input, output triples)."""
    return json.loads(ALPACA.read_text())


def alpaca_pairs(n: int | None = None, seed: int = 0) -> list[dict[str, str]]:
    """`n` pairs (default: one per row; more repeat the rows with other rejected completions) of {prompt, chosen,
    rejected}: the row's prompt, its output, and a seeded other row's output of a different length."""
    rows = alpaca_rows()
    rng = np.random.default_rng(seed)
    n = len(rows) if n is None else n
    out = []
    for i in range(n):
        row = rows[i % len(rows)]
        while True:
            other = rows[int(rng.integers(len(rows)))]["output"]
            if len(other) != len(row["output"]):
                break
        ctx = ", paired with an input that provides further context" if row["input"] else ""
        prompt = PROMPT.format(ctx=ctx, instruction=row["instruction"],
                               input=f"### Input:\n{row['input']}\n\n" if row["input"] else "")
        out.append({"prompt": prompt, "chosen": row["output"], "rejected": other})
    return out


def pair_mix(n: int, seed: int = 0, sequence_len: int = 4096) -> SampleArrays:
    """`n` synthetic pairs at scale: the SFT mix's lengths (`sft_mix`), completions 2i (chosen) and 2i + 1."""
    s = sft_mix(2 * n, seed, sequence_len)
    return SampleArrays(s.sample_id, s.length, s.label_count, s.first_label_supervised,
                        np.repeat(np.arange(n, dtype=np.int64), 2), np.tile(np.array([True, False]), n))


def tokenize_pairs(pairs: list[dict[str, str]], encode, eos: int, *, limit: int | None = None) -> pa.Table:
    """Tokenized pairs as rows of input_ids/labels with pair_id and pair_role: each completion the prompt's ids
    then its own and `eos`, only the completion and eos supervised (`encode`: text -> ids); pairs with a
    completion longer than `limit` tokens are left out."""
    ids, labels, pid, role = [], [], [], []
    for i, pair in enumerate(pairs):
        prompt = encode(pair["prompt"])
        seqs = [(prompt + encode(pair[side]) + [eos], len(prompt)) for side in ("chosen", "rejected")]
        if limit is not None and max(len(x) for x, _ in seqs) > limit:
            continue
        for (x, p), side in zip(seqs, ("chosen", "rejected"), strict=True):
            ids.append(x)
            labels.append([-100] * p + x[p:])
            pid.append(i)
            role.append(side)
    return pa.table({"input_ids": pa.array(ids, pa.list_(pa.int32())), "labels": pa.array(labels, pa.list_(pa.int32())),
                     "pair_id": pa.array(pid, pa.int64()), "pair_role": pa.array(role, pa.string())})


def unpaired(tok: pa.Table, seed: int = 0) -> pa.Table:
    """Tokenized pairs as unpaired (KTO) rows, as TRL unpairs a preference dataset: every completion its own row,
    the chosen ones desirable, the rows in a seeded order."""
    order = np.random.default_rng(seed).permutation(len(tok))
    desirable = np.asarray(tok.column("pair_role").to_pylist()) == "chosen"
    return pa.table({"input_ids": tok.column("input_ids"), "labels": tok.column("labels"),
                     "desirable": pa.array(desirable)}).take(pa.array(order))


def _shifted(labels: pa.ChunkedArray) -> pa.Array:
    """Per-sample labels shifted left (pre-shifted labels for `--shift none`)."""
    return pa.array([[*y[1:], -100] for y in labels.to_pylist()], pa.list_(pa.int32()))


def preference_samples_table(tok: pa.Table, shift: str = "sample") -> pa.Table:
    """The samples table (docs/preference.md) of tokenized completions: one row per completion, with its pair and
    role (or its label); under `--shift none` its labels are counted pre-shifted."""
    ids = tok.column("input_ids").combine_chunks()
    lab = (_shifted(tok.column("labels")) if shift == "none" else tok.column("labels").combine_chunks())
    off = np.asarray(ids.offsets, dtype=np.int64)
    lab_flat = lab.flatten().to_numpy()
    sup = np.concatenate([[0], np.cumsum(lab_flat != -100)])
    first = lab_flat[off[:-1]] != -100 if shift != "none" else np.zeros(len(tok), dtype=bool)
    extra = ["pair_id", "pair_role"] if "pair_id" in tok.column_names else ["desirable"]
    return pa.table({
        "sample_id": pa.array(np.arange(len(tok), dtype=np.int64)),
        "length": pa.array(np.diff(off).astype(np.int32)),
        "label_count": pa.array((sup[off[1:]] - sup[off[:-1]]).astype(np.int32)),
        "first_label_supervised": pa.array(first),
        "token_hash": pa.array(token_hashes(ids.flatten().to_numpy(), off, lab_flat, off)),
        **{name: tok.column(name) for name in extra},
    })


def build_preference_plan(tmp: Path, tok: pa.Table, **settings) -> Path:
    """A token store and a compiled plan directory of tokenized completions (`tokenize_pairs`, or `unpaired` of
    them) under `tmp`; returns the plan dir."""
    tmp.mkdir(parents=True, exist_ok=True)
    shift = settings.get("shift", "sample")
    table = preference_samples_table(tok, shift)
    ids = tok.column("input_ids").combine_chunks()
    lab = _shifted(tok.column("labels")) if shift == "none" else tok.column("labels").combine_chunks()
    token_writer.write_store(tmp / "tokens", ids.flatten().to_numpy(), lab.flatten().to_numpy(),
                             np.asarray(ids.offsets, dtype=np.int64),
                             fingerprints=samples_fingerprints(table), labels_shifted=shift == "none",
                             chunk_tokens=4096)
    s = parquet.sample_arrays(table)
    ps = PlanSettings(**settings)
    run = compile_run(s, ps)
    out = tmp / "plan"
    build.write_plan_dir(out, table, run.train, ps, run.epochs, ScanRecord(), tmp / "tokens",
                         evaluation=run.evaluation)
    return out

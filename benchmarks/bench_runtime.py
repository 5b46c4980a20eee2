"""Runtime: load one rank's epoch of a 10M-sample plan, and the per-microbatch sampler + collator overhead.

1. Load: a 10M-sample plan (synthetic SFT mix, packed 4 x 4096 tokens per microbatch, W=8, G=4), built once with
   plancc.planner.pipeline + plancc.build.run.write_plan_dir and cached under $PLANCC_BENCH_DIR (/tmp/plancc-bench). Each run is a
   fresh process that opens the plan and reads rank 0's epoch 0 (`PlanSampler(...)._epoch_data()`): the time of
   that read (median of runs) and the process's peak RSS, also net of the imports. Goal: <= 1 s, <= 500 MB.
2. Overhead: on a 20k-sample plan with real tokens, the time per microbatch of `sampler.microbatch(p)` +
   `collator(mb, tokens)` minus the time of copying the same tokens (input ids and labels, int64 tensors).
   Goal: <= 100 us beyond the copy. Medians over every microbatch of the epoch, best of 3 passes.

    python benchmarks/bench_runtime.py [--runs 5] [--samples 10000000]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent))

WORK = Path(os.environ.get("PLANCC_BENCH_DIR", "/tmp/plancc-bench"))
PASSES = 3


def samples_table(s):
    import pyarrow as pa

    return pa.table({
        "sample_id": s.sample_id,
        "length": s.length.astype("int32"),
        "label_count": s.label_count.astype("int32"),
        "first_label_supervised": s.first_label_supervised,
        "token_hash": s.sample_id.astype("uint64") * np.uint64(0x9E3779B97F4A7C15),
    })


def big_plan(n: int) -> Path:
    out = WORK / f"runtime-plan-{n}"
    if (out / "manifest.json").exists():
        return out
    from synthetic import sft_mix

    from plancc.build import run as build
    from plancc.config.settings import PlanSettings
    from plancc.planner.pipeline import compile_plan
    from plancc.store.scan_record import ScanRecord

    t0 = time.perf_counter()
    s = sft_mix(n, seed=0)
    settings = PlanSettings(mode="packed", micro_batch_size=4, sequence_len=4096, world_size=8, grad_accum=4,
                            balance=False)
    build.write_plan_dir(out, samples_table(s), s, settings, compile_plan(s, settings), ScanRecord(), None)
    print(f"built {out} in {time.perf_counter() - t0:.1f}s", flush=True)
    return out


LOAD_CHILD = r"""
import json, sys, time
import plancc.runtime as rt

def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")

try:  # reset the peak-RSS mark (it can be inherited from the parent): measure this process only
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
except OSError:
    pass
base = status("VmRSS")
t0 = time.perf_counter()
sampler = rt.PlanSampler(sys.argv[1], rank=0, world_size=8)
ep = sampler._epoch_data()
t1 = time.perf_counter()
peak = status("VmHWM")
print(json.dumps({"seconds": t1 - t0, "peak_mb": peak, "net_mb": peak - base,
                  "microbatches": len(ep), "samples": int(ep.samples.shape[0]), "positions": len(sampler)}))
"""


def bench_load(plan: Path, runs: int) -> None:
    results = []
    for _ in range(runs):
        out = subprocess.run([sys.executable, "-c", LOAD_CHILD, str(plan)], check=True, capture_output=True,
                             text=True).stdout
        results.append(json.loads(out.strip().splitlines()[-1]))
    r0 = results[0]
    secs = statistics.median(r["seconds"] for r in results)
    peak = statistics.median(r["peak_mb"] for r in results)
    net = statistics.median(r["net_mb"] for r in results)
    print(f"load rank 0 of 8, epoch 0: {r0['microbatches']} microbatches, {r0['samples']} samples")
    print(f"  read      median {secs:.3f} s   (goal <= 1 s)        {'ok' if secs <= 1 else 'MISSED'}")
    print(f"  peak RSS  median {peak:.0f} MB (whole process, torch imported); {net:.0f} MB for the read itself "
          f"(goal <= 500 MB) {'ok' if peak <= 500 else 'MISSED'}")


def bench_overhead(n: int) -> None:
    import torch
    from synthetic import build_plan, make_tokenized

    from plancc.runtime import PlanCollator, PlanSampler, load_tokens

    torch.set_num_threads(1)
    tok = make_tokenized(n, seed=0, min_len=16, max_len=1024)
    configs = {
        "packed 1x4096": dict(mode="packed", micro_batch_size=1, sequence_len=4096),
        "packed 4x1024 real rows": dict(mode="packed", micro_batch_size=4, sequence_len=1024, real_batches=True),
        "padded 8 x <=1024": dict(mode="padded", micro_batch_size=8, sequence_len=1024, pad_multiple=64),
        "flattened 8": dict(mode="flattened", micro_batch_size=8, sequence_len=1024),
    }
    print(f"per-microbatch overhead ({n} samples, 16..1024 tokens; median over the epoch, best of {PASSES}):")
    print(f"  {'layout':26s} {'microbatches':>12s} {'tokens':>8s} {'copy us':>8s} {'minimal us':>11s} "
          f"{'sampler+collator us':>20s} {'overhead us':>11s}")
    print("  (copy: one memcpy of the microbatch's ids and labels; minimal: per-sample copies into padded rows,")
    print("   the least any collator does; overhead = sampler+collator - copy)")
    with tempfile.TemporaryDirectory() as tmp:
        for name, kw in configs.items():
            plan = build_plan(Path(tmp) / name.replace(" ", "_"), tok=tok, balance=False, **kw)
            tokens = load_tokens(plan, verify="counts")
            collator = PlanCollator.from_plan(plan)
            sampler = PlanSampler(plan)
            sampler.microbatch(0)  # read the epoch once
            passes = []
            for _ in range(PASSES):  # best of PASSES epoch medians: robust to other load on the machine
                full, copy, slices, ntok = [], [], [], []
                for p in range(len(sampler)):
                    t0 = time.perf_counter_ns()
                    mb = sampler.microbatch(p)
                    collator(mb, tokens)
                    t1 = time.perf_counter_ns()
                    ids = np.asarray(mb)
                    starts, lens = tokens.offsets[ids], tokens.offsets[ids + 1] - tokens.offsets[ids]
                    count = int(lens.sum())
                    a = int(starts[0])
                    t2 = time.perf_counter_ns()
                    torch.from_numpy(tokens.input_ids[a:a + count].astype(np.int64))
                    torch.from_numpy(tokens.targets[a:a + count].astype(np.int64))
                    t3 = time.perf_counter_ns()
                    minimal_collate(mb, starts, lens, tokens)
                    t4 = time.perf_counter_ns()
                    full.append(t1 - t0)
                    copy.append(t3 - t2)
                    slices.append(t4 - t3)
                    ntok.append(count)
                passes.append(tuple(statistics.median(v) / 1e3 for v in (full, copy, slices)))
            f, c, sl = min(passes)
            print(f"  {name:26s} {len(full):12d} {int(statistics.median(ntok)):8d} {c:8.1f} {sl:11.1f} {f:20.1f} "
                  f"{f - c:11.1f}  {'ok' if f - c <= 100 else 'MISSED'}")


def minimal_collate(mb, starts, lens, tokens):
    """The least a collator must do: copy each sample's ids and labels into right-padded rows (numpy slice
    copies, then zero-copy tensors)."""
    import torch

    bounds = mb.rows.tolist()
    starts, lens = starts.tolist(), lens.tolist()
    widths = [sum(lens[bounds[r]:bounds[r + 1]]) for r in range(len(bounds) - 1)]
    ids = np.zeros((len(widths), max(widths)), dtype=np.int64)
    labels = np.full((len(widths), max(widths)), -100, dtype=np.int64)
    x, y = tokens.input_ids, tokens.targets
    for r in range(len(widths)):
        w = 0
        for k in range(bounds[r], bounds[r + 1]):
            a, n = starts[k], lens[k]
            ids[r, w:w + n] = x[a:a + n]
            labels[r, w:w + n] = y[a:a + n]
            w += n
    return torch.from_numpy(ids), torch.from_numpy(labels)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--samples", type=int, default=10_000_000)
    ap.add_argument("--overhead-samples", type=int, default=20_000)
    args = ap.parse_args()
    plan = big_plan(args.samples)
    bench_load(plan, args.runs)
    bench_overhead(args.overhead_samples)


if __name__ == "__main__":
    main()

"""Opening a plan for training: `verified_plan`, then one rank's first epoch, at two sizes, in fresh processes.

Plans: the synthetic SFT mix (`synthetic.sft_mix`), 2 epochs, packed 4 x 4096, W=8, G=4, balance off (the open does
not depend on it; building is faster), built once with plancc.planner.pipeline + plancc.build.run.write_plan_dir
and cached under $PLANCC_BENCH_DIR (/tmp/plancc-bench), each with a copy of its plan file rewritten without the body
digest (`plancc.store.plan_body`): how a plan of an earlier plancc version opens, every epoch decoded and checked
against its plan fingerprint (the baseline, measured in the same session).

Each run is a fresh process that imports torch and plancc.runtime (the baseline of its memory), then times
`verified_plan(plan)` and, after it, `PlanSampler(plan, rank=0, world_size=8)`'s first epoch (what rank 0 reads
before step 1): wall and CPU seconds, and the peak resident memory above the baseline (VmHWM after resetting it).
Goal at 10M samples: verified_plan <= 0.5 s and <= 150 MB above the interpreter with torch.

    python benchmarks/bench_open.py [--runs 5] [--sizes 1000000 10000000]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent))

from figures import spread

WORK = Path(os.environ.get("PLANCC_BENCH_DIR", "/tmp/plancc-bench"))


def plans(n: int) -> tuple[Path, Path]:
    """(the plan, a copy whose plan file has no body digest), built once."""
    out, old = WORK / f"open-plan-{n}", WORK / f"open-plan-{n}-no-digest"
    if not (out / "manifest.json").exists():
        from bench_runtime import samples_table
        from synthetic import sft_mix

        from plancc.build import run as build
        from plancc.config.settings import PlanSettings
        from plancc.planner.pipeline import compile_plan
        from plancc.store.scan_record import ScanRecord

        t0 = time.perf_counter()
        s = sft_mix(n, seed=0)
        settings = PlanSettings(mode="packed", micro_batch_size=4, sequence_len=4096, world_size=8, grad_accum=4,
                                balance=False, epochs=2)
        build.write_plan_dir(out, samples_table(s), s, settings, compile_plan(s, settings), ScanRecord(), None)
        print(f"built {out} in {time.perf_counter() - t0:.1f}s", flush=True)
    if not (old / "manifest.json").exists():
        import shutil

        import pyarrow.parquet as pq

        shutil.copytree(out, old)
        table = pq.read_table(out / "plan.parquet")  # its schema metadata is the manifest; the digest is left out
        pq.write_table(table, old / "plan.parquet", compression="zstd", use_dictionary=False, row_group_size=65_536)
    return out, old


CHILD = r"""
import json, sys, time
import torch
import plancc.runtime as rt

def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024

def reset_peak():
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass

reset_peak()
base = status("VmRSS")
out = {}
w, c = time.perf_counter(), time.process_time()
plan = rt.verified_plan(sys.argv[1])
out["open"] = (time.perf_counter() - w, time.process_time() - c, status("VmHWM") - base)
w, c = time.perf_counter(), time.process_time()
sampler = rt.PlanSampler(plan, rank=0, world_size=8)
ep = sampler._epoch_data()
out["rank0"] = (time.perf_counter() - w, time.process_time() - c, status("VmHWM") - base)
out["microbatches"] = len(ep)
print(json.dumps(out))
"""


def measure(plan: Path, runs: int) -> list[dict]:
    results = []
    for _ in range(runs):
        done = subprocess.run([sys.executable, "-c", CHILD, str(plan)], check=True, capture_output=True, text=True)
        results.append(json.loads(done.stdout.strip().splitlines()[-1]))
    return results


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 10_000_000])
    args = ap.parse_args()
    print(f"open a 2-epoch plan (W=8, G=4, packed 4x4096), {args.runs} fresh processes each; min / median / max")
    print(f"{'samples':>10} {'plan file':>10} {'open by':>22} {'verified_plan wall s':>22} {'CPU s':>20} "
          f"{'peak MB':>16} {'+ rank 0 epoch 0 wall s':>24} {'peak MB':>16}")
    for n in args.sizes:
        new, old = plans(n)
        size = (new / "plan.parquet").stat().st_size / 1e6
        for label, plan in (("body digest (now)", new), ("every epoch decoded", old)):
            r = measure(plan, args.runs)
            print(f"{n:>10} {size:>8.1f}MB {label:>22} {spread([x['open'][0] for x in r], '.3f'):>22} "
                  f"{spread([x['open'][1] for x in r], '.3f'):>20} {spread([x['open'][2] for x in r], '.0f'):>16} "
                  f"{spread([x['rank0'][0] for x in r], '.3f'):>24} {spread([x['rank0'][2] for x in r], '.0f'):>16}",
                  flush=True)


if __name__ == "__main__":
    main()

"""Whole-process `plancc compile` from a samples table: wall time (median of runs) and peak RSS.

Workloads: the synthetic SFT mix (benchmarks/synthetic.py) at 100k, 1M and 10M samples; packed layout, 4 x 4096
tokens per microbatch, W=8, G=4, balancing on and off. Each run is a fresh process, so numba's on-disk cache and
imports are included as a user meets them (one warm-up run first fills the cache). Goals: 1M <= 10 s;
10M <= 2 min and <= 4 GB.

    python benchmarks/bench_compile.py [--sizes 100000,1000000] [--runs 3] [--runs-10m 1]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).parent))
from figures import child_usage
from synthetic import mix_table, sft_mix

WORK = Path(os.environ.get("PLANCC_BENCH_DIR", "/tmp/plancc-bench"))
FLAGS = ["--micro-batch-size", "4", "--sequence-len", "4096", "--world-size", "8", "--grad-accum", "4", "--quiet"]


def samples_file(n: int) -> Path:
    path = WORK / f"samples-{n}.parquet"
    if not path.exists():
        WORK.mkdir(parents=True, exist_ok=True)
        table = mix_table(sft_mix(n, seed=0))
        pq.write_table(table, path)
    return path


def run_once(cmd: list[str]) -> tuple[float, float]:
    """(seconds, peak RSS in MiB) of one child process."""
    usage = child_usage(cmd)
    return usage["wall"], usage["rss"] * 1024


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="100000,1000000,10000000")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--runs-10m", type=int, default=1, help="runs at 10M samples and more (each ~20-30 s)")
    args = ap.parse_args()
    plancc = [sys.executable, "-m", "plancc", "compile"]
    print("| samples | balance | median s | min s | max s | peak RSS MiB |")
    print("|---|---|---|---|---|---|")
    sizes = [int(x) for x in args.sizes.split(",")]
    for n in sizes:
        src = samples_file(n)
        for balance in ("--balance", "--no-balance"):
            cmd = [*plancc, str(src), "-o", str(WORK / f"plan-{n}"), "--overwrite", *FLAGS, balance]
            if n == sizes[0]:
                run_once(cmd)  # warm-up: numba's on-disk cache, page cache
            runs = [run_once(cmd) for _ in range(args.runs if n < 10_000_000 else args.runs_10m)]
            times = [t for t, _ in runs]
            print(f"| {n:,} | {balance[2:]} | {statistics.median(times):.2f} | {min(times):.2f} | {max(times):.2f} "
                  f"| {max(m for _, m in runs):.0f} |", flush=True)


if __name__ == "__main__":
    main()

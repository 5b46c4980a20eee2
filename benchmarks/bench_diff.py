"""Benchmark `plancc diff` on two 10M-sample plans.

The plans are built once from synthetic samples tables (library path: `compile_plan` + `write_plan_dir`) and
cached under /tmp/plancc-bench-diff; later runs only diff. OLD and NEW differ in their seed, the worst case for
churn: every epoch's plan fingerprint differs, so every microbatch and sample is compared (nothing short-cut).
EDITED has OLD's seed and data with 0.1% of its rows edited, 0.01% removed and 0.01% appended: the row-level
diff (`plancc.review.diff_rows`) matches every row of both samples tables.
Prints the build times once, then the median (and min/max) of `diff_plans` and of the rendered CLI call.

    python benchmarks/bench_diff.py [--samples 10000000] [--repeat 5] [--balance]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa


def samples_table(n: int, seed: int = 0) -> pa.Table:
    rng = np.random.default_rng(seed)
    length = np.clip(rng.lognormal(5.5, 0.8, n), 8, 4096).astype(np.int32)
    labels = np.maximum((length * rng.uniform(0.05, 0.95, n)).astype(np.int32), 2)
    return pa.table({
        "sample_id": pa.array(np.arange(n, dtype=np.int64)),
        "length": pa.array(length),
        "label_count": pa.array(labels),
        "first_label_supervised": pa.array(np.zeros(n, dtype=bool)),
        "token_hash": pa.array(rng.integers(0, 2**63, n, dtype=np.int64).astype(np.uint64)),
    })


def edited_table(table: pa.Table) -> pa.Table:
    """`table` with 0.1% of its rows edited (content hash changed), 0.01% removed and 0.01% appended."""
    n = table.num_rows
    rng = np.random.default_rng(1)
    h = table.column("token_hash").to_numpy().copy()
    h[rng.choice(n, n // 1000, replace=False)] ^= np.uint64(1)
    keep = np.setdiff1d(np.arange(n), rng.choice(n, n // 10_000, replace=False))
    edited = table.set_column(4, "token_hash", pa.array(h)).take(pa.array(keep))
    extra = samples_table(n // 10_000, seed=2)
    out = pa.concat_tables([edited, extra])
    return out.set_column(0, "sample_id", pa.array(np.arange(out.num_rows, dtype=np.int64)))


def build(path: Path, table: pa.Table, seed: int, balance: bool) -> float:
    from plancc.build.run import write_plan_dir
    from plancc.config.settings import PlanSettings
    from plancc.planner.pipeline import compile_plan
    from plancc.store.parquet import sample_arrays
    from plancc.store.scan_record import ScanRecord

    t0 = time.perf_counter()
    settings = PlanSettings(sequence_len=4096, world_size=8, grad_accum=4, seed=seed, balance=balance)
    s = sample_arrays(table)
    write_plan_dir(path, table, s, settings, compile_plan(s, settings), ScanRecord(), None)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=10_000_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--balance", action="store_true", help="build balanced plans (slower to build; same diff work)")
    ap.add_argument("--cache", type=Path, default=Path("/tmp/plancc-bench-diff"))
    args = ap.parse_args()

    from plancc.review.diff import diff_plans

    root = args.cache / f"n{args.samples}{'-balanced' if args.balance else ''}"
    old, new, edited = root / "old", root / "new", root / "edited"
    if not all((p / "manifest.json").exists() for p in (old, new, edited)):
        table = samples_table(args.samples)
        print(f"building plans for {args.samples:,} samples under {root} (once)", flush=True)
        print(f"  old (seed 0): {build(old, table, 0, args.balance):.1f} s", flush=True)
        print(f"  new (seed 1): {build(new, table, 1, args.balance):.1f} s", flush=True)
        print(f"  edited (seed 0): {build(edited, edited_table(table), 0, args.balance):.1f} s", flush=True)
    size = sum(f.stat().st_size for f in old.iterdir()) / 2**20
    times = []
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        report = diff_plans(old, new)
        times.append(time.perf_counter() - t0)
    c = report["churn"][0]
    print(f"plans: {c['samples_old']:,} samples, {c['microbatches_old']:,} microbatches each, {size:.0f} MiB on disk")
    print(f"churn: update changed {c['update_changed_share']:.1%}, rank changed {c['rank_changed_share']:.1%}, "
          f"identical microbatches {c['identical_microbatch_share']:.1%}")
    print(f"diff_plans (library): median {statistics.median(times):.2f} s  (min {min(times):.2f}, "
          f"max {max(times):.2f}, n={len(times)})")
    cli = []
    for _ in range(max(1, args.repeat // 2)):
        t0 = time.perf_counter()
        r = subprocess.run([sys.executable, "-m", "plancc", "diff", str(old), str(new), "--format", "markdown"],
                           capture_output=True, text=True)
        cli.append(time.perf_counter() - t0)
        assert r.returncode == 0, r.stderr
    print(f"plancc diff --format markdown (process, incl. imports): median {statistics.median(cli):.2f} s")
    times = []
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        report = diff_plans(old, edited)
        times.append(time.perf_counter() - t0)
    rows = report["datasets"][0]["rows"]
    print(f"edited data: {rows['edited']:,} edited, {rows['added']:,} added, {rows['removed']:,} removed rows; "
          f"diff_plans median {statistics.median(times):.2f} s (min {min(times):.2f}, max {max(times):.2f})")
    t0 = time.perf_counter()
    same = diff_plans(old, old)
    print(f"identical plans (fingerprint short-cut): {time.perf_counter() - t0:.3f} s, identical={same['identical']}")


if __name__ == "__main__":
    main()

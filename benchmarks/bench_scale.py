"""Compile at scale: whole-process `plancc compile` of a synthetic samples table at 10M, 50M and 100M samples.

Settings: packed 4 x 4096 tokens a microbatch, W=64, G=4, one epoch, balanced. Each run is a fresh child process
(imports and numba's on-disk cache as a user meets them; a 100k warm-up run fills the cache first); its wall
time, CPU time and peak RSS come from `wait4` (the peak of the compile process: it starts no workers of its own
beyond threads). The balance figures are the plan's own metrics (the `after` stage of epoch 0): update label CV,
microbatch label CV and packing efficiency, so a larger plan's balance can be held against the 10M one's.
Goals: 100M samples in <= 5 min and <= 8 GB.

The samples table is the SFT mix of `synthetic.sft_mix`, drawn in chunks of CHUNK samples (chunk k from seed
(seed, k)) and written one row group a chunk, so making the 100M table never holds more than a chunk; it is
cached under $PLANCC_BENCH_DIR (default /tmp/plancc-bench).

    python benchmarks/bench_scale.py [--sizes 10000000,50000000,100000000] [--runs 1] [--seeds 0] [--reference DIR]

`--reference DIR` (a plancc source folder, e.g. `git archive main plancc | tar -x -C DIR`) runs that code's compile
beside this checkout's, alternating run by run so both meet the same load, and prints a row of each ("before",
"after"); every child then imports plancc from its folder alone (`python -P`, PYTHONPATH).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).parent))
from figures import child_usage, spread
from synthetic import mix_table, sft_mix

WORK = Path(os.environ.get("PLANCC_BENCH_DIR", "/tmp/plancc-bench"))
CHUNK = 5_000_000
FLAGS = ["--micro-batch-size", "4", "--sequence-len", "4096", "--world-size", "64", "--grad-accum", "4",
         "--epochs", "1", "--balance", "--quiet"]
FIGURES = ("update_label_cv", "label_cv", "packing_efficiency")


def samples_file(n: int) -> Path:
    """The cached samples table of `n` samples (made chunk by chunk, written atomically)."""
    path = WORK / f"scale-samples-{n}.parquet"
    if path.exists():
        return path
    WORK.mkdir(parents=True, exist_ok=True)
    schema = pa.schema([("sample_id", pa.int64()), ("length", pa.int32()), ("label_count", pa.int32()),
                        ("first_label_supervised", pa.bool_()), ("token_hash", pa.uint64())])
    tmp = WORK / f".scale-samples-{n}-{os.getpid()}.tmp"
    with pq.ParquetWriter(tmp, schema) as writer:
        for k, lo in enumerate(range(0, n, CHUNK)):
            writer.write_table(mix_table(sft_mix(min(CHUNK, n - lo), seed=[0, k]), lo).cast(schema))
    os.replace(tmp, path)
    return path


def balance_figures(plan_dir: Path) -> dict[str, float]:
    """The `after` stage's balance figures of epoch 0, as the plan's metrics table stores them."""
    rows = pq.read_table(plan_dir / "metrics.parquet").to_pylist()
    after = next(r for r in rows if r["epoch"] == 0 and r["stage"] == "after")
    return {k: after[k] for k in FIGURES}


HERE = Path(__file__).resolve().parent.parent  # this checkout: the folder holding its plancc/


def compile_cmd(src: Path, out: Path, seed: int, code: Path | None = None) -> list[str]:
    """The compile child; with `code`, one that imports plancc from that folder only (see `run`)."""
    python = [sys.executable] if code is None else [sys.executable, "-P"]  # -P: not the working folder's plancc
    return [*python, "-m", "plancc", "compile", str(src), "-o", str(out), "--overwrite", "--seed", str(seed), *FLAGS]


def run(cmd: list[str], code: Path | None) -> dict[str, float]:
    """`child_usage` of `cmd`, its plancc imported from `code` (None: as the environment finds it)."""
    if code is None:
        return child_usage(cmd)
    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = str(code)
    try:
        return child_usage(cmd)
    finally:
        if saved is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = saved


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="10000000,50000000,100000000")
    ap.add_argument("--runs", type=int, default=1, help="runs per size and seed")
    ap.add_argument("--seeds", default="0", help="plan seeds, comma-separated")
    ap.add_argument("--json", type=Path, help="also write every run's figures here")
    ap.add_argument("--reference", type=Path, help="a plancc source folder to run beside this checkout")
    args = ap.parse_args()
    seeds = [int(x) for x in args.seeds.split(",")]
    out = WORK / "scale-plan"
    codes = {"": None} if args.reference is None else {" before": args.reference.resolve(), " after": HERE}
    for code in codes.values():
        run(compile_cmd(samples_file(100_000), out, 0, code), code)  # warm-up: numba's on-disk cache
    print("| samples | runs | wall s (min / median / max) | CPU s | peak RSS GiB | update label CV | "
          "microbatch label CV | packing efficiency |")
    print("|---|---|---|---|---|---|---|---|")
    record = []
    for n in (int(x) for x in args.sizes.split(",")):
        src = samples_file(n)
        runs: dict[str, list[dict]] = {label: [] for label in codes}
        for seed in seeds:
            for _ in range(args.runs):
                for label, code in codes.items():  # alternating: both codes meet the same load
                    runs[label].append({"samples": n, "seed": seed, "code": label.strip(),
                                        **run(compile_cmd(src, out, seed, code), code), **balance_figures(out)})
        for label, done in runs.items():
            record += done
            cols = [spread([r[k] for r in done], fmt) for k, fmt in
                    (("wall", ".0f"), ("cpu", ".1f"), ("rss", ".2f"), ("update_label_cv", ".2e"), ("label_cv", ".4f"),
                     ("packing_efficiency", ".4f"))]
            print(f"| {n:,}{label} | {len(done)} | " + " | ".join(cols) + " |", flush=True)
    if args.json:
        args.json.write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()

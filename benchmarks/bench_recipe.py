"""A 3-dataset recipe vs the same samples as one file: whole-process `plancc compile` wall time, min / median / max.

The datasets are samples tables of the synthetic SFT mix (benchmarks/synthetic.py, seeds 1, 2, 3) of 60%, 25% and
15% of `--samples` (default 200,000); the single file is their concatenation with the recipe's sample ids, so both
plans hold the same samples each epoch (every dataset at repeat 1). Packed, 4 x 4096 tokens, W=8, G=4, balanced.
Each run is a fresh process (imports and numba's on-disk cache included; one warm-up run of each first). Goal:
the recipe within 1.2x of the single file. `--kind preference`: the same with pairs (`--samples` completions,
half as many pairs; `benchmarks/preference_data.pair_mix`), pair ids offset as the recipe offsets them.

    python benchmarks/bench_recipe.py [--samples 200000] [--runs 3] [--kind sft|preference]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent))
from synthetic import sft_mix

from benchmarks.preference_data import pair_mix

WORK = Path(os.environ.get("PLANCC_BENCH_DIR", "/tmp/plancc-bench")) / "recipe"
FLAGS = ["--micro-batch-size", "4", "--sequence-len", "4096", "--world-size", "8", "--grad-accum", "4", "--quiet",
         "--overwrite"]
SHARES = (0.6, 0.25, 0.15)


def _table(n: int, seed: int, first_id: int, kind: str = "sft") -> pa.Table:
    s = sft_mix(n, seed=seed) if kind == "sft" else pair_mix(n // 2, seed=seed)
    ids = s.sample_id + first_id
    pairs = {} if kind == "sft" else {"pair_id": s.pair_id + first_id // 2,
                                      "pair_role": np.where(s.chosen, "chosen", "rejected")}
    return pa.table({
        "sample_id": ids,
        "length": s.length.astype("int32"),
        "label_count": s.label_count.astype("int32"),
        "first_label_supervised": s.first_label_supervised,
        "token_hash": s.sample_id.astype("uint64") * np.uint64(0x9E3779B97F4A7C15),  # content: not where it lands
        **pairs,
    })


def inputs(total: int, kind: str = "sft") -> tuple[list[Path], Path]:
    """The three datasets' samples tables and their concatenation (written once per size and kind)."""
    folder = WORK / (str(total) if kind == "sft" else f"{total}-{kind}")
    sizes = [int(total * share) // 2 * 2 for share in SHARES]  # even: whole pairs
    sizes[0] += total - sum(sizes)
    parts = [folder / name for name in ("instruct.parquet", "chat.parquet", "domain.parquet")]
    whole = folder / "all.parquet"
    if not whole.exists():
        folder.mkdir(parents=True, exist_ok=True)
        for path, n, seed in zip(parts, sizes, (1, 2, 3), strict=True):
            pq.write_table(_table(n, seed, 0, kind), path)  # each dataset's own ids, from 0
        offsets = np.cumsum([0, *sizes[:-1]])  # the recipe's ids: each dataset after the ones before it
        pq.write_table(pa.concat_tables([_table(n, seed, int(o), kind) for n, seed, o in zip(sizes, (1, 2, 3),
                                                                                             offsets, strict=True)]),
                       whole)
    return parts, whole


def timed(cmd: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, check=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=200_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--kind", choices=("sft", "preference"), default="sft")
    args = parser.parse_args()
    parts, whole = inputs(args.samples, args.kind)
    plancc = [sys.executable, "-m", "plancc", "compile"]
    commands = {"one file": [*plancc, str(whole), "-o", str(WORK / "plan-one"), *FLAGS],
                "recipe of 3": [*plancc, *map(str, parts), "-o", str(WORK / "plan-recipe"), *FLAGS]}
    times: dict[str, list[float]] = {}
    for cmd in commands.values():
        timed(cmd)  # warm-up: numba's cache, the page cache
    for _ in range(args.runs):  # interleaved, so a busy machine slows both alike
        for name, cmd in commands.items():
            times.setdefault(name, []).append(timed(cmd))
    for name, t in times.items():
        print(f"{name:12} {args.samples:,} samples: {min(t):.2f} / {statistics.median(t):.2f} / {max(t):.2f} s "
              "(min / median / max)")
    ratio = statistics.median(times["recipe of 3"]) / statistics.median(times["one file"])
    print(f"recipe / one file (medians): {ratio:.3f}x (goal <= 1.2x)")


if __name__ == "__main__":
    main()

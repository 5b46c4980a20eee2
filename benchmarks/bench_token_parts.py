"""Opening a plan whose token store has 1 to 1,000 parts: the cost of `verified_plan` + `load_tokens`, in fresh processes.

Data: 20,000 synthetic tokenized samples (`synthetic.make_tokenized`, 3-64 tokens), one plan per layout of the same
samples (packed 1 x 256, W=2): a single store, and a multi-part store of 1, 10, 100 and 1,000 parts of consecutive
rows (`synthetic.write_tokens(parts=)`, as a sharded scan writes them), built once under $PLANCC_BENCH_DIR
(/tmp/plancc-bench). Each run is a fresh process that imports plancc.runtime, then times `verified_plan(plan)` +
`load_tokens(plan)` (wall seconds) and counts the descriptors it holds after (`/proc/self/fd`), then rank 0's first
microbatch through the collator (what step 1 reads: a few parts), then every row (every part opened and mapped)
and the descriptors after that. min / median / max over `--runs` processes.

Run it with another plancc first on PYTHONPATH to measure that code on the same plans (the plans' format is the same).

    python benchmarks/bench_token_parts.py [--runs 5] [--parts 1 10 100 1000]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent))

from figures import spread

WORK = Path(os.environ.get("PLANCC_BENCH_DIR", "/tmp/plancc-bench"))
SAMPLES = 20_000


def plan(parts: int | None) -> Path:
    """The plan of the samples with a store of `parts` parts (None: a single store), built once."""
    out = WORK / f"token-parts-{parts or 'single'}"
    if not (out / "plan" / "manifest.json").exists():
        from synthetic import build_plan

        build_plan(out, n=SAMPLES, max_len=64, parts=parts, mode="packed", micro_batch_size=1, sequence_len=256,
                   world_size=2)
    return out / "plan"


CHILD = r"""
import json, os, sys, time
import numpy as np
from plancc.runtime import PlanCollator, PlanSampler, load_tokens, verified_plan

fds = lambda: len(os.listdir("/proc/self/fd"))
before = fds()
t = time.perf_counter()
plan = verified_plan(sys.argv[1])
tokens = load_tokens(plan)
out = {"open": time.perf_counter() - t, "fds": fds() - before}
t = time.perf_counter()
collator = PlanCollator.from_plan(plan)
collator(next(iter(PlanSampler(plan, rank=0, world_size=2))), tokens)
out["first"] = time.perf_counter() - t
t = time.perf_counter()
rows = np.arange(len(tokens))
tokens.check(rows)
tokens.input_ids[np.asarray(tokens.offsets[rows])]
out["all"], out["fds_all"] = time.perf_counter() - t, fds() - before
print(json.dumps(out))
"""


def measure(path: Path, runs: int) -> list[dict] | str:
    results = []
    for _ in range(runs):
        done = subprocess.run([sys.executable, "-c", CHILD, str(path)], capture_output=True, text=True)
        if done.returncode:
            return done.stderr.strip().splitlines()[-1][:160]
        results.append(json.loads(done.stdout.strip().splitlines()[-1]))
    return results


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--parts", type=int, nargs="+", default=[1, 10, 100, 1000])
    args = ap.parse_args()
    print(f"open a plan of {SAMPLES:,} samples, {args.runs} fresh processes each; min / median / max")
    print(f"{'store':>10} {'verified_plan + load_tokens ms':>32} {'fds held':>10} {'first microbatch ms':>22} "
          f"{'every row ms':>24} {'fds after':>10}")
    for parts in [None, *args.parts]:
        r = measure(plan(parts), args.runs)
        name = "single" if parts is None else f"{parts} parts"
        if isinstance(r, str):
            print(f"{name:>10} fails: {r}", flush=True)
            continue
        print(f"{name:>10} {spread([x['open'] * 1e3 for x in r], '.1f'):>32} {spread([x['fds'] for x in r], 'd'):>10} "
              f"{spread([x['first'] * 1e3 for x in r], '.1f'):>22} {spread([x['all'] * 1e3 for x in r], '.0f'):>24} "
              f"{spread([x['fds_all'] for x in r], 'd'):>10}", flush=True)


if __name__ == "__main__":
    main()

"""The trade kernel alone (`balance/_exchange.exchange_windows`): every call one plan makes, replayed.

One plan of the synthetic mix (W=8, G=4, sequence_len 4096) is made with this checkout, recording the arguments of
each `exchange_windows` call; then the calls are replayed `--reps` times on the kernel of `--tree` (default this
checkout; another checkout of plancc, e.g. `git worktree add /tmp/old COMMIT`, compares kernels on the same calls)
and the CPU seconds of a replay (all calls) are printed, min / median, with a digest of the results (equal digests:
the same trades). Set NUMBA_NUM_THREADS=1 to time one core; CPU time holds on a shared machine.

    NUMBA_NUM_THREADS=1 python benchmarks/bench_exchange.py --mode padded --mbs 4 [--size 200000] [--tree PATH]
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from synthetic import sft_mix


def record(size: int, mode: str, mbs: int) -> list[tuple]:
    """The arguments of every kernel call of one plan (copies: the kernel changes its state in place)."""
    from plancc.config.settings import PlanSettings
    from plancc.planner.balance import _common
    from plancc.planner.pipeline import plan_epoch

    calls, kernel = [], _common.exchange_windows

    def recording(bounds, members, state, rules):
        calls.append((bounds.copy(), members.copy(), [np.array(a, copy=True) for a in state], tuple(rules)))
        return kernel(bounds, members, state, rules)

    _common.exchange_windows = recording
    try:
        plan_epoch(sft_mix(size, seed=0), PlanSettings(mode=mode, micro_batch_size=mbs, sequence_len=4096,
                                                       world_size=8, grad_accum=4, seed=0), 0)
    finally:
        _common.exchange_windows = kernel
    return calls


def replay(exchange, calls: list[tuple]) -> tuple[float, str]:
    """CPU seconds of all `calls` on module `exchange`'s kernel, and a digest of what they did."""
    total, digest = 0.0, hashlib.sha1()
    for bounds, members, arrays, rules in calls:
        state = exchange.State(*(a.copy() for a in arrays))
        start = time.process_time()
        made = exchange.exchange_windows(bounds, members, state, exchange.Rules(*rules))
        total += time.process_time() - start
        digest.update(state.row_of.tobytes() + np.int64(made).tobytes())
    return total, digest.hexdigest()[:12]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", type=int, default=200_000)
    ap.add_argument("--mode", default="packed")
    ap.add_argument("--mbs", type=int, default=1)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--tree", help="another plancc checkout whose kernel replays the calls")
    args = ap.parse_args()
    calls = record(args.size, args.mode, args.mbs)
    if args.tree:
        for name in [m for m in sys.modules if m == "plancc" or m.startswith("plancc.")]:
            del sys.modules[name]
        sys.path.insert(0, str(Path(args.tree).resolve()))
    exchange = importlib.import_module("plancc.planner.balance._exchange")
    replay(exchange, calls[:1])  # loads (or compiles) the kernel
    runs = [replay(exchange, calls) for _ in range(args.reps)]
    times = [t for t, _ in runs]
    print(f"{args.mode} {args.size:,} mbs {args.mbs}: {len(calls)} calls, CPU s min {min(times):.3f} median "
          f"{statistics.median(times):.3f}, digest {runs[0][1]} ({exchange.__file__})")


if __name__ == "__main__":
    main()

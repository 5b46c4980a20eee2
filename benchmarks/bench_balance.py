"""Balancing quality and whole-compile time on the synthetic SFT mix, next to the figures Axolotl's balance_labels reached on it.

Workloads: seed 0, W=8, G=4, sequence_len 4096; packed at capacity 16384 (micro_batch_size 4) and 4096 (1), and
the fixed-count layouts (padded, flattened, micro_batch_size 4). Quality comes from one in-process compile of epoch
0 (rows, microbatch label CV before -> after, update label CV after, padding); time is the median wall time of
`plancc compile SAMPLES.parquet` in a fresh process (imports and numba's disk cache included, one warm-up first).
Reference columns are the figures measured for "reference (Axolotl balance_labels)" on this mix.

    python benchmarks/bench_balance.py [--sizes 20000,200000,1000000] [--runs 3] [--no-time] [--fixed]
    python benchmarks/bench_balance.py --seeds 0,1,2,3 [--sizes ...] [--mbs 4]
    python benchmarks/bench_balance.py --seeds 0,1,2,3 --reference ~/src/axolotl [--sizes ...] [--mbs 4]

`--seeds` prints, per size, min / median / max over the data seeds (draws of the mix) of the issue-13 goals at
capacity 4096 * mbs: microbatch label CV (and how far above its draw's floor, where rows holding a sample longer
than half a row impose one), rows above the lower bound, update label CV, mean rank cost CV within an update, and
the in-process plan time; never one draw.

`--reference PATH` runs the reference sampler beside plancc on the same arrays, imported from the user's Axolotl
checkout at PATH (its root or its `src/`; nothing of it lives in this project): `MultipackBatchSampler`'s packing,
then `label_balance.balance_labels` where that checkout has it (else the plain packing, said in the output). Both are judged by plancc's metrics on their microbatches; times are in-process (plancc: `plan_epoch`;
reference: building the sampler and its batches), wall and CPU seconds (every thread), reported as ratios
plancc / reference per draw. `--repeats N` makes each draw's plans N times, the two sides taking turns, and takes
each side's median time: on a shared machine one side's run can meet a stall (a draw of plancc at 1M samples took
3.7-4.9 s from run to run, the reference's 14.0-14.3 s).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent))

import numpy as np
from bench_compile import WORK, samples_file
from synthetic import sft_mix

from plancc.config.settings import PlanSettings
from plancc.planner.pipeline import plan_epoch

# (n, micro_batch_size) -> rows, label CV before, after, update CV after, seconds (median)
REFERENCE = {
    (20_000, 4): (744, 0.207, 0.0915, 0.0099, 1.27),
    (20_000, 1): (2989, 0.43, 0.34, 0.0126, 1.39),
    (200_000, 4): (7412, 0.212, 0.101, 0.0092, 9.25),
    (200_000, 1): (29774, 0.42, 0.34, 0.0206, 8.73),
    (1_000_000, 4): (37073, 0.214, 0.101, 0.0078, 57.9),
    (1_000_000, 1): (148936, 0.43, 0.34, 0.0180, 56.2),
}
def settings_for(mode: str, mbs: int) -> PlanSettings:
    return PlanSettings(mode=mode, micro_batch_size=mbs, sequence_len=4096, world_size=8, grad_accum=4, seed=0)


def compile_time(n: int, mode: str, mbs: int, runs: int, extra: tuple[str, ...] = ()) -> float:
    src = samples_file(n)
    out = WORK / f"plan-{n}-{mode}-{mbs}"
    cmd = [sys.executable, "-m", "plancc", "compile", str(src), "-o", str(out), "--mode", mode,
           "--micro-batch-size", str(mbs), "--sequence-len", "4096", "--world-size", "8", "--grad-accum", "4",
           "--quiet", "--overwrite", *extra]
    times = []
    for i in range(runs + 1):
        start = time.perf_counter()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        if i:  # the first run warms numba's cache
            times.append(time.perf_counter() - start)
    shutil.rmtree(out, ignore_errors=True)
    return statistics.median(times)


def label_cv_floor(n: int, mbs: int, rows: int, seed: int = 0) -> float:
    """A lower bound on the microbatch label CV of any packing into `rows` rows of capacity C = 4096 * mbs.

    A sample longer than C/2 shares its row with no other such sample, and the rest of the row holds at most
    C - length tokens, hence at most that many labels: the row's labels lie in [y, y + C - length]. Each such row
    is at least the distance from that range to the mean away from it; every other row may sit on the mean.
    """
    s = sft_mix(n, seed=seed)
    capacity = 4096 * mbs
    mean = s.label_count.sum() / rows
    big = s.length > capacity // 2
    low, high = s.label_count[big], s.label_count[big] + capacity - s.length[big]
    miss = np.maximum(low - mean, 0) + np.maximum(mean - high, 0)
    return float(np.sqrt((miss.astype(np.float64) ** 2).sum() / rows) / mean)


def quality(n: int, mode: str, mbs: int) -> tuple[dict, dict]:
    s = sft_mix(n, seed=0)
    metrics = dict(plan_epoch(s, settings_for(mode, mbs), 0).metrics)
    return metrics["before"], metrics["after"]


def rank_cost_cv(cost: np.ndarray, n_upd: int, w: int, g: int) -> float:
    """Mean over complete updates of the CV of the W ranks' total `cost` (micro-step-major layout); of the
    microbatches' labels, the rank label CV."""
    per_rank = cost[: n_upd * w * g].reshape(n_upd, g, w).sum(axis=1).astype(np.float64)
    return float((per_rank.std(axis=1) / per_rank.mean(axis=1)).mean())


def seed_stats(n: int, mbs: int, seeds: list[int]) -> dict[str, list[float]]:
    from plancc.core.plan_arrays import batch_cost

    settings = settings_for("packed", mbs)
    out: dict[str, list[float]] = {k: [] for k in ("cv", "over_floor", "rows_over", "update_cv", "rank_cv",
                                                   "seconds")}
    for seed in seeds:
        s = sft_mix(n, seed=seed)
        start = time.perf_counter()
        p = plan_epoch(s, settings, 0)
        out["seconds"].append(time.perf_counter() - start)
        after = dict(p.metrics)["after"]
        out["cv"].append(after["label_cv"])
        floor = label_cv_floor(n, mbs, after["packed_rows"], seed)
        out["over_floor"].append(after["label_cv"] / floor - 1 if floor > 0 else float("nan"))
        out["rows_over"].append(after["packed_rows"] / after["rows_lower_bound"] - 1)
        out["update_cv"].append(after["update_label_cv"])
        cost = batch_cost(p.batches, s, settings.pad_multiple)
        out["rank_cv"].append(rank_cost_cv(cost, after["complete_updates"], settings.world_size, settings.grad_accum))
    return out


def seed_table(sizes: list[int], seeds: list[int], mbs: int) -> None:
    print(f"capacity {4096 * mbs}, W=8, G=4, data seeds {','.join(map(str, seeds))}: min / median / max")
    print()
    print("| samples | label CV (goal max <= 0.05) | above its floor | rows above lower bound (<= 0.01%) | "
          "update CV (<= 0.003) | rank cost CV in an update (<= 0.02) | plan s (in process) |")
    print("|---|---|---|---|---|---|---|")
    for n in sizes:
        r = seed_stats(n, mbs, seeds)
        rows = " / ".join(f"{100 * x:.3f}%" for x in (min(r["rows_over"]), statistics.median(r["rows_over"]),
                                                        max(r["rows_over"])))
        floor = "-" if any(x != x for x in r["over_floor"]) else " / ".join(
            f"{100 * x:+.1f}%" for x in (min(r["over_floor"]), statistics.median(r["over_floor"]), max(r["over_floor"])))
        print(f"| {n:,} | {mmm(r['cv'], '.4f')} | {floor} | {rows} | {mmm(r['update_cv'], '.5f')} | "
              f"{mmm(r['rank_cv'], '.4f')} | {mmm(r['seconds'], '.1f')} |", flush=True)


def timed(fn, *args, **kwargs):
    """`fn(*args, **kwargs)`, its wall seconds and its CPU seconds (every thread of this process: numba's too)."""
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - wall, time.process_time() - cpu


def alternating(fns, repeats: int) -> list[tuple[object, float, float]]:
    """Each of `fns` (no-argument calls) run `repeats` times, taking turns: per call, its first result and its median
    wall and CPU seconds (a draw's time with a passing stall of the machine, on either side, outvoted)."""
    runs: list[list[tuple[object, float, float]]] = [[] for _ in fns]
    for _ in range(repeats):
        for out, fn in zip(runs, fns, strict=True):
            out.append(timed(fn))
    return [(r[0][0], statistics.median(x[1] for x in r), statistics.median(x[2] for x in r)) for r in runs]


def reference_table(sizes: list[int], seeds: list[int], mbs: int, path: str, repeats: int = 1) -> None:
    """Packed microbatches: plancc vs the reference's packing + balance_labels on the same draws."""
    import reference

    from plancc.planner.metrics import summarize

    sampler_cls, balanced = reference.microbatch_sampler(path)
    what = ("its packing + balance_labels (microbatch stage; no accumulation or rank ordering)" if balanced else
            "its plain packing (this checkout has no label_balance.balance_labels)")
    settings = settings_for("packed", mbs)
    print(f"capacity {4096 * mbs}, W=8, G=4, data seeds {','.join(map(str, seeds))}: plancc vs reference "
          f"({what}), min / median / max")
    print()
    print("| samples | label CV plancc | reference | update CV plancc | reference | rows plancc | reference | "
          "plan s plancc | reference | CPU s plancc | reference | time plancc / reference, wall | CPU |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")

    warm = sft_mix(2000, seed=0)  # compiles the reference's kernels (numba, no disk cache) and loads plancc's
    reference.microbatches(sampler_cls, balanced, warm, settings, 0)
    plan_epoch(warm, settings, 0)
    for n in sizes:
        r: dict[str, list[float]] = {}
        for seed in seeds:
            s = sft_mix(n, seed=seed)
            (plan, t_ours, c_ours), ((b, _), t_ref, c_ref) = alternating(
                (partial(plan_epoch, s, settings, 0),
                 partial(reference.microbatches, sampler_cls, balanced, s, settings, seed)), repeats)
            ours, ref = summarize(plan.batches, s, settings), summarize(b, s, settings)
            for key, value in (("cv", ours["label_cv"]), ("cv_ref", ref["label_cv"]),
                               ("ucv", ours["update_label_cv"]), ("ucv_ref", ref["update_label_cv"]),
                               ("rows", ours["packed_rows"]), ("rows_ref", ref["packed_rows"]),
                               ("s", t_ours), ("s_ref", t_ref), ("cpu", c_ours), ("cpu_ref", c_ref),
                               ("ratio", t_ours / t_ref), ("cpu_ratio", c_ours / c_ref)):
                r.setdefault(key, []).append(value)
        print(f"| {n:,} | {mmm(r['cv'], '.4f')} | {mmm(r['cv_ref'], '.4f')} | {mmm(r['ucv'], '.5f')} | "
              f"{mmm(r['ucv_ref'], '.5f')} | {mmm(r['rows'], '.0f')} | {mmm(r['rows_ref'], '.0f')} | "
              f"{mmm(r['s'], '.2f')} | {mmm(r['s_ref'], '.2f')} | {mmm(r['cpu'], '.2f')} | {mmm(r['cpu_ref'], '.2f')} | "
              f"{mmm(r['ratio'], '.3f')} | {mmm(r['cpu_ratio'], '.3f')} |", flush=True)


def mmm(v: list[float], fmt: str) -> str:
    """min / median / max of `v`, each formatted with `fmt`."""
    return " / ".join(format(x, fmt) for x in (min(v), statistics.median(v), max(v)))


FIXED_METRICS = (  # (metrics key or derived name, header, format); lower is better for every one
    ("label_cv", "label CV", ".4f"),
    ("cost_cv", "cost CV", ".4f"),
    ("padding_tokens", "padding tokens (M)", ".2f"),
    ("max_batch_cost", "peak cost", ".0f"),
    ("span_peak", "peak in complete updates", ".0f"),
    ("rank_cost_cv", "rank cost CV", ".4f"),
    ("rank_label_cv", "rank label CV", ".4f"),
    ("attention_cv", "attention CV", ".4f"),
    ("update_label_cv", "update CV", ".5f"),
)


def fixed_metrics(b, s, settings: PlanSettings) -> dict[str, float]:
    """The FIXED_METRICS of one plan (plancc's or the reference's), by plancc's metric definitions."""
    from plancc.core.plan_arrays import batch_cost, batch_targets
    from plancc.planner.metrics import summarize

    m = summarize(b, s, settings)
    m["rank_label_cv"] = rank_cost_cv(batch_targets(b, s, settings.shift), m["complete_updates"],
                                      settings.world_size, settings.grad_accum)
    m["cost_cv"] = m["std_batch_cost"] / m["mean_batch_cost"]
    m["padding_tokens"] = m["padding_tokens"] / 1e6
    span = m["complete_updates"] * settings.batches_per_update  # the tail after it is left as drawn, by both tools
    m["span_peak"] = int(batch_cost(b, s, settings.pad_multiple)[:span].max()) if span else 0
    return {key: float(m[key]) for key, _, _ in FIXED_METRICS}


def fixed_table(sizes: list[int], seeds: list[int], reference_path: str | None,
                layouts: tuple[str, ...] = ("flattened", "padded"), repeats: int = 1) -> None:
    """Padded and flattened (mbs 4, W=8, G=4): min / median / max over data seeds of FIXED_METRICS, with the
    reference's beside them and, per metric, on how many draws plancc is at least as good."""
    import reference

    ref = reference.load(reference_path) if reference_path else None
    print(f"fixed-count layouts, micro_batch_size 4, sequence_len 4096, W=8, G=4, data seeds "
          f"{','.join(map(str, seeds))}: min / median / max")
    print()
    heads = [h for _, h, _ in FIXED_METRICS] + ["plan s", "CPU s"]
    print("| layout, samples | plan | " + " | ".join(heads) + " |")
    print("|---" * (len(heads) + 2) + "|")
    keys = [(k, f) for k, _, f in FIXED_METRICS] + [("s", ".2f"), ("cpu", ".2f")]
    for mode in layouts:
        settings = settings_for(mode, 4)
        warm = sft_mix(2000, seed=0)  # loads plancc's kernels before the first timed plan
        plan_epoch(warm, settings, 0)
        for n in sizes:
            ours: dict[str, list[float]] = {}
            theirs: dict[str, list[float]] = {}
            for seed in seeds:
                s = sft_mix(n, seed=seed)
                fns = [partial(plan_epoch, s, settings, 0)]
                if ref:
                    fns.append(partial(reference.fixed_count, ref, s.length, s.targets(settings.shift), mode, 4,
                                       settings.world_size, settings.grad_accum, seed=settings.seed))
                for out, (made, wall, cpu) in zip((ours, theirs), alternating(fns, repeats), strict=False):
                    batches = made.batches if out is ours else made
                    for k, v in (*fixed_metrics(batches, s, settings).items(), ("s", wall), ("cpu", cpu)):
                        out.setdefault(k, []).append(v)
            print(f"| {mode} {n:,} | plancc | " + " | ".join(mmm(ours[k], f) for k, f in keys) + " |")
            if ref:
                print("| | reference | " + " | ".join(mmm(theirs[k], f) for k, f in keys) + " |")
                wins = [sum(a <= b for a, b in zip(ours[k], theirs[k], strict=True)) for k, _ in keys[:-2]]
                ratios = [mmm([a / b for a, b in zip(ours[k], theirs[k], strict=True)], ".3f") for k in ("s", "cpu")]
                print("| | plancc <= reference; time plancc / reference | " +
                      " | ".join(f"{w}/{len(seeds)}" for w in wins) + f" | {ratios[0]} | {ratios[1]} |", flush=True)
    if ref:
        print()
        print(f"reference = LabelBalancedRandomSampler + order_batches_by_rank from {reference_path}, on the same "
              "arrays; both judged by plancc's metrics; plan s in process.")


def cost_table(sizes: list[int], seeds: list[int]) -> None:
    """`--cost tokens` vs `--cost attention` per layout (W=8, G=4): min / median / max over data seeds of the
    attention figures rank ordering and within-update placement aim at, and of what must not change."""
    import dataclasses

    print(f"--cost tokens -> attention, W=8, G=4, data seeds {','.join(map(str, seeds))}: min / median / max")
    print()
    print("| layout, samples | rank attention CV | mean rank attention spread (M) | attention CV | "
          f"rank cost CV | draws of {len(seeds)} where attention is not above tokens |")
    print("|---|---|---|---|---|---|")
    from plancc.planner.metrics import summarize

    for mode, mbs in (("packed", 4), ("flattened", 4), ("padded", 4)):
        for n in sizes:
            r: dict[str, list[float]] = {}
            for seed in seeds:
                s = sft_mix(n, seed=seed)
                got = {}
                for cost in ("tokens", "attention"):
                    settings = dataclasses.replace(settings_for(mode, mbs), cost=cost)
                    got[cost] = summarize(plan_epoch(s, settings, 0).batches, s, settings)
                for key in ("rank_attention_cv", "mean_rank_attention_spread", "attention_cv", "rank_cost_cv"):
                    for cost in ("tokens", "attention"):
                        r.setdefault(f"{key}/{cost}", []).append(got[cost][key])
                for k in KEPT:
                    r.setdefault(f"kept/{k}", []).append(float(got["attention"][k] <= got["tokens"][k]))
            print(f"| {mode} {n:,} | {_pair(r, 'rank_attention_cv', '.4f')} | "
                  f"{_pair(r, 'mean_rank_attention_spread', '.2f', 1e6)} | {_pair(r, 'attention_cv', '.4f')} | "
                  f"{_pair(r, 'rank_cost_cv', '.4f')} | "
                  + ", ".join(f"{KEPT[k]} {int(sum(r[f'kept/{k}']))}" for k in KEPT) + " |", flush=True)


KEPT = {"label_cv": "label CV", "update_label_cv": "update CV", "padding_tokens": "padding",
        "max_batch_cost": "peak"}


def _pair(r: dict[str, list[float]], key: str, fmt: str, scale: float = 1.0) -> str:
    """'tokens -> attention' of min / median / max of `key`."""
    return " -> ".join(mmm([x / scale for x in r[f"{key}/{cost}"]], fmt) for cost in ("tokens", "attention"))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="20000,200000,1000000")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--no-time", action="store_true", help="quality only (no subprocess compiles)")
    ap.add_argument("--fixed", action="store_true", help="the fixed-count layouts over --seeds (default 0,1,2,3)")
    ap.add_argument("--layouts", default="flattened,padded", help="with --fixed: which fixed-count layouts")
    ap.add_argument("--cost", action="store_true", help="--cost tokens vs attention over --seeds, every layout")
    ap.add_argument("--seeds", help="data seeds: min / median / max of the goals over these draws instead")
    ap.add_argument("--mbs", type=int, default=4, help="with --seeds: rows of 4096 * MBS tokens")
    ap.add_argument("--reference", metavar="PATH", help="with --seeds: an Axolotl checkout whose sampler to run beside")
    ap.add_argument("--repeats", type=int, default=1,
                    help="with --reference: each draw's plans made this many times, the sides taking turns; the "
                         "median time of each side")
    args = ap.parse_args()
    sizes = [int(x) for x in args.sizes.split(",")]
    if args.fixed or args.cost:
        seeds = [int(x) for x in (args.seeds or "0,1,2,3").split(",")]
        if args.fixed:
            fixed_table(sizes, seeds, args.reference, tuple(args.layouts.split(",")), args.repeats)
        if args.cost:
            cost_table(sizes, seeds)
        return
    if args.seeds and args.reference:
        reference_table(sizes, [int(x) for x in args.seeds.split(",")], args.mbs, args.reference, args.repeats)
        return
    if args.seeds:
        seed_table(sizes, [int(x) for x in args.seeds.split(",")], args.mbs)
        return

    print("| workload | rows (ref) | rows lower bound | label CV before -> after | ref after | CV floor | update CV | "
          "ref | time s | no-balance s | ref s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for n in sizes:
        for mbs in (4, 1):
            before, after = quality(n, "packed", mbs)
            ref = REFERENCE.get((n, mbs))
            t = float("nan") if args.no_time else compile_time(n, "packed", mbs, args.runs)
            t0 = float("nan") if args.no_time else compile_time(n, "packed", mbs, args.runs, ("--no-balance",))
            r = ref or (None,) * 5
            print(f"| {n // 1000}k, capacity {4096 * mbs} | {after['packed_rows']} ({r[0]}) | "
                  f"{after['rows_lower_bound']} | {before['label_cv']:.3f} -> {after['label_cv']:.4f} | {r[2]} | "
                  f"{label_cv_floor(n, mbs, after['packed_rows']):.3f} | {after['update_label_cv']:.5f} | {r[3]} | {t:.2f} | {t0:.2f} | {r[4]} |")
    print()
    print("reference = reference (Axolotl balance_labels), figures measured on this synthetic mix, seed 0.")
    print("CV floor = no packing into these rows can go lower (rows holding a sample longer than half a row).")


if __name__ == "__main__":
    main()

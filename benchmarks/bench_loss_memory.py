"""Peak memory and time per update of the token-mean loss by each path of `plancc.runtime.forward`, on CPU.

Cases (tiny Llamas built from a config, fp32, no download; every token supervised):

* `small`: a 4M-parameter model (hidden 16, 2 layers) with the 128k Llama-3 vocabulary (128256), one microbatch
  of 2 x 2048-token rows an update: the logits dominate everything;
* `1b-like`: the shape of a 1B Llama-3 (tied 128k embeddings, GQA 4:1, MLP 4x) scaled to fit 2 cores
  (hidden 512, 4 layers, 8 heads, ~81M parameters), one microbatch of 2 x 1024-token rows an update.

Each (case, path, seed) runs in a fresh process: build the model, run `--updates` updates (forward, backward,
SGD step) and report the process's peak RSS (`ru_maxrss`) and the median seconds an update, wall and CPU (all
threads: on a shared machine the CPU time is the steadier figure). `logits` is the
full-logits path (`token_loss`), `chunked` plancc's default, `model` the model's own loss function. The losses of
each path are checked against the `logits` path's (relative 1e-5).

    python benchmarks/bench_loss_memory.py [--cases small 1b-like] [--paths logits chunked model]
        [--seeds 0 1 2] [--updates 3] [--out bench-out/loss-memory]
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from plancc.runtime.forward import LOSS_PATHS, microbatch_loss  # noqa: E402

VOCAB = 128256
CASES = {
    "small": dict(hidden=16, layers=2, heads=2, kv_heads=2, mlp=64, tied=False, rows=2, tokens=2048),
    "1b-like": dict(hidden=512, layers=4, heads=8, kv_heads=2, mlp=2048, tied=True, rows=2, tokens=1024),
}


def build_model(case: dict, seed: int):
    """A random-init Llama of `case`'s shape with the 128k vocabulary (sdpa attention, dropout off)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=case["hidden"], intermediate_size=case["mlp"],
                      num_hidden_layers=case["layers"], num_attention_heads=case["heads"],
                      num_key_value_heads=case["kv_heads"], max_position_embeddings=case["tokens"],
                      tie_word_embeddings=case["tied"], attention_dropout=0.0)
    cfg._attn_implementation = "sdpa"
    return LlamaForCausalLM(cfg).float().train()


def batch_for(case: dict, seed: int) -> dict:
    """One microbatch of `rows` packed rows of `tokens` tokens (one sample a row), every position supervised."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (case["rows"], case["tokens"] + 1), generator=g)
    shift = ids[:, 1:].clone()
    shift[:, -1] = -100
    labels = torch.full_like(shift, -100)
    labels[:, 1:] = shift[:, :-1]
    return {"input_ids": ids[:, :-1].contiguous(), "position_ids": torch.arange(case["tokens"]).repeat(case["rows"], 1),
            "shift_labels": shift, "labels": labels, "num_items_in_batch": torch.tensor(int((shift != -100).sum()))}


def run_one(case_name: str, path: str, seed: int, updates: int) -> dict:
    """In this process: the model, `updates` SGD updates by `path`; peak RSS (MB), seconds an update, losses."""
    case = CASES[case_name]
    model = build_model(case, seed)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    batch = batch_for(case, seed)
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    seconds, cpu, losses = [], [], []
    for _ in range(updates):
        start, cpu_start = time.perf_counter(), time.process_time()
        _, loss = microbatch_loss(model, batch, batch["num_items_in_batch"], path=path)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        seconds.append(time.perf_counter() - start)
        cpu.append(time.process_time() - cpu_start)
        losses.append(float(loss.detach()))
    return {"case": case_name, "path": path, "seed": seed, "params": sum(p.numel() for p in model.parameters()),
            "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "model_mb": base,
            "seconds": statistics.median(seconds), "cpu_seconds": statistics.median(cpu), "losses": losses}


def spread(values: list[float], fmt: str = "{:.2f}") -> str:
    return " / ".join(fmt.format(v) for v in (min(values), statistics.median(values), max(values)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    ap.add_argument("--paths", nargs="+", default=list(LOSS_PATHS), choices=list(LOSS_PATHS))
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--updates", type=int, default=3)
    ap.add_argument("--out", type=Path, default=ROOT / "bench-out" / "loss-memory")
    ap.add_argument("--one", nargs=3, metavar=("CASE", "PATH", "SEED"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(run_one(args.one[0], args.one[1], int(args.one[2]), args.updates)))
        return
    rows = []
    for case in args.cases:
        for seed in args.seeds:
            for path in args.paths:  # a fresh process each: its peak RSS is this run's alone
                out = subprocess.run([sys.executable, __file__, "--one", case, path, str(seed), "--updates",
                                      str(args.updates)], check=True, capture_output=True, text=True).stdout
                rows.append(json.loads(out.strip().splitlines()[-1]))
                print(f"{case} {path} seed {seed}: peak {rows[-1]['peak_mb']:.0f} MB, "
                      f"{rows[-1]['seconds']:.2f} s/update", flush=True)
    lines = ["| case | params | path | peak RSS MB (min / median / max) | s per update (min / median / max) | "
             "CPU s per update | max rel. loss diff vs logits |", "|---|---|---|---|---|---|---|"]
    for case in args.cases:
        for path in args.paths:
            mine = [r for r in rows if r["case"] == case and r["path"] == path]
            ref = {r["seed"]: r["losses"] for r in rows if r["case"] == case and r["path"] == "logits"}
            diff = max((abs(a - b) / abs(b) for r in mine if r["seed"] in ref
                        for a, b in zip(r["losses"], ref[r["seed"]], strict=True)), default=float("nan"))
            lines.append(f"| {case} | {mine[0]['params'] / 1e6:.1f}M | {path} | "
                         f"{spread([r['peak_mb'] for r in mine], '{:.0f}')} | {spread([r['seconds'] for r in mine])} | "
                         f"{spread([r['cpu_seconds'] for r in mine])} | "
                         f"{diff:.1e} |")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(rows, indent=1))
    (args.out / "results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()

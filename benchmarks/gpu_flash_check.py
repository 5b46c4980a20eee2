"""GPU check: packed rows through a tiny Llama with flash_attention_2 and plancc's varlen kwargs give every sample
its standalone logits, and the forward needs no host sync for the attention bounds.

    python benchmarks/gpu_flash_check.py            # exit 0: checked (or skipped: no CUDA / no flash-attn)
    python benchmarks/gpu_flash_check.py --cpu-dry-run   # the same steps with sdpa on the CPU (checks the script)

Builds a plan in a temporary directory (synthetic tokenized data, packed, 3 rows of 96 tokens per microbatch
with --real-batches), collates a few microbatches, runs `model(**model_inputs(batch, "flash_attention_2"))` in
bf16, and compares each sample's logits with a forward of that sample alone (same implementation, no packing).
Also runs the forward without the kwargs (transformers then infers the bounds from position_ids, which it does
for single-row batches only) and reports both paths' worst difference and time. A tiny random-init Llama from a config: nothing is downloaded. Not part of `make bench`'s CPU
figures: it prints one table and exits 1 if any sample differs by more than the bf16 tolerance.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--microbatches", type=int, default=4)
    ap.add_argument("--atol", type=float, default=2e-2, help="bf16 tolerance on logits")
    ap.add_argument("--cpu-dry-run", action="store_true", help="sdpa in fp32 on the CPU instead")
    args = ap.parse_args()

    import torch

    attn, device, dtype = "flash_attention_2", "cuda", torch.bfloat16
    if args.cpu_dry_run:
        attn, device, dtype = "sdpa", "cpu", torch.float32
    elif not torch.cuda.is_available():
        print("skipped: no CUDA device")
        return 0
    elif importlib.util.find_spec("flash_attn") is None:
        print("skipped: flash-attn is not installed (pip install flash-attn)")
        return 0
    from transformers import LlamaConfig, LlamaForCausalLM

    from benchmarks.synthetic import build_plan
    from plancc.runtime import PlanCollator, PlanSampler, load_tokens, model_inputs

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                      attention_dropout=0.0)
    cfg._attn_implementation = attn
    model = LlamaForCausalLM(cfg).to(device, dtype).eval()

    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    times: dict[str, list[float]] = {"varlen kwargs": [], "position_ids only": []}
    worst, checked = dict.fromkeys(times, 0.0), 0
    with tempfile.TemporaryDirectory() as tmp:
        plan = build_plan(Path(tmp), n=64, data_seed=3, min_len=4, max_len=90, mode="packed", micro_batch_size=3,
                          sequence_len=96, real_batches=True)
        tokens, collator = load_tokens(plan), PlanCollator.from_plan(plan)
        with torch.no_grad():
            for mb in list(PlanSampler(plan))[:args.microbatches]:
                batch = {k: (v.to(device) if torch.is_tensor(v) else v) for k, v in collator(mb, tokens).items()}
                for name, kw in (("varlen kwargs", model_inputs(batch, attn)),
                                 ("position_ids only", model_inputs(batch))):
                    sync()
                    t0 = time.perf_counter()
                    logits = model(**kw).logits
                    sync()
                    times[name].append(time.perf_counter() - t0)
                    for r in range(len(mb.rows) - 1):
                        start = 0
                        for sid in list(mb)[int(mb.rows[r]):int(mb.rows[r + 1])]:
                            a, b = int(tokens.offsets[sid]), int(tokens.offsets[sid + 1])
                            ids = torch.from_numpy(tokens.input_ids[a:b].astype("int64"))[None].to(device)
                            alone = model(input_ids=ids, use_cache=False).logits[0]
                            diff = float((logits[r, start:start + b - a].float() - alone.float()).abs().max())
                            worst[name] = max(worst[name], diff)
                            checked += name == "varlen kwargs"
                            start += b - a
    print(f"{attn}, {dtype}, {checked} packed samples in {args.microbatches} microbatches")
    for name, ts in times.items():
        ts = sorted(ts[1:] or ts)  # first call warms up
        print(f"forward with {name:18s} max |packed - standalone| logits {worst[name]:.3e}   "
              f"min {ts[0] * 1e3:.2f} ms  median {ts[len(ts) // 2] * 1e3:.2f} ms  max {ts[-1] * 1e3:.2f} ms")
    print(f"tolerance {args.atol} on the varlen-kwargs path" + (
        " (position_ids only is informative: flash attention infers packing from position_ids for single-row "
        "batches only, and these have 3 rows)" if "flash" in attn else ""))
    return 0 if worst["varlen kwargs"] <= args.atol else 1


if __name__ == "__main__":
    sys.exit(main())

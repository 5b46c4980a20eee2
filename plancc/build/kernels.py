"""Compile plancc's kernels into the installation's kernel cache ahead of the first real run.

    python -m plancc.build.kernels     (`make install` runs it; after `pip install plancc`, run it once)

A small prompt/completion source is scanned and compiled in every layout, each shift and both costs, which takes
every kernel an ordinary compile takes through numba (see docs/benchmarks.md for how long) into the folder
`plancc.core.jit.kernel_cache_dir` names. After that a compile in any new plancc cache dir starts warm. Kernels only
rare inputs reach (closing rows that best fit left with gaps) still compile on first use.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from plancc.build.run import compile_plan
from plancc.config.resolve import resolve
from plancc.core import jit

ROWS = 120
# (mode, micro_batch_size, shift, cost, pad_multiple): what selects a kernel's path or its argument types
RUNS = (("packed", 2, "sample", "tokens", 1), ("packed", 1, "row", "attention", 8), ("padded", 2, "sample", "tokens", 8),
        ("flattened", 2, "none", "attention", 1), ("packed", 2, "none", "tokens", 1))


def warm(folder: Path) -> int:
    """Scan and compile the small source in `folder` once per RUNS entry; returns the kernels numba compiled."""
    source = folder / "warm.jsonl"
    source.write_text("".join(f'{{"prompt": "question {i} {"x" * (i % 37) * 3}", "completion": "answer {i}"}}\n'
                              for i in range(ROWS)))
    with jit.numba.core.event.install_recorder("numba:compile") as compiles:
        for k, (mode, mbs, shift, cost, pad) in enumerate(RUNS):
            resolved = resolve(str(source), tokenizer="builtin", sequence_len=256, shift=shift, mode=mode,
                               micro_batch_size=mbs, cost=cost, pad_multiple=pad, world_size=2, grad_accum=2, epochs=1)
            compile_plan(resolved, folder / f"plan-{k}", cache_dir=folder / "cache")
        return len(compiles.buffer)


def main() -> None:
    """Warm the kernel cache and say where it is."""
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as folder:
        compiled = warm(Path(folder))
    where = jit.numba.config.CACHE_DIR or "numba's default cache"
    print(f"plancc kernels: {compiled} compiled into {where} in {time.perf_counter() - start:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()

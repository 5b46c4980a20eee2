"""examples/train_ddp.py under torchrun (2 ranks, gloo), then resumed elastically on 1 rank: same losses."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.runtime_helpers import build_plan

ROOT = Path(__file__).resolve().parent.parent


def run(args: list[str], nproc: int) -> str:
    launcher = ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"] if nproc > 1 else []
    cmd = [sys.executable, *launcher, str(ROOT / "examples" / "train_ddp.py"), "--model", "bigram", "--verify",
           "counts", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def losses(out: str) -> dict[int, str]:
    return {int(m.group(1)): m.group(2) for m in re.finditer(r"step\s+(\d+) loss (\S+)", out)}


def test_train_ddp_example_torchrun_and_elastic_resume(tmp_path):
    plan = build_plan(tmp_path / "p", n=40, data_seed=1, max_len=20, mode="packed", micro_batch_size=2,
                      sequence_len=24, world_size=2, grad_accum=2)
    ckpt = tmp_path / "ckpt"
    out = run(["--plan", str(plan), "--max-updates", "3", "--checkpoint", str(ckpt), "--save-every", "2"], 2)
    full = losses(out)
    assert sorted(full) == [1, 2, 3], out
    # resume the 2-rank checkpoint (taken at step 2, an update boundary) on 1 rank with grad_accum 4
    out = run(["--plan", str(plan), "--max-updates", "3", "--checkpoint", str(ckpt), "--resume",
               "--grad-accum", "4"], 1)
    assert "resumed at epoch 0, update 2" in out, out
    assert losses(out) == {3: full[3]}

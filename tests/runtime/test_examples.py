"""examples/train_ddp.py under torchrun (2 ranks, gloo): a rank killed while saving a checkpoint, resumed on 2
ranks (final weights and Adam state bitwise equal to the uninterrupted run's) and elastically on 1 rank;
examples/hf_trainer.py under `accelerate launch` (2 CPU processes) trains the weights one process does."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from benchmarks.synthetic import build_plan
from plancc.core.faults import FAULT_ENV
from plancc.runtime.checkpoint import LATEST, load_tensors, step_dir
from tests.support import REPO
from tests.support.training import rel_err

pytestmark = pytest.mark.slow  # runs the examples under torchrun

ROOT = REPO


def run(args: list[str], nproc: int, *, fault: str | None = None, ok: bool = True) -> str:
    launcher = ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"] if nproc > 1 else []
    cmd = [sys.executable, *launcher, str(ROOT / "examples" / "train_ddp.py"), "--model", "bigram", "--verify",
           "counts", *args]
    env = {k: v for k, v in os.environ.items() if k != FAULT_ENV} | ({FAULT_ENV: fault} if fault else {})
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)
    assert (proc.returncode == 0) == ok, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def losses(out: str) -> dict[int, str]:
    return {int(m.group(1)): m.group(2) for m in re.finditer(r"step\s+(\d+) loss (\S+)", out)}


def test_train_ddp_kill_during_save_then_resume_exact_and_elastic(tmp_path):
    plan = build_plan(tmp_path / "p", n=40, data_seed=1, max_len=20, mode="packed", micro_batch_size=2,
                      sequence_len=24, world_size=2, grad_accum=2)
    common = ["--plan", str(plan), "--max-updates", "3", "--save-every", "1"]
    full_dir, ckpt = tmp_path / "full", tmp_path / "ckpt"
    full = losses(run([*common, "--checkpoint", str(full_dir)], 2))
    assert sorted(full) == [1, 2, 3]

    # rank 1 dies (SIGKILL) with its step-3 file half-saved, after rank 0 finished its own: step 2 stays current
    out = run([*common, "--checkpoint", str(ckpt)], 2, fault="tensors_temp@step=3,rank=1", ok=False)
    assert (step_dir(ckpt, 3) / "rank0.json").exists() and list(step_dir(ckpt, 3).glob(".rank1.pt.tmp-*"))
    assert '"step": 2' in (ckpt / LATEST).read_text()
    assert losses(out) == full
    elastic = tmp_path / "elastic"
    shutil.copytree(ckpt, elastic)

    out = run([*common, "--checkpoint", str(ckpt), "--resume"], 2)
    assert "resumed at epoch 0, update 2 (step 2)" in out, out
    assert losses(out) == {3: full[3]}
    for rank in (0, 1):
        want = load_tensors(step_dir(full_dir, 3) / f"rank{rank}.pt")["state"]
        got = load_tensors(step_dir(ckpt, 3) / f"rank{rank}.pt")["state"]
        for name, t in want["model"].items():
            assert torch.equal(got["model"][name], t), name
        for i, s in want["optim"]["state"].items():
            for k, t in s.items():
                assert torch.equal(got["optim"]["state"][i][k], t), (i, k)
    assert not list(step_dir(ckpt, 3).glob(".*.tmp-*"))  # the next save cleared the killed one's leftovers

    # the same 2-rank checkpoint (step 2, an update boundary) resumed on 1 rank with grad_accum 4
    out = run([*common, "--checkpoint", str(elastic), "--resume", "--grad-accum", "4"], 1)
    assert "resumed at epoch 0, update 2" in out, out
    assert losses(out) == {3: full[3]}


def test_hf_trainer_example_accelerate_two_cpu_processes(tmp_path):
    plan = build_plan(tmp_path / "p", n=24, data_seed=1, max_len=20, mode="packed", micro_batch_size=2,
                      sequence_len=24, world_size=2, grad_accum=2)
    example = [str(ROOT / "examples" / "hf_trainer.py"), "--plan", str(plan), "--max-steps", "2", "--save-steps", "2"]
    accelerate = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
                  "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]
    for cmd, out in ((accelerate, "two"), ([sys.executable], "one")):
        proc = subprocess.run([*cmd, *example, "--output-dir", str(tmp_path / out)], capture_output=True, text=True,
                              timeout=300, cwd=ROOT)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert (tmp_path / "two" / "checkpoint-2" / "rng_state_1.pth").exists()  # two processes ran
    two = load_file(tmp_path / "two" / "checkpoint-2" / "model.safetensors")
    one = load_file(tmp_path / "one" / "checkpoint-2" / "model.safetensors")
    assert max(rel_err(two[k], one[k]) for k in one) < 1e-5


def test_train_ddp_world_size_mismatch_is_one_line_naming_the_flag(tmp_path):
    plan = build_plan(tmp_path / "p", n=12, data_seed=1, max_len=20, mode="packed", micro_batch_size=2,
                      sequence_len=24, world_size=2, grad_accum=2)
    cmd = [sys.executable, str(ROOT / "examples" / "train_ddp.py"), "--plan", str(plan), "--model", "bigram"]
    for extra, said in (([], "without --grad-accum"), (["--grad-accum", "3"], "with --grad-accum 3")):
        proc = subprocess.run([*cmd, *extra], capture_output=True, text=True, timeout=300, cwd=ROOT)
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.strip().count("\n") == 0 and "Traceback" not in proc.stderr, proc.stderr
        assert said in proc.stderr and "1 process(es)" in proc.stderr and "pass --grad-accum 4" in proc.stderr

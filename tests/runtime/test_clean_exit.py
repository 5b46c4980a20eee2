"""A process that reads a plan exits as Python does, rc 0: it never leaves an Arrow worker thread alive for the
interpreter's exit, where one can abort a finished process (SIGABRT, "terminate called without an active
exception"; the CLI leaves through `os._exit`, a user's training script or torchrun worker does not)."""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from benchmarks.synthetic import build_plan
from tests.support import REPO

pytestmark = [pytest.mark.slow,  # spawns processes
              pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="threads counted in /proc")]
ROOT = REPO

# open, load the tokens (every sample rehashed), feed rank 0's first epoch; print the process's threads after the
# imports and at the end
SCRIPT = """
import os, sys
from plancc.runtime import PlanCollator, PlanDataLoader, PlanDataset, PlanSampler, load_tokens, verified_plan
threads = lambda: len(os.listdir("/proc/self/task"))
before = threads()
plan = verified_plan(sys.argv[1])
loader = PlanDataLoader(PlanDataset(load_tokens(plan, verify="hash"), PlanCollator.from_plan(plan)),
                        PlanSampler(plan, rank=0, world_size=2))
fed = sum(int(batch["num_items_in_batch"]) for batch in loader)
print(before, threads(), fed)
"""


@pytest.fixture(scope="module")
def plan(tmp_path_factory) -> Path:
    return build_plan(tmp_path_factory.mktemp("exit"), n=400, mode="packed", micro_batch_size=2, sequence_len=64,
                      world_size=2)


def _run(plan: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-c", SCRIPT, str(plan)], capture_output=True, text=True, env=env,
                          timeout=300)


def test_reading_and_feeding_a_plan_starts_no_thread(plan):
    """The threads after the imports (the BLAS and allocator threads) are all there are after a plan is opened,
    its tokens loaded and an epoch fed: nothing is left running for the interpreter's exit."""
    out = _run(plan)
    assert out.returncode == 0, out.stderr
    before, after, fed = map(int, out.stdout.split())
    assert after == before and fed > 0, out.stdout


def test_open_and_load_exits_0_every_time(plan):
    with ThreadPoolExecutor(2) as pool:
        runs = list(pool.map(lambda _: _run(plan), range(50)))
    failed = [(r.returncode, r.stderr[-300:]) for r in runs if r.returncode != 0]
    assert not failed, failed


# the same plan read the way `plancc validate`/`inspect` and a compile read Parquet (their processes leave through
# `os._exit`): Arrow decodes on its worker threads there
REVIEW_SCRIPT = """
import os, sys
from plancc.store.plan import Plan
threads = lambda: len(os.listdir("/proc/self/task"))
before = threads()
plan = Plan(sys.argv[1])
rows = plan.files.read_rows(["epoch", "index", "sample_ids"]).num_rows + plan.files.read_samples().num_rows
print(before, threads(), rows)
"""


def test_reading_outside_the_runtime_keeps_arrows_threads(plan):
    """Only the runtime's reads are single-threaded: the same reads of a plan opened as `Plan` (review, compile)
    decode on Arrow's worker threads."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", REVIEW_SCRIPT, str(plan)], capture_output=True, text=True, env=env,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    before, after, rows = map(int, out.stdout.split())
    assert after > before and rows > 0, out.stdout

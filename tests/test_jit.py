"""Compiled kernels: numba's disk cache lives in the plancc cache dir, and a cold start says it is compiling."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np

from plancc import jit
from plancc.config import PlanSettings
from plancc.pipeline import compile_plan
from plancc.plan import SampleArrays

ROOT = Path(__file__).parent.parent


def test_every_kernel_module_is_listed():
    importing = set()
    for path in (ROOT / "plancc").rglob("*.py"):
        if re.search(r"^from plancc\.jit import numba$", path.read_text(), re.M):
            importing.add(".".join(path.relative_to(ROOT).with_suffix("").parts))
    assert importing == set(jit.KERNEL_MODULES)
    for path in set((ROOT / "plancc").rglob("*.py")) - {ROOT / "plancc" / "jit.py"}:  # none bypasses jit
        assert not re.search(r"^import numba", path.read_text(), re.M), path


def test_numba_caches_under_the_plancc_cache(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    env["PLANCC_CACHE"] = str(tmp_path / "cache")
    out = subprocess.run([sys.executable, "-c", "import plancc.jit, numba; print(numba.config.CACHE_DIR)"],
                         env=env, capture_output=True, text=True, check=True).stdout.strip()
    assert Path(out) == tmp_path / "cache" / "numba"


def test_a_cold_start_says_it_compiles_once(tmp_path, monkeypatch):
    monkeypatch.setattr(jit, "CACHE_DIR", tmp_path)
    rng = np.random.default_rng(0)
    n = 200
    length = rng.integers(10, 500, n)
    s = SampleArrays(np.arange(n), length, length // 2, np.zeros(n, dtype=bool))
    settings = PlanSettings(micro_batch_size=2, sequence_len=512, world_size=2, grad_accum=2)
    said = []
    for _ in range(2):
        said.append([phase for phase, *_ in _calls(lambda p: compile_plan(s, settings, progress=p))])
    assert jit.COMPILING in said[0] and jit.COMPILING not in said[1]
    assert not jit.cold()


def _calls(run):
    calls = []
    run(lambda phase, done, total: calls.append((phase, done, total)))
    return calls

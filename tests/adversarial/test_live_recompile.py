"""A plan recompiled into the path a run trains from changes nothing for the run (docs/plan-format.md, reliability):
an open plan keeps its directory (held for reading: the recompile moves it aside instead of removing it), its
token store is mapped when the plan is opened, and DataLoader workers started by spawn after the recompile reopen
the run's plan through the directory the run holds, not by path."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import plancc
from plancc.runtime import (
    PlanCollator,
    PlanDataLoader,
    PlanDataset,
    PlanSampler,
    load_tokens,
    verified_plan,
)
from plancc.runtime.data import check_tokens
from tests.support.sources import write_rows

SETTINGS = {"tokenizer": "builtin", "sequence_len": 128, "micro_batch_size": 2, "world_size": 1, "grad_accum": 2,
            "epochs": 2, "seed": 1}


def _rows(n: int, word: str) -> list[dict]:
    return [{"prompt": f"{word} {i}: " + "why? " * (i % 5), "completion": f"{word} " * (1 + i % 7)} for i in range(n)]


@pytest.fixture
def sources(tmp_path) -> tuple[Path, Path]:
    return write_rows(tmp_path / "a.jsonl", _rows(40, "alpha")), write_rows(tmp_path / "b.jsonl", _rows(52, "beta"))


def _compile(source: Path, out: Path, cache: Path) -> plancc.Plan:
    return plancc.compile(source, out, cache_dir=cache, overwrite=True, **SETTINGS)


def _hidden(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith(".live.plancc-"))


def test_open_then_recompile_then_verified_plan_trains_on_the_plan_that_was_opened(sources, tmp_path):
    """`plancc.open_plan`, a recompile of other data into its path, then `verified_plan` and `load_tokens` on the
    plan object: the plan that was opened, tokens included (every planned sample hashes as the plan says), while a
    new open gets the new plan; the old directory stays beside it, hidden, until no process holds it."""
    live, cache = tmp_path / "live", tmp_path / "cache"
    first = _compile(sources[0], live, cache).fingerprints
    plan = plancc.open_plan(live)
    second = _compile(sources[1], live, cache).fingerprints
    assert first != second
    opened = verified_plan(plan)
    assert opened.fingerprints == first
    tokens = load_tokens(opened, verify="hash")
    assert check_tokens(opened, tokens) is None
    assert plancc.open_plan(live).fingerprints == second
    assert len(_hidden(tmp_path)) == 1  # the run's directory, moved aside, kept while the run holds it
    del plan, opened, tokens
    gc.collect()
    plancc.open_plan(live)  # any command beside it removes it once nothing holds it
    assert _hidden(tmp_path) == []


def _batches(loader: PlanDataLoader) -> list[tuple[int, list[int]]]:
    return [(int(b["plan"]["index"]), b["input_ids"].flatten().tolist()) for b in loader]


@pytest.mark.slow
def test_spawned_workers_after_a_recompile_read_the_run_s_own_plan(sources, tmp_path):
    """Epoch 0 with spawned DataLoader workers, the plan recompiled from other data into the same path, epoch 1 with
    new spawned workers: they read the run's plan (the batches equal those collated in this process from the
    plan opened at the start), not the new one and not a refusal."""
    live, cache = tmp_path / "live", tmp_path / "cache"
    _compile(sources[0], live, cache)
    plan = verified_plan(live)
    tokens = load_tokens(plan)
    collator = PlanCollator.from_plan(plan)
    expected = {}
    for epoch in plan.epochs:
        sampler = PlanSampler(plan, epoch=epoch)
        expected[epoch] = [(mb.index, collator(mb, tokens)["input_ids"].flatten().tolist()) for mb in sampler]
    sampler = PlanSampler(plan)
    loader = PlanDataLoader(PlanDataset(tokens, collator), sampler, num_workers=1, multiprocessing_context="spawn")
    assert _batches(loader) == expected[0]
    _compile(sources[1], live, cache)
    assert verified_plan(live).fingerprints != plan.fingerprints
    loader.set_epoch(1)
    assert _batches(loader) == expected[1]


_RECOMPILER = r"""
import sys, time
import plancc
sources, live, cache, until = sys.argv[1:3], sys.argv[3], sys.argv[4], float(sys.argv[5])
settings = {"tokenizer": "builtin", "sequence_len": 128, "micro_batch_size": 2, "world_size": 1, "grad_accum": 2,
            "epochs": 2, "seed": 1}
n = 0
while time.time() < until:
    plancc.compile(sources[n % 2], live, cache_dir=cache, overwrite=True, **settings)
    n += 1
print(n)
"""


@pytest.mark.slow
def test_a_reader_loop_against_repeated_recompiles_never_fails(sources, tmp_path):
    """For 20 s, another process recompiles one path from two sources in turn while this one opens it over and
    over, verifies it, maps its tokens and collates its first microbatch: every open succeeds, and reads one of the
    two plans whole (its tokens hash as its samples table says)."""
    live, cache = tmp_path / "live", tmp_path / "cache"
    fingerprints = {_compile(s, live, cache).fingerprints["dataset"] for s in sources}
    until = time.time() + 20
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    writer = subprocess.Popen([sys.executable, "-c", _RECOMPILER, *map(str, sources), str(live), str(cache),
                               str(until)], env=env, stdout=subprocess.PIPE, text=True)
    opens = 0
    try:
        while time.time() < until:
            plan = verified_plan(live)
            assert plan.fingerprints["dataset"] in fingerprints
            tokens = load_tokens(plan)
            mb = next(iter(PlanSampler(plan)))
            assert PlanCollator.from_plan(plan)(mb, tokens)["input_ids"].numel() > 0
            opens += 1
    finally:
        out, _ = writer.communicate(timeout=120)
    assert writer.returncode == 0
    recompiles = int(out.strip())
    print(f"{opens} opens against {recompiles} recompiles")
    assert opens >= 20 and recompiles >= 3

"""Count-like settings fit the machine: a repeat, `samples_per_epoch`, `--epochs` or `--num-proc` that asks for more
than this process can hold or run is one line naming the setting and what fits, checked before any work (or, where
the data's size decides, before anything is planned), never the kernel's out-of-memory killer."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from plancc.cli import app
from plancc.config.settings import MixEntry, PlanSettings
from plancc.core.machine import usable_cpus
from plancc.errors import SettingsError
from plancc.planner import mixture
from plancc.planner.budget import PLANNED_SAMPLE_BYTES, check_fits
from tests.support import REPO

ROOT = REPO
GIB = 2**30


def _pc(path: Path, n: int) -> Path:
    path.write_text("".join(json.dumps({"prompt": f"question {i}", "completion": f"answer {i}"}) + "\n"
                            for i in range(n)))
    return path


def _plancc(args: list, tmp_path: Path, address_space: int = 3 * GIB) -> subprocess.CompletedProcess:
    """The CLI in a child process under `ulimit -v` (a regression runs out of memory there, not here)."""
    return subprocess.run([sys.executable, "-m", "plancc", *map(str, args)], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT),
                                            "PLANCC_CACHE": str(tmp_path / "cache")},
                          preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (address_space,) * 2))


def _line(r: subprocess.CompletedProcess) -> str:
    assert r.returncode == 2 and "Traceback" not in r.stderr, (r.returncode, r.stderr[-3000:])
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr[-3000:]
    return lines[0]


# ---------------------------------------------------------------- the bound, as a function


def _mix(*entries) -> tuple[MixEntry, ...]:
    return tuple(MixEntry(f"d{i}", "train", kind, value) for i, (kind, value) in enumerate(entries))


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.integers(1, 10**6), min_size=1, max_size=4), data=st.data(), epochs=st.integers(1, 1024),
       available=st.integers(0, 10**12))
def test_a_plan_is_refused_exactly_when_its_planned_samples_do_not_fit(sizes, data, epochs, available):
    kinds = st.tuples(st.sampled_from(["repeat", "weight"]), st.floats(0.01, 1e6))
    mix = _mix(*data.draw(st.lists(kinds, min_size=len(sizes), max_size=len(sizes))))
    plan = PlanSettings(mixture=mix, epochs=epochs)
    planned = float(mixture.epoch_sizes(np.array(sizes), mix, None).sum()) * epochs
    fits = planned <= available // PLANNED_SAMPLE_BYTES
    try:
        check_fits(np.array(sizes), plan, available)
    except SettingsError as exc:
        assert not fits and f"at most {available // PLANNED_SAMPLE_BYTES:,} fit" in str(exc)
    else:
        assert fits
    # the counts a plan is made of are what was measured
    counts = mixture.epoch_counts(np.array(sizes), mix, None)
    assert np.abs(counts - mixture.epoch_sizes(np.array(sizes), mix, None)).max() <= 1


@pytest.mark.parametrize(("plan", "sizes", "says"), [
    (PlanSettings(mixture=_mix(("repeat", 1e9), ("repeat", 1.0))), None,
     "dataset 'd0' repeat 1e+09 makes at least 1,000,000,001 planned samples (1,000,000,001 an epoch x 1 epoch), "
     "about 93.1 GiB to plan; this process can use 1.0 GiB (free memory, container limit, `ulimit -v`): at most "
     "10,737,418 fit; lower its repeat (--mix d0=Nx)"),
    (PlanSettings(mixture=_mix(("weight", 1.0), ("weight", 2.0)), samples_per_epoch=10**12), None,
     "--samples-per-epoch 1,000,000,000,000 makes at least 1,000,000,000,000 planned samples"),
    (PlanSettings(mixture=_mix(("repeat", 100.0)), epochs=1000), np.array([1000]),
     "--epochs 1000 makes 100,000,000 planned samples (100,000 an epoch x 1000 epochs), about 9.3 GiB to plan"),
    (PlanSettings(), np.array([20_000_000]), "the data's 20,000,000 samples an epoch makes 20,000,000 planned "
                                            "samples"),
])
def test_the_refusal_names_the_setting_that_asks_for_the_samples(plan, sizes, says):
    with pytest.raises(SettingsError) as caught:
        check_fits(sizes, plan, GIB)
    assert says in str(caught.value)


def test_a_repeat_or_weight_beyond_two_to_the_40_is_refused_whatever_the_memory():
    for value in (2.0**40 + 1, 1e300, float("inf"), float("nan")):
        with pytest.raises(SettingsError, match=r"must be a positive number of at most 1,099,511,627,776"):
            MixEntry("chat", "train", "repeat", value)
    check_fits(None, PlanSettings(mixture=_mix(("repeat", 2.0**40))), None)  # the ceiling itself is counted exactly


# ---------------------------------------------------------------- as a new user meets it


@pytest.mark.slow
@pytest.mark.parametrize(("args", "says"), [
    (["--mix", "a=1e9x"], "error: dataset 'a' repeat 1e+09 makes at least 1,000,000,001 planned samples"),
    (["--mix", "a=1,b=2", "--samples-per-epoch", "1000000000000"],
     "error: --samples-per-epoch 1,000,000,000,000 makes at least 1,000,000,000,000 planned samples"),
    (["--mix", "a=1e300x"], "error: dataset 'a': repeat must be a positive number of at most 1,099,511,627,776 "
                            "(2**40), got 1e+300"),
])
def test_a_count_typo_is_refused_before_any_work(tmp_path, args, says):
    """`--mix chat=1e9x` and `samples_per_epoch = 1e12` were materialized until the OOM killer came (24 GB); 1e300x
    was an OverflowError traceback. Nothing is scanned: no cache entry is made."""
    a, b = _pc(tmp_path / "a.jsonl", 200), _pc(tmp_path / "b.jsonl", 200)
    line = _line(_plancc(["compile", a, b, "-o", tmp_path / "plan", "--tokenizer", "builtin", "-q", *args], tmp_path))
    assert line.startswith(says), line
    assert not (tmp_path / "plan").exists() and not (tmp_path / "cache" / "scans").exists()


@pytest.mark.slow
def test_a_repeat_too_large_for_the_data_is_refused_once_the_data_is_counted(tmp_path):
    """1e5 x 200 samples: 20 million planned samples do not fit in 3 GB of address space (it ran out of memory in
    the packer after 18 s)."""
    a, b = _pc(tmp_path / "a.jsonl", 200), _pc(tmp_path / "b.jsonl", 200)
    line = _line(_plancc(["compile", a, b, "-o", tmp_path / "plan", "--tokenizer", "builtin", "-q", "--mix",
                          "a=1e5x"], tmp_path))
    assert line.startswith("error: dataset 'a' repeat 100000 makes 20,000,200 planned samples (20,000,200 an epoch "
                           "x 1 epoch), about 1.9 GiB to plan; this process can use "), line
    assert line.endswith(" fit; lower its repeat (--mix a=Nx)"), line


def test_more_tokenizer_processes_than_cpus_are_lowered_to_the_cpus(tmp_path):
    """The plan is the same for any process count: more than the CPUs is a warning and the CPUs' count, never a
    refusal of a config written on a larger machine (nor 1,024 processes that take this one down)."""
    most = max(2, usable_cpus())
    res = CliRunner().invoke(app, ["compile", str(_pc(tmp_path / "a.jsonl", 20)), "-o", str(tmp_path / "plan"),
                                   "--tokenizer", "builtin", "-q", "--num-proc", str(most + 1),
                                   "--cache-dir", str(tmp_path / "cache")])
    assert res.exit_code == 0, res.output
    assert (f"--num-proc {most + 1}: this process may run on {usable_cpus()} CPUs, and tokenizer processes beyond "
            f"them only cost memory (each loads the tokenizer); using {most}") in res.output, res.output
    assert (tmp_path / "plan" / "plan.parquet").is_file()

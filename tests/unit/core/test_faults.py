"""The tests' crash points: one environment variable and one syntax (`plancc.core.faults`), read in one place."""

from __future__ import annotations

import ast
import os
import signal
import subprocess
import sys

import pytest

from plancc.core import faults
from tests.support import REPO

ROOT = REPO


@pytest.mark.parametrize(("spec", "want"), [
    ("written", ("written", "kill", {})),
    ("written:stop", ("written", "stop", {})),
    ("parts_written@parts=3", ("parts_written", "kill", {"parts": "3"})),
    ("tensors_temp:term@step=3,rank=1", ("tensors_temp", "term", {"step": "3", "rank": "1"})),
])
def test_the_one_syntax(spec, want):
    assert faults.parse(spec) == want


def _run(spec: str | None, call: str) -> int:
    env = {k: v for k, v in os.environ.items() if k != faults.FAULT_ENV} | ({faults.FAULT_ENV: spec} if spec else {})
    code = f"from plancc.core.faults import fault; {call}"
    return subprocess.run([sys.executable, "-c", code], env={**env, "PYTHONPATH": str(ROOT)}, timeout=60).returncode


def test_a_point_fires_only_when_named_with_its_conditions():
    assert _run("tensors_written@step=4,rank=1", "fault('tensors_written', step=4, rank=1)") == -signal.SIGKILL
    assert _run("tensors_written:term@step=4", "fault('tensors_written', step=4, rank=0)") == -signal.SIGTERM
    assert _run("tensors_written@step=4,rank=1", "fault('tensors_written', step=4, rank=0)") == 0
    assert _run("tensors_written", "fault('rank_saved', step=4, rank=1)") == 0
    assert _run(None, "fault('written')") == 0


def test_no_other_module_reads_a_fault_variable():
    """Every crash point goes through `faults.fault`: no module names a `PLANCC_*FAULT` variable of its own."""
    found = []
    for path in sorted((ROOT / "plancc").rglob("*.py")):
        if path.name == "faults.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and "FAULT" in node.value and \
                    node.value.startswith("PLANCC_"):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert found == []

"""`-o` never touches a foreign folder, and replacing a plan never loses it (SPEC 1, 9; `plancc.atomic`).

The crash tests run real `python -m plancc compile` processes that SIGKILL, SIGINT or SIGTERM themselves at each
named step of the write/replace sequence (`PLANCC_FAULT`), then check with `plancc validate` that the path holds
the complete old or the complete new plan, and that nothing is left beside it after that next command.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from plancc import atomic, store
from plancc.cli import app
from tests.plan_helpers import write_samples_file

runner = CliRunner()
ROOT = Path(__file__).parent.parent
TOKENIZED = '{"input_ids": [5, 6, 7, 8], "labels": [-100, 6, 7, 8]}\n' * 4  # a source that needs no tokenizer
FLAGS = ["--sequence-len", "256", "--micro-batch-size", "2", "--world-size", "2", "--grad-accum", "2", "-q"]


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    return write_samples_file(tmp_path_factory.mktemp("src"), 5, 120, 200)


def _compile(source: Path, out: Path, *extra: str):
    return runner.invoke(app, ["compile", str(source), "-o", str(out), *FLAGS, *extra])


def _tree(path: Path) -> dict[str, str]:
    """Every entry under `path` (itself included) with a hash of its bytes: what 'untouched' means."""
    out = {}
    for p in sorted([path, *path.rglob("*")]):
        key = str(p.relative_to(path.parent))
        out[key] = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
    return out


def _plan_fp(plan: Path) -> dict[str, str]:
    return json.loads((plan / store.MANIFEST_FILE).read_text())["fingerprints"]["plan"]


# ---------------------------------------------------------------- foreign folders


def _foreign(tmp_path: Path, case: str) -> tuple[Path, Path]:
    """(the -o argument, the folder that must stay byte-identical) for the three reported cases."""
    if case == "notes":
        d = tmp_path / "mydir"
        d.mkdir()
        (d / "notes.txt").write_text("my notes\n")
        return d, d
    if case == "cwd":
        d = tmp_path / "work"
        (d / "data").mkdir(parents=True)
        (d / "data" / "train.jsonl").write_text('{"text": "hello"}\n')
        (d / "README.md").write_text("# mine\n")
        return Path("."), d
    d = tmp_path / "proj"
    (d / "src" / "deep").mkdir(parents=True)
    (d / "src" / "deep" / "train.py").write_text("print('train')\n")
    return d, d


@pytest.mark.parametrize("command", ["compile", "scan"])
@pytest.mark.parametrize("case", ["notes", "cwd", "proj"])
@pytest.mark.parametrize("overwrite", [False, True])
def test_a_foreign_folder_is_never_touched(tmp_path, monkeypatch, source, case, command, overwrite):
    out, folder = _foreign(tmp_path, case)
    monkeypatch.chdir(folder if case == "cwd" else tmp_path)
    text = tmp_path / "tokens.jsonl"
    text.write_text(TOKENIZED)
    before, around = _tree(folder), sorted(os.listdir(folder.parent))
    if command == "compile":
        res = _compile(source, out, *(["--overwrite"] if overwrite else []))
    else:
        res = runner.invoke(app, ["scan", str(text), "-o", str(out), "-q", *(["--overwrite"] if overwrite else [])])
    assert res.exit_code == 2, res.output
    assert "not a plancc plan or scan directory" in res.output and "Traceback" not in res.output
    assert _tree(folder) == before  # nothing deleted, nothing changed, nothing added inside
    assert sorted(os.listdir(folder.parent)) == around  # and no lock or temporary beside it


def test_a_file_at_the_output_path_is_refused(tmp_path, source):
    (tmp_path / "plan").write_text("a file")
    res = _compile(source, tmp_path / "plan", "--overwrite")
    assert res.exit_code == 2 and "not a directory" in res.output
    assert (tmp_path / "plan").read_text() == "a file"


def test_an_existing_plan_is_replaced_only_with_overwrite(tmp_path, source):
    plan = tmp_path / "plan"
    assert _compile(source, plan, "--seed", "1").exit_code == 0
    old = _plan_fp(plan)
    res = _compile(source, plan, "--seed", "2")
    assert res.exit_code == 2 and "--overwrite" in res.output
    assert _plan_fp(plan) == old
    assert _compile(source, plan, "--seed", "2", "--overwrite").exit_code == 0
    assert _plan_fp(plan) != old
    assert sorted(os.listdir(tmp_path)) == ["plan"]  # no .plan.lock, no temporaries


def test_an_empty_folder_is_written_and_a_scan_is_replaced_only_with_overwrite(tmp_path):
    text = tmp_path / "tokens.jsonl"
    text.write_text(TOKENIZED)
    (tmp_path / "scan").mkdir()
    args = ["scan", str(text), "-o", str(tmp_path / "scan"), "-q"]
    assert runner.invoke(app, args).exit_code == 0
    assert store.output_kind(tmp_path / "scan") == "scan"
    res = runner.invoke(app, args)
    assert res.exit_code == 2 and "--overwrite" in res.output
    assert runner.invoke(app, [*args, "--overwrite"]).exit_code == 0
    assert sorted(os.listdir(tmp_path)) == ["scan", "tokens.jsonl"]


def test_the_scan_cache_keeps_working_without_litter(tmp_path):
    text = tmp_path / "tokens.jsonl"
    text.write_text(TOKENIZED)
    cache = tmp_path / "cache"
    for out in ("a", "b"):
        res = runner.invoke(app, ["scan", str(text), "-o", str(tmp_path / out), "-q", "--json", "--cache-dir",
                                  str(cache)])
        assert res.exit_code == 0, res.output
    entries = os.listdir(cache / "scans")
    assert len(entries) == 1 and not entries[0].startswith(".")  # one entry, reused; no lock, no temporary


# ---------------------------------------------------------------- locks


def _hold_lock(parent: Path, name: str) -> subprocess.Popen:
    code = ("import sys, time; from pathlib import Path; from plancc import atomic\n"
            f"with atomic._lock(Path({str(parent)!r}), {name!r}) as held:\n"
            "    print(held, flush=True); time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    assert proc.stdout.readline().strip() == "True"
    return proc


def test_a_live_writer_refuses_a_second_and_a_killed_one_blocks_nothing(tmp_path, source):
    holder = _hold_lock(tmp_path, "plan")
    try:
        res = _compile(source, tmp_path / "plan")
        assert res.exit_code == 2 and f"another plancc process (pid {holder.pid})" in res.output
        assert not (tmp_path / "plan").exists()
    finally:
        holder.kill()
        holder.wait()
    assert (tmp_path / ".plan.lock").exists()  # the killed holder could not clean up ...
    assert _compile(source, tmp_path / "plan").exit_code == 0  # ... and blocks nothing
    assert sorted(os.listdir(tmp_path)) == ["plan"]


def test_a_stale_lock_file_of_a_dead_pid_is_recovered(tmp_path, source):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (tmp_path / ".plan.lock").write_text(f"plancc pid {dead.pid}\n")
    assert _compile(source, tmp_path / "plan").exit_code == 0
    assert sorted(os.listdir(tmp_path)) == ["plan"]


def test_leftovers_of_dead_writers_of_other_names_are_reclaimed_but_a_live_writers_are_not(tmp_path, source):
    (tmp_path / ".other.plancc-tmp-99999-abc123").mkdir()
    (tmp_path / ".other.plancc-tmp-99999-abc123" / "plan.parquet").write_bytes(b"half")
    (tmp_path / ".busy.plancc-tmp-99998-def456").mkdir()
    holder = _hold_lock(tmp_path, "busy")
    try:
        assert _compile(source, tmp_path / "plan").exit_code == 0
        assert sorted(os.listdir(tmp_path)) == [".busy.lock", ".busy.plancc-tmp-99998-def456", "plan"]
    finally:
        holder.kill()
        holder.wait()


# ---------------------------------------------------------------- crashes and interrupts at each step


SIGNALS = {"kill": -signal.SIGKILL, "int": 128 + signal.SIGINT, "term": 128 + signal.SIGTERM}
# (replace mode, fault point, signal) -> which plan is at the path afterwards
CASES = [
    *[("exchange", p, how, "old") for p in ("written", "synced") for how in ("kill", "int")],
    *[("exchange", p, how, "new") for p in ("swapped", "cleanup") for how in ("kill", "int")],
    ("exchange", "swapped", "term", "new"),
    ("rename", "moved_old", "kill", "old"),  # no plan at the path until the next command rolls back
    ("rename", "moved_old", "int", "new"),  # the interrupt is held back until the swap is complete
    *[("rename", p, how, "new") for p in ("swapped", "cleanup") for how in ("kill", "int")],
]


@pytest.fixture(scope="module")
def old_plan(tmp_path_factory, source) -> Path:
    plan = tmp_path_factory.mktemp("old") / "plan"
    assert _compile(source, plan, "--seed", "1").exit_code == 0
    return plan


def _faulty_compile(source: Path, out: Path, fault: str, mode: str, *extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PLANCC_FAULT": fault, "PLANCC_REPLACE": mode, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "plancc", "compile", str(source), "-o", str(out), *FLAGS, *extra],
                          env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(("mode", "point", "how", "expect"), CASES)
def test_a_crash_or_interrupt_at_each_step_leaves_the_old_or_the_new_plan(tmp_path, source, old_plan, mode, point,
                                                                         how, expect):
    import shutil

    plan = tmp_path / "plan"
    shutil.copytree(old_plan, plan)
    old = _plan_fp(plan)
    proc = _faulty_compile(source, plan, f"{point}:{how}", mode, "--seed", "2", "--overwrite")
    assert proc.returncode == SIGNALS[how], proc.stderr
    if how != "kill":  # the message says truthfully what is on disk
        said = "the new plan is in place" if expect == "new" else "the old plan is unchanged"
        assert said in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    res = runner.invoke(app, ["validate", str(plan)])  # the next command: recovers, then validates
    assert res.exit_code == 0, res.output
    assert (_plan_fp(plan) == old) == (expect == "old")
    assert sorted(os.listdir(tmp_path)) == ["plan"]  # nothing left behind


@pytest.mark.parametrize("point", ["written", "swapped"])
def test_a_crash_of_a_first_write_leaves_nothing_or_the_new_plan(tmp_path, source, point):
    plan = tmp_path / "plan"
    proc = _faulty_compile(source, plan, f"{point}:kill", "exchange")
    assert proc.returncode == -signal.SIGKILL
    res = _compile(source, plan, "--overwrite")  # the next command
    assert res.exit_code == 0, res.output
    assert sorted(os.listdir(tmp_path)) == ["plan"]


def test_exchange_swaps_two_directories_atomically(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x").write_text("a")
    (tmp_path / "b").mkdir()
    if not atomic.exchange(tmp_path / "a", tmp_path / "b"):
        pytest.skip("this filesystem has no RENAME_EXCHANGE (the two-rename fallback is tested above)")
    assert os.listdir(tmp_path / "b") == ["x"] and os.listdir(tmp_path / "a") == []


def test_two_concurrent_compiles_into_one_folder_leave_one_whole_plan(tmp_path, source):
    plan = tmp_path / "plan"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [subprocess.Popen([sys.executable, "-m", "plancc", "compile", str(source), "-o", str(plan), *FLAGS,
                               "--seed", str(seed), "--overwrite"], env=env, stderr=subprocess.PIPE, text=True)
             for seed in (1, 2)]
    outcomes = [(p.wait(timeout=120), p.stderr.read()) for p in procs]
    assert all(rc == 0 or (rc == 2 and "another plancc process" in err) for rc, err in outcomes), outcomes
    assert runner.invoke(app, ["validate", str(plan)]).exit_code == 0
    assert sorted(os.listdir(tmp_path)) == ["plan"]

"""`-o` never touches a foreign folder, and replacing a plan never loses it (docs/spec.md §1, 9; `plancc.store.atomic`).

The crash tests run real `python -m plancc compile` processes that SIGKILL, SIGINT or SIGTERM themselves at each
named step of the write/replace sequence (`PLANCC_FAULT`), then check with `plancc validate` that the path holds
the complete old or the complete new plan, and that nothing is left beside it after that next command.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

import plancc
from plancc import api
from plancc.cli import app
from plancc.store import atomic, outputs, schemas
from tests.support import REPO
from tests.support.plans import write_samples_file

pytestmark = pytest.mark.slow  # crashes and interrupts the CLI in subprocesses

runner = CliRunner()
ROOT = REPO
TOKENIZED = '{"input_ids": [5, 6, 7, 8], "labels": [-100, 6, 7, 8]}\n' * 4  # a source that needs no tokenizer
FLAGS = ["--sequence-len", "256", "--micro-batch-size", "2", "--world-size", "2", "--grad-accum", "2", "-q"]


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    return write_samples_file(tmp_path_factory.mktemp("src"), 5, 120, 200)


def _compile(source: Path, out: Path, *extra: str):
    return runner.invoke(app, ["compile", str(source), "-o", str(out), *FLAGS, *extra])


def _tree(path: Path) -> dict[str, str]:
    """Every entry under `path` (itself included) with a hash of its bytes: what 'untouched' means (a FIFO is
    named, not read: that would block)."""
    out = {}
    for p in sorted([path, *path.rglob("*")]):
        key = str(p.relative_to(path.parent))
        out[key] = "fifo" if p.is_fifo() else hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
    return out


def _plan_fp(plan: Path) -> dict[str, str]:
    return json.loads((plan / schemas.MANIFEST_FILE).read_text())["fingerprints"]["plan"]


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
    assert outputs.output_kind(tmp_path / "scan") == "scan"
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
    code = ("import sys, time; from pathlib import Path; from plancc.store import atomic\n"
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


# ---------------------------------------------------------------- --overwrite replaces only what plancc wrote


EXTRAS = {"train.jsonl": TOKENIZED, "NOTES.md": "# mine\n", "ckpt/step-10/model.bin": "weights",
          "eval/results.json": "{}\n"}


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> dict[str, Path]:
    """A tokenized source, and a plan and a scan of it, to copy and add to."""
    d = tmp_path_factory.mktemp("made")
    out = {"text": d / "tokens.jsonl", "compile": d / "plan", "scan": d / "scan"}
    out["text"].write_text(TOKENIZED)
    for command in ("compile", "scan"):
        res = runner.invoke(app, [command, str(out["text"]), "-o", str(out[command]), "-q"])
        assert res.exit_code == 0, res.output
    return out


def _overwrite(interface: str, command: str, source: Path, out: Path) -> tuple[int, str]:
    """(exit code, message) of `plancc COMMAND SOURCE -o OUT --overwrite`, or of the API call doing the same."""
    if interface == "cli":
        res = runner.invoke(app, [command, str(source), "-o", str(out), "-q", "--overwrite"])
        return res.exit_code, res.output
    try:
        (plancc.compile if command == "compile" else api.scan)(str(source), out, overwrite=True)
    except outputs.OutputError as exc:
        return 2, str(exc)
    return 0, ""


@pytest.mark.parametrize("interface", ["cli", "api"])
@pytest.mark.parametrize("command", ["compile", "scan"])
@pytest.mark.parametrize("case", ["extras", "source inside"])
def test_overwrite_refuses_a_plan_or_scan_holding_what_plancc_did_not_write(tmp_path, made, interface, command,
                                                                              case):
    proj = tmp_path / "proj"
    shutil.copytree(made[command], proj)
    for name, text in EXTRAS.items():
        (proj / name).parent.mkdir(parents=True, exist_ok=True)
        (proj / name).write_text(text)
    source = proj / "train.jsonl" if case == "source inside" else made["text"]
    before, around = _tree(proj), sorted(os.listdir(tmp_path))
    code, said = _overwrite(interface, command, source, proj)
    assert code == 2, said
    assert "did not write: NOTES.md, ckpt/, eval/, train.jsonl;" in said and "Traceback" not in said
    assert _tree(proj) == before  # the user's files, and the old plan or scan, byte for byte
    assert sorted(os.listdir(tmp_path)) == around


def test_a_refusal_names_ten_paths_and_counts_the_rest(tmp_path, made):
    proj = tmp_path / "proj"
    shutil.copytree(made["compile"], proj)
    for k in range(13):
        (proj / f"note-{k:02d}.txt").write_text("x")
    (proj / schemas.TOKENS_DIR / "mine.txt").write_text("x")  # inside the token store too
    res = runner.invoke(app, ["compile", str(made["text"]), "-o", str(proj), "-q", "--overwrite"])
    assert res.exit_code == 2
    assert "note-00.txt, note-01.txt," in res.output and "note-09.txt and 4 more;" in res.output
    assert "note-10.txt" not in res.output


def test_a_scan_with_a_multi_part_token_store_is_still_replaced(tmp_path, made):
    parts = [tmp_path / f"part-{k}" for k in range(2)]
    for k, part in enumerate(parts):
        api.scan(str(made["text"]), part, shard=(k, 2))
    api.merge(parts, tmp_path / "scan")
    assert (tmp_path / "scan" / schemas.TOKENS_DIR / "part-00001").is_dir()
    api.merge(parts, tmp_path / "scan", overwrite=True)  # only what plancc wrote: replaced
    assert outputs.output_kind(tmp_path / "scan") == "scan"


def _python_plancc(*args: str, env: dict[str, str] | None = None, timeout: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "plancc", *args], env={**os.environ, "PYTHONPATH": str(ROOT),
                                                                        **(env or {})},
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize(("where", "said"), [
    ("plan/plan.parquet", "did not write: plan.parquet (FIFO);"),
    ("plan/tokens/tokens.json", "did not write: tokens/tokens.json (FIFO);"),
    ("plan/manifest.json", "is not a plancc plan or scan directory"),  # read, it would block: not read
    (".plan.lock", "is not a plancc lock file"),
    (".other.lock", None),  # another name's: left alone, not read
])
def test_a_fifo_where_plancc_writes_is_refused_by_type_and_never_read(tmp_path, made, where, said):
    plan = tmp_path / "plan"
    shutil.copytree(made["compile"], plan)
    (tmp_path / where).unlink(missing_ok=True)
    os.mkfifo(tmp_path / where)
    before = _tree(plan) if said else None
    proc = _python_plancc("compile", str(made["text"]), "-o", str(plan), "-q", "--overwrite", timeout=60)
    if said is None:
        assert proc.returncode == 0, proc.stderr
        assert sorted(os.listdir(tmp_path)) == [".other.lock", "plan"]
        return
    assert proc.returncode == 2 and said in proc.stderr, proc.stderr
    if where.startswith("plan/"):
        assert _tree(plan) == before


def test_a_dead_writers_temporary_of_a_name_with_a_newline_is_reclaimed(tmp_path, source):
    plan = tmp_path / "pl\nan"
    assert _faulty_compile(source, plan, "written:kill", "exchange").returncode == -signal.SIGKILL
    assert any(".plancc-tmp-" in e for e in os.listdir(tmp_path))
    assert _compile(source, plan).exit_code == 0  # the next command reclaims it
    assert os.listdir(tmp_path) == ["pl\nan"]


def test_a_full_disk_names_the_output_not_the_scan_cache(tmp_path):
    """The plan goes to a 512 KiB tmpfs (in a private mount namespace), the scan cache to the disk: the tokens are
    copied across and the copy runs out of space."""
    if shutil.which("unshare") is None:
        pytest.skip("no unshare(1)")
    text = tmp_path / "big.jsonl"
    row = json.dumps({"input_ids": list(range(5, 205)), "labels": list(range(5, 205))})
    text.write_text((row + "\n") * 2000)  # 400k tokens: 1.6 MB of input_ids alone
    small, cache = tmp_path / "small", tmp_path / "cache"
    small.mkdir()
    plan = os.path.realpath(small) + "/plan"
    script = (f"mount -t tmpfs -o size=512k tmpfs {shlex.quote(str(small))} || exit 99; "
              f"{shlex.quote(sys.executable)} -m plancc compile {shlex.quote(str(text))} -o {shlex.quote(plan)} -q "
              f"--sequence-len 256 --cache-dir {shlex.quote(str(cache))}; echo rc=$?; ls -A {shlex.quote(str(small))}")
    proc = subprocess.run(["unshare", "-rm", "sh", "-c", script], env={**os.environ, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=300)
    if proc.returncode == 99 or "rc=" not in proc.stdout:
        pytest.skip(f"cannot mount a small filesystem in a user namespace here: {proc.stderr.strip()}")
    assert proc.stdout.split() == ["rc=2"], proc.stdout  # refused, and nothing left on the small filesystem
    assert f"cannot write the plan at {plan}: No space left on device; nothing was written at {plan}" in proc.stderr
    assert str(cache) not in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize(("how", "old"), [("int", True), ("term", False)])
def test_an_interrupt_before_the_write_says_what_is_at_the_output(tmp_path, source, old_plan, how, old):
    plan = tmp_path / "plan"
    if old:
        shutil.copytree(old_plan, plan)
    before = _tree(plan) if old else None
    proc = _faulty_compile(source, plan, f"prepared:{how}", "exchange", "--seed", "2", "--overwrite")
    assert proc.returncode == SIGNALS[how], proc.stderr
    target = os.path.realpath(plan)
    said = f"the old plan is unchanged at {target}" if old else f"nothing was written at {target}"
    assert said in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert (_tree(plan) == before) if old else not plan.exists()
    assert sorted(os.listdir(tmp_path)) == (["plan"] if old else [])


@pytest.mark.parametrize("how", ["int", "term"])
def test_an_interrupt_during_start_up_says_nothing_was_written(tmp_path, source, how):
    proc = _faulty_compile(source, tmp_path / "plan", f"startup:{how}", "exchange")
    assert proc.returncode == SIGNALS[how]
    assert proc.stderr == "interrupted while plancc was starting: nothing was written\n"
    assert os.listdir(tmp_path) == []


def test_a_file_added_to_the_old_plan_during_the_write_is_not_lost(tmp_path, source, old_plan):
    plan = tmp_path / "plan"
    shutil.copytree(old_plan, plan)
    old = _plan_fp(plan)
    env = {**os.environ, "PLANCC_FAULT": "written:stop", "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "plancc", "compile", str(source), "-o", str(plan), *FLAGS,
                             "--seed", "2", "--overwrite"], env=env, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "T":
            assert time.monotonic() < deadline and proc.poll() is None, "compile never stopped after writing"
            time.sleep(0.05)
        (plan / "NOTES.md").write_text("written while plancc wrote\n")
    finally:
        proc.send_signal(signal.SIGCONT)  # nothing when it already ended
    assert proc.wait(timeout=120) == 2
    assert "did not write: NOTES.md;" in proc.stderr.read()
    assert (plan / "NOTES.md").exists() and _plan_fp(plan) == old
    assert sorted(os.listdir(tmp_path)) == ["plan"]


def test_cold_and_warm_scan_caches_give_byte_identical_plans(tmp_path, made):
    """A cold scan's duration stays out of the plan: two cold caches and a warm one, one plan file."""
    for k, cache in enumerate(["a", "b", "b"]):
        res = runner.invoke(app, ["compile", str(made["text"]), "-o", str(tmp_path / f"plan{k}"), "-q",
                                  "--cache-dir", str(tmp_path / cache)])
        assert res.exit_code == 0, res.output
    plans = [(tmp_path / f"plan{k}" / schemas.PLAN_FILE).read_bytes() for k in range(3)]
    assert plans[0] == plans[1] == plans[2]
    assert "seconds" not in json.loads((tmp_path / "plan0" / schemas.MANIFEST_FILE).read_text())["scan"]


def test_an_interrupt_message_says_what_is_at_the_output_before_and_after_this_process_replaced_it(tmp_path):
    """What `fail_on_errors` says for an interrupt outside the replace (the work before it, the summary after)."""
    target = Path(os.path.realpath(tmp_path)) / "out"
    assert atomic.interrupted_message(target, "plan") == ("interrupted before the plan was written: nothing was "
                                                          f"written at {target}")
    with atomic.replace_directory(target, what="plan") as tmp:
        (tmp / "x").write_text("new")
    assert atomic.interrupted_message(target, "plan") == ("interrupted after the new plan was written: the new plan is "
                                                          f"in place at {target}")
    (target.parent / "old").mkdir()
    (target.parent / "old" / "scan.json").write_text("{}")
    assert atomic.interrupted_message(target.parent / "old", "scan") == (
        f"interrupted before the scan was written: the old scan is unchanged at {target.parent / 'old'}")

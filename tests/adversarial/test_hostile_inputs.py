"""Hostile input: deep JSON, broken tokenizer files,
absurd settings, alias bombs, exhausted descriptors or memory, unreadable directories. Each is one `error:` line
naming the file, row, column or setting, exit 2, never a traceback, a crash or a hang. The cases that crashed the
interpreter (or need resource limits) run in a child process, so a regression fails the test, not the session."""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.support import REPO
from tests.support.sources import DEEPSEEK_JSON

pytestmark = pytest.mark.slow  # runs the CLI in a subprocess per hostile input

ROOT = REPO


def plancc(args: list, tmp_path: Path, *, limits: dict[int, int] | None = None, timeout: int = 300
           ) -> subprocess.CompletedProcess:
    """`python -m plancc ARGS` in a child process, under `limits` (resource.RLIMIT_* -> soft and hard limit)."""

    def limit() -> None:
        for what, value in (limits or {}).items():
            resource.setrlimit(what, (value, value))

    return subprocess.run([sys.executable, "-m", "plancc", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, preexec_fn=limit,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "PLANCC_CACHE": str(tmp_path / "cache")})


def one_line(r: subprocess.CompletedProcess) -> str:
    """The single `error:` line of a command that must fail with exit 2."""
    assert r.returncode == 2 and "Traceback" not in r.stderr, (r.returncode, r.stderr[-3000:])
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr[-3000:]
    return lines[0]


def compile_args(source: Path, tmp_path: Path, *extra) -> list:
    return ["compile", source, "-o", tmp_path / "plan", "--tokenizer", "builtin", "-q", *extra]


# ---------------------------------------------------------------- deep JSON


def _nested(depth: int, kind: str) -> str:
    return "[" * depth + "]" * depth if kind == "list" else '{"a":' * depth + "1" + "}" * depth


@pytest.mark.parametrize(("depth", "kind", "column"), [(100_000, "list", "x"), (100_000, "object", "text"),
                                                       (1_000, "list", "text"), (101, "object", "x")])
def test_deeply_nested_json_lines_are_refused_naming_the_line(tmp_path, depth, kind, column):
    """100,000 levels in a column no format reads crashed Arrow's reader (exit 139); 1,000 in the text column
    overflowed Python's recursion while printing the error."""
    source = tmp_path / "deep.jsonl"
    source.write_text('{"text": "a [[[ \\" {{{"}\n\n' + f'{{"text": "b", "{column}": {_nested(depth, kind)}}}\n')
    line = one_line(plancc(compile_args(source, tmp_path), tmp_path))
    assert line.startswith(f"error: {source} row 1 (line 3) column ") and "JSON nested deeper than 100 levels" in line
    assert not (tmp_path / "plan").exists()


def test_a_deeply_nested_json_array_file_is_refused(tmp_path):
    source = tmp_path / "deep.json"
    source.write_text('[{"text": "a"},\n {"text": "b", "x": ' + _nested(5_000, "list") + "}]")
    line = one_line(plancc(compile_args(source, tmp_path), tmp_path))
    assert line.startswith(f"error: {source} line 2 column ") and "nested deeper than 100 levels" in line, line


def test_nesting_inside_strings_and_at_the_bound_is_read(tmp_path):
    """Brackets inside strings (escaped quotes too) are text; 100 levels is allowed."""
    source = tmp_path / "ok.jsonl"
    rows = [{"text": "[" * 500 + '\\"{' * 300, "x": json.loads(_nested(99, "list"))} for _ in range(3)]
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))
    r = plancc(compile_args(source, tmp_path), tmp_path)
    assert r.returncode == 0, r.stderr


# ---------------------------------------------------------------- tokenizer directories


@pytest.fixture
def chat_source(tmp_path) -> Path:
    source = tmp_path / "chat.jsonl"
    source.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"},
                                               {"role": "assistant", "content": "hello"}]}) + "\n")
    return source


def _tokenizer_dir(tmp_path: Path) -> Path:
    from plancc.scan.sources.tokenizer import _builtin

    d = tmp_path / "tok"
    d.mkdir()
    _builtin().save(str(d / "tokenizer.json"))
    return d


@pytest.mark.parametrize("config", [b"[]", b'"eos"', b"3"])
def test_a_tokenizer_config_that_is_not_an_object_is_one_line(tmp_path, chat_source, config):
    d = _tokenizer_dir(tmp_path)
    (d / "tokenizer_config.json").write_bytes(config)
    r = plancc(["compile", chat_source, "-o", tmp_path / "plan", "--tokenizer", d, "-q"], tmp_path)
    line = one_line(r)
    assert line.startswith(f"error: --tokenizer {d}: {d / 'tokenizer_config.json'} holds a JSON "), line
    assert "expected an object of settings" in line


def test_a_chat_template_file_that_is_not_utf8_is_one_line(tmp_path, chat_source):
    d = _tokenizer_dir(tmp_path)
    (d / "tokenizer_config.json").write_text("{}")
    (d / "chat_template.jinja").write_bytes(b"{{ 'a' }}\xff\xfe")
    line = one_line(plancc(["compile", chat_source, "-o", tmp_path / "plan", "--tokenizer", d, "-q"], tmp_path))
    assert line == f"error: {d / 'chat_template.jinja'}: not valid UTF-8 (byte 0xff at offset 9); save the chat " \
                   "template as UTF-8", line


# ---------------------------------------------------------------- absurd settings


@pytest.mark.parametrize(("text", "says"), [
    ("sequence_len = 99999999999999999999",
     "sequence_len must be an integer in [1, 16,777,216], got 99,999,999,999,999,999,999"),
    ("world_size = 9999999999999999999", "world_size must be an integer in [1, 1,048,576], got 9,999,999,999,999,999,999"),
    ("grad_accum = 1048577", "grad_accum must be an integer in [1, 1,048,576], got 1,048,577"),
    ("epochs = 100000", "epochs must be an integer in [1, 1,024], got 100,000"),
    ("micro_batch_size = 65537", "micro_batch_size must be an integer in [1, 65,536], got 65,537"),
    ("num_proc = 100000", "num_proc must be an integer in [1, 1,024], got 100,000"),
    ("sequence_len = 16777216\nmicro_batch_size = 1000",
     "--micro-batch-size x --sequence-len must be at most 2,147,483,647 tokens, got 1000 x 16777216"),
])
def test_an_absurd_integer_setting_names_it_and_its_range(tmp_path, chat_source, text, says):
    config = tmp_path / "c.toml"
    config.write_text(text + "\n")
    line = one_line(plancc(compile_args(chat_source, tmp_path, "--chat-template", "chatml", "--config", config),
                           tmp_path))
    assert line.startswith("error: ") and says in line, line
    assert not (tmp_path / "plan").exists()


_BOMB = "a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
    f"{c}: &{c} [{', '.join([f'*{p}'] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi", strict=True))


@pytest.mark.parametrize(("name", "text", "says"), [
    ("bomb.yaml", _BOMB, ": its YAML aliases expand to more than 100,000 values (an alias bomb?); write the values out"),
    ("loop.yaml", "seed: 1\nlist: &a [1, *a]\n", "line 2 column 7: a YAML alias refers to a value that holds it"),
    ("broken.yaml", "seed: [1, 2\nepochs: 3\n", "line 2 column 7: not valid YAML (expected ',' or ']', but got ':')"),
    ("deep.yaml", "seed: " + "[" * 100_000 + "]" * 100_000 + "\n", " nests values too deeply"),
    ("deep.toml", "seed = " + "[" * 100_000 + "]" * 100_000 + "\n", " nests values too deeply"),
])
def test_an_alias_bomb_or_deep_config_is_refused_at_once(tmp_path, chat_source, name, text, says):
    """A 1.3 KB alias bomb took 55 s and 1.7 GB before a MemoryError; now aliases are read and the bomb is refused
    from its composed nodes, before any value is built."""
    config = tmp_path / name
    config.write_text(text)
    line = one_line(plancc(compile_args(chat_source, tmp_path, "--chat-template", "chatml", "--config", config),
                           tmp_path, limits={resource.RLIMIT_CPU: 60}))
    assert line.startswith(f"error: config file {config}") and says in line, line


def test_yaml_anchors_and_aliases_are_read_and_the_bomb_is_refused_in_well_under_a_second(tmp_path):
    from plancc.config.files import read_config_file
    from plancc.errors import SettingsError

    shared = tmp_path / "shared.yaml"
    shared.write_text("base: &base {seed: 3, epochs: 2}\nrun:\n  <<: *base\n  epochs: 4\nworld_size: &w 2\n"
                      "grad_accum: *w\n")
    assert read_config_file(shared) == {"base": {"seed": 3, "epochs": 2}, "run": {"seed": 3, "epochs": 4},
                                        "world_size": 2, "grad_accum": 2}
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(_BOMB)
    start = time.perf_counter()
    with pytest.raises(SettingsError, match="expand to more than 100,000 values"):
        read_config_file(bomb)
    assert time.perf_counter() - start < 0.5


def test_a_config_file_that_is_not_utf8_is_one_line(tmp_path, chat_source):
    config = tmp_path / "c.toml"
    config.write_bytes(b'seed = "\xff"\n')
    line = one_line(plancc(compile_args(chat_source, tmp_path, "--config", config), tmp_path))
    assert line == f"error: config file {config} is not valid UTF-8 (byte 0xff at offset 8)", line


@pytest.mark.parametrize(("make", "kind"), [
    (lambda path: os.mkfifo(path), "a FIFO (named pipe)"),  # blocked forever waiting for a writer
    (lambda path: path.symlink_to("/dev/zero"), "a character device"),  # read until memory ran out
    (lambda path: path.mkdir(), "a directory"),
])
def test_a_config_that_is_not_a_regular_file_is_refused_before_reading(tmp_path, chat_source, make, kind):
    config = tmp_path / "c.toml"
    make(config)
    line = one_line(plancc(compile_args(chat_source, tmp_path, "--config", config), tmp_path, timeout=60,
                           limits={resource.RLIMIT_AS: 4 << 30}))
    assert line == f"error: config file {config} is {kind}, not a regular file; plancc reads a config from a " \
                   "regular file", line


def test_a_config_file_over_the_size_bound_is_refused(tmp_path, chat_source):
    config = tmp_path / "c.toml"
    config.write_text("# " + "x" * (16 << 20) + "\n")
    line = one_line(plancc(compile_args(chat_source, tmp_path, "--config", config), tmp_path, timeout=60))
    assert line == f"error: config file {config} is larger than 16 MiB; a config holds settings and dataset " \
                   "entries, not data"


# ---------------------------------------------------------------- invalid UTF-8 in typed string columns


def _strings(values: list[bytes]) -> pa.Array:
    """A string array holding `values` as they are (Arrow does not check UTF-8 when built from buffers)."""
    raw = pa.array(values, pa.binary())
    return pa.Array.from_buffers(pa.string(), len(raw), raw.buffers())


def test_invalid_utf8_in_a_parquet_string_column_names_file_row_and_column(tmp_path):
    source = tmp_path / "pc.parquet"
    pq.write_table(pa.table({"prompt": pa.array(["a", "b", "c", "d"]),
                             "completion": _strings([b"x", b"y", b"z", b"bad \xff\xfe here"])}), source,
                   row_group_size=2)
    line = one_line(plancc(compile_args(source, tmp_path), tmp_path))
    assert line == f"error: {source} row 3: column 'completion' holds text that is not valid UTF-8", line


def test_invalid_utf8_inside_parquet_messages_names_the_row(tmp_path):
    source = tmp_path / "chat.parquet"
    n = 9
    content = _strings([b"question", b"answer"] * (n - 1) + [b"question", b"\xc3("])
    turns = pa.StructArray.from_arrays([pa.array(["user", "assistant"] * n), content], ["role", "content"])
    messages = pa.ListArray.from_arrays(pa.array(range(0, 2 * n + 1, 2), pa.int32()), turns)
    pq.write_table(pa.table({"messages": messages}), source, row_group_size=4)
    line = one_line(plancc(compile_args(source, tmp_path, "--chat-template", "chatml"), tmp_path))
    assert line == f"error: {source} row 8: column 'messages' holds text that is not valid UTF-8", line


# ---------------------------------------------------------------- tokenized rows: the row to blame


@pytest.mark.parametrize(("rows", "says"), [
    ([{"input_ids": [1, 2, 3]}, {"input_ids": [1, 2.5, 3]}],
     "row 1 (line 3): column 'input_ids' has a list holding float 2.5 at position 1, expected a list of integers"),
    ([{"input_ids": [1, 2], "labels": [1, 2]}, {"input_ids": [1, 2], "labels": [-100.0, 3.25]}],
     "row 1 (line 3): column 'labels' has a list holding float -100.0 at position 0, expected a list of integers"),
])
def test_a_fraction_in_a_tokenized_row_names_that_row_not_the_first(tmp_path, rows, says):
    """Arrow reads the whole column as floats when one row holds 1.5: the error named row 0 (line 1)."""
    source = tmp_path / "t.jsonl"
    source.write_text(json.dumps(rows[0]) + "\n\n" + json.dumps(rows[1]) + "\n")
    line = one_line(plancc(["compile", source, "-o", tmp_path / "plan", "-q"], tmp_path))
    assert line == f"error: {source} {says}", line


# ---------------------------------------------------------------- globs


@pytest.mark.parametrize("parts", [("**", "*.jsonl"), ("*", "*.jsonl"), ("[ab]", "part.jsonl")])
def test_a_glob_over_an_unreadable_directory_names_it(tmp_path, parts):
    """`**` (and `*`) skipped a directory it could not list: 1000 of 2000 rows compiled, and nothing said so; a
    hidden directory the pattern does not search is no error."""
    from tests.adversarial.test_bad_input_lines import _as_a_user

    for d in ("a", "b"):
        (tmp_path / "data" / d).mkdir(parents=True)
        (tmp_path / "data" / d / "part.jsonl").write_text(json.dumps({"text": "x y"}) + "\n")
    (tmp_path / "data" / ".hidden").mkdir()
    for d in ("b", ".hidden"):
        (tmp_path / "data" / d).chmod(0)
    pattern = str(tmp_path / "data" / parts[0] / parts[1])
    cmd = [sys.executable, "-m", "plancc", *map(str, compile_args(pattern, tmp_path))]
    r = subprocess.run(_as_a_user(cmd, tmp_path), capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": str(ROOT), "PLANCC_CACHE": str(tmp_path / "cache")})
    (tmp_path / "data" / "b").chmod(0o755)
    assert one_line(r) == f"error: {tmp_path / 'data' / 'b'}: cannot read directory (Permission denied): {pattern} " \
                          "would miss the files in it; make it readable or narrow the pattern"


# ---------------------------------------------------------------- resource limits and dead processes


def _prompts(path: Path, n: int) -> Path:
    path.write_text("".join(json.dumps({"prompt": f"question {i}", "completion": f"answer {i}"}) + "\n"
                            for i in range(n)))
    return path


def test_too_many_open_files_is_named_as_such(tmp_path):
    """Under `ulimit -n` a scan with worker processes said "set PLANCC_CACHE to a writable directory"."""
    source = _prompts(tmp_path / "pc.jsonl", 3000)
    warm = plancc(["scan", source, "-o", tmp_path / "warm", "--tokenizer", "builtin", "-q"], tmp_path)
    assert warm.returncode == 0, warm.stderr  # kernels compiled: the limited run fails on the scan itself
    r = plancc(["scan", source, "-o", tmp_path / "out", "--tokenizer", "builtin", "-q", "--num-proc", "2",
                "--cache-dir", tmp_path / "fresh"], tmp_path, limits={resource.RLIMIT_NOFILE: 16})
    assert one_line(r) == "error: cannot scan: too many open files (this process may open 16, see `ulimit -n`): " \
                          "raise the limit (e.g. `ulimit -n 4096`) or lower --num-proc"
    assert not (tmp_path / "out").exists()


def test_every_too_many_open_files_line_has_the_same_hint(tmp_path):
    """At `ulimit -n` 16 and 24 the line had no hint (at 20 and 32 it had): wherever descriptors run out (scanning,
    merging parts, reading a scan's token store, writing the recipe's cache entry) the line ends with one hint."""
    a, b = _prompts(tmp_path / "a.jsonl", 3000), _prompts(tmp_path / "b.jsonl", 3000)
    warm = plancc(["scan", a, "-o", tmp_path / "warm", "--tokenizer", "builtin", "-q"], tmp_path)
    assert warm.returncode == 0, warm.stderr
    runs = [("scan", ["scan", a], (12, 16)), ("scan2", ["scan", a, "--num-proc", "2"], (12, 16, 20)),
            ("recipe", ["compile", a, b], (16, 18, 20, 22))]
    failed = 0
    for name, command, limits in runs:
        for limit in limits:
            out = tmp_path / f"{name}-{limit}"
            r = plancc([*command, "-o", out, "--tokenizer", "builtin", "-q", "--cache-dir", tmp_path / f"c-{name}-{limit}"],
                       tmp_path, limits={resource.RLIMIT_NOFILE: limit})
            if r.returncode != 0:
                failed += 1
                line = one_line(r)
                assert line.endswith(f"too many open files (this process may open {limit}, see `ulimit -n`): raise "
                                     "the limit (e.g. `ulimit -n 4096`) or lower --num-proc"), (limit, name, line)
                assert not out.exists()
    assert failed >= 6, failed  # most limits are low enough to fail, each in its own place


_UNDER_A_MEMORY_LIMIT = """
import resource, sys
import numpy as np
from plancc.cli import app
from plancc.store.json_rows import _too_deep
import plancc.scan.scanner, plancc.store.token_hash, pyarrow.json  # loaded, and the kernels compiled, before the limit
_too_deep(np.zeros(1, np.uint8), 1, True)
size = int(next(ln for ln in open("/proc/self/status") if ln.startswith("VmSize")).split()[1]) * 1024
resource.setrlimit(resource.RLIMIT_AS, (size + (ROOM << 20),) * 2)
app(sys.argv[1:], prog_name="plancc")
"""


def test_out_of_memory_is_one_line_naming_where(tmp_path):
    """A MemoryError was a traceback; the limit is set once plancc is loaded, 100 MB above what it holds, so the
    40 MB row is what does not fit."""
    source = tmp_path / "big.jsonl"
    source.write_text(json.dumps({"text": "a b " * 10_000_000}) + "\n")
    r = subprocess.run([sys.executable, "-c", _UNDER_A_MEMORY_LIMIT.replace("ROOM", "100"), "scan", str(source), "-o", str(tmp_path / "out"),
                        "--tokenizer", "builtin", "-q", "--long", "truncate"], capture_output=True, text=True,
                       timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT), "PLANCC_CACHE": str(tmp_path / "c")})
    line = one_line(r)
    assert line.startswith("error: out of memory while running plancc.") and "ulimit -v" in line, line
    assert not (tmp_path / "out").exists()


def test_a_thread_that_cannot_start_is_out_of_memory_in_one_line(tmp_path):
    """Under `ulimit -v` a thread whose stack does not fit was a traceback (`RuntimeError: can't start new thread`
    from the encode pool, `ArrowException: Failed to launch worker thread` from the reader). Here every thread
    reserves 1 GiB of stack (`ulimit -s`) and 600 MB of address space is left."""
    source = _prompts(tmp_path / "pc.jsonl", 3000)

    def big_stacks() -> None:
        resource.setrlimit(resource.RLIMIT_STACK, (1 << 30, resource.getrlimit(resource.RLIMIT_STACK)[1]))

    r = subprocess.run([sys.executable, "-c", _UNDER_A_MEMORY_LIMIT.replace("ROOM", "600"), "compile", str(source), "-o", str(tmp_path / "out"),
                        "--tokenizer", "builtin", "-q"], capture_output=True, text=True, timeout=300,
                       preexec_fn=big_stacks, env={**os.environ, "PYTHONPATH": str(ROOT),
                                                   "PLANCC_CACHE": str(tmp_path / "c")})
    line = one_line(r)
    assert line.startswith("error: out of memory while ") and line.endswith(
        ": a thread could not start (each reserves `ulimit -s` of the address space `ulimit -v` allows); free memory "
        "or raise the limit (`ulimit -v`), lower --num-proc, or scan in shards (`plancc scan --shard I/N`)"), line
    assert not (tmp_path / "out").exists()


def test_too_little_address_space_for_a_tokenizer_is_refused_naming_the_limit(tmp_path):
    """Below a measured minimum the tokenizer's failed allocations abort the process ("memory allocation of 16
    bytes failed", exit 134) or deadlock it: plancc refuses to start tokenizing there and names the limit."""
    source = _prompts(tmp_path / "pc.jsonl", 50)
    r = subprocess.run([sys.executable, "-c", _UNDER_A_MEMORY_LIMIT.replace("ROOM", "300"), "compile", str(source),
                        "-o", str(tmp_path / "out"), "--tokenizer", str(DEEPSEEK_JSON), "-q"], capture_output=True,
                       text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": str(ROOT), "PLANCC_CACHE": str(tmp_path / "c")})
    line = one_line(r)
    assert line.startswith("error: `ulimit -v` leaves ") and (
        f"MiB plancc maps; tokenizing with {DEEPSEEK_JSON} needs at least 640 MiB more (below that the tokenizer's "
        "failed allocations abort or hang the process): raise it to at least ") in line, line
    assert not (tmp_path / "out").exists() and not (tmp_path / "c" / "scans").exists()


_STUCK_IN_NATIVE_CODE = """
import ctypes, sys
from pathlib import Path
import plancc.scan.sources.tokenizer as tokenizer
from plancc.cli import app

libc = ctypes.CDLL(None)
mutex = ctypes.create_string_buffer(64)  # a zeroed pthread mutex is an unlocked normal one
libc.pthread_mutex_lock(mutex)


class Stuck:
    \"\"\"The tokenizer library, deadlocked: its call never returns, whatever signal comes.\"\"\"

    @staticmethod
    def from_str(text):
        Path(sys.argv[1]).touch()
        libc.pthread_mutex_lock(mutex)  # locked already: waits forever (no signal ends pthread_mutex_lock)


tokenizer.Tokenizer = Stuck
app(sys.argv[2:], prog_name="plancc")
"""


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_ends_plancc_stuck_in_native_code(tmp_path, signum):
    """Out of memory under `ulimit -v` the tokenizer deadlocked in its allocation-failure path, and plancc ignored
    SIGTERM and SIGINT for 15 minutes: its handler runs only when the main thread comes back from native code. The
    deadlock is reproduced with a pthread mutex locked twice where the tokenizer is loaded."""
    from plancc.cli.watchdog import GRACE

    source, stuck = _prompts(tmp_path / "pc.jsonl", 20), tmp_path / "stuck"
    child = subprocess.Popen([sys.executable, "-c", _STUCK_IN_NATIVE_CODE, str(stuck), "compile", str(source), "-o",
                              str(tmp_path / "out"), "--tokenizer", str(DEEPSEEK_JSON), "-q"],
                             stderr=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": str(ROOT), "PLANCC_CACHE": str(tmp_path / "c")})
    try:
        for _ in range(1200):
            if stuck.exists() or child.poll() is not None:
                break
            time.sleep(0.1)
        assert stuck.exists(), child.stderr.read()
        time.sleep(0.5)
        sent = time.monotonic()
        child.send_signal(signum)
        child.wait(timeout=GRACE + 30)
        assert GRACE - 1 < time.monotonic() - sent < GRACE + 30
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 128 + signum
    assert child.stderr.read() == (f"interrupted before the plan was written: nothing was written at {tmp_path / 'out'} "
                                   f"(plancc ended itself {GRACE:g} s after the signal: a native call did not "
                                   "return)\n")


def test_a_lock_left_by_a_killed_scan_does_not_block_the_next(tmp_path):
    """A scan killed while it fills the cache leaves its `.KEY.scan.lock` file; the lock is an flock, which died
    with its holder, so the next scan goes ahead (and reuses the finished shards)."""
    source = _prompts(tmp_path / "pc.jsonl", 45)
    args = ["scan", source, "-o", tmp_path / "out", "--tokenizer", "builtin", "--shard-rows", "10", "-q"]
    os.environ["PLANCC_FAULT"] = "parts_written@parts=2"
    try:
        killed = plancc(args, tmp_path)
    finally:
        del os.environ["PLANCC_FAULT"]
    assert killed.returncode == -9
    assert list((tmp_path / "cache" / "scans").glob(".*.scan.lock"))
    again = plancc(args, tmp_path, timeout=120)
    assert again.returncode == 0, again.stderr
    assert (tmp_path / "out" / "samples.parquet").is_file()


# ---------------------------------------------------------------- two compiles sharing a cold cache


def _state(pid: int) -> str:
    """A process's state letter (`T`: stopped), '' once it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


def _holds(pid: int, suffix: str) -> bool:
    """Whether process `pid` has a file ending in `suffix` open (a lock it holds or waits for)."""
    try:
        return any(os.readlink(f"/proc/{pid}/fd/{fd}").endswith(suffix) for fd in os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return False


def test_two_recipe_compiles_share_one_cache_entry_written_once(tmp_path):
    """Two compiles of one recipe to different -o: the second failed 5 of 5 times with "another plancc process is
    writing .../recipes/KEY". Here the first is stopped (SIGSTOP) with the entry written but not yet in place; the
    second must wait for it, not fail, and both plans must map the one entry."""
    a, b = _prompts(tmp_path / "a.jsonl", 300), _prompts(tmp_path / "b.jsonl", 200)
    for source in (a, b):  # the scan cache warm: the recipe's entry is the first directory a compile writes
        assert plancc(["scan", source, "-o", tmp_path / f"scan-{source.stem}", "--tokenizer", "builtin", "-q"],
                      tmp_path).returncode == 0
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PLANCC_CACHE": str(tmp_path / "cache")}
    args = [sys.executable, "-m", "plancc", "compile", str(a), str(b), "--tokenizer", "builtin", "-q", "-o"]
    first = subprocess.Popen([*args, str(tmp_path / "one")], env={**env, "PLANCC_FAULT": "written:stop"},
                             stderr=subprocess.PIPE, text=True)
    second = None
    try:
        for _ in range(1200):  # the first stops once its recipe entry is written (at most 120 s)
            if _state(first.pid) in ("T", ""):
                break
            time.sleep(0.1)
        assert _state(first.pid) == "T", first.stderr.read() if first.poll() is not None else "still running"
        second = subprocess.Popen([*args, str(tmp_path / "two")], env=env, stderr=subprocess.PIPE, text=True)
        for _ in range(1200):  # the second reaches the entry: it waits for the first's lock, or gives up
            if second.poll() is not None or _holds(second.pid, ".recipe.lock"):
                break
            time.sleep(0.1)
        while first.poll() is None:  # go on (the first stops again writing its own plan)
            if _state(first.pid) == "T":
                os.kill(first.pid, signal.SIGCONT)
            time.sleep(0.1)
        assert second.wait(timeout=300) == 0, second.stderr.read()
        assert first.returncode == 0, first.stderr.read()
    finally:
        for p in (first, second):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
    entries = list((tmp_path / "cache" / "recipes").iterdir())
    assert len(entries) == 1 and entries[0].is_dir(), entries  # one entry, no leftovers
    cached = (entries[0] / "tokens" / "tokens.json").stat().st_ino
    assert (tmp_path / "one" / "tokens" / "tokens.json").stat().st_ino == cached  # both plans link the one entry
    assert (tmp_path / "two" / "tokens" / "tokens.json").stat().st_ino == cached
    assert json.loads((tmp_path / "one" / "manifest.json").read_text())["fingerprints"] == \
        json.loads((tmp_path / "two" / "manifest.json").read_text())["fingerprints"]

"""A multi-part token store opens in the same few file descriptors whatever its number of parts, and reading every
part adds none: `verified_plan` + `load_tokens` of a plan whose store has 1, 10 or 500 parts take the same number,
its reads equal the single store's, a 500-part plan opens and trains under a low `ulimit -n`, and a process out of
descriptors gets one line saying so (a `PlanccError`), never a raw `OSError`."""

from __future__ import annotations

import gc
import os
import pickle
import resource
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from benchmarks.synthetic import build_plan, make_tokenized
from plancc.runtime import PlanCollator, PlanMismatchError, PlanSampler, load_tokens, verified_plan
from plancc.store import schemas, token_store, token_writer
from tests.support import REPO

PARTS = (1, 10, 500)
SETTINGS = dict(mode="packed", micro_batch_size=2, sequence_len=64, world_size=2)
LOW_LIMIT = 64  # descriptors: the 500-part store took 3,506 of them where each part was opened at open
ROOT = REPO


@pytest.fixture(scope="module")
def plans(tmp_path_factory) -> dict[int | None, Path]:
    """The same 1,000 samples compiled into plans whose token store is single (None) or has 1, 10 or 500 parts."""
    root = tmp_path_factory.mktemp("parts")
    tok = make_tokenized(1000, seed=7)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(os, "fsync", lambda fd: None)  # 2,500 small files: their durability is not what is tested here
        return {parts: build_plan(root / str(parts), tok=tok, parts=parts, **SETTINGS) for parts in (None, *PARTS)}


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _batches(plan, tokens) -> list[dict]:
    collator = PlanCollator.from_plan(plan)
    return [collator(mb, tokens) for r in range(2) for mb in PlanSampler(plan, rank=r, world_size=2)]


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) if isinstance(a[k], torch.Tensor) else a[k] == b[k]
                                        for k in a)


def _rows(tokens) -> list[np.ndarray]:
    """Every row's ids, read in a shuffled order after the check the collator makes."""
    order = np.random.default_rng(0).permutation(len(tokens))
    tokens.check(order)
    return [np.asarray(tokens.input_ids[tokens.offsets[i]:tokens.offsets[i + 1]]) for i in np.sort(order)]


def test_a_store_holds_one_descriptor_whatever_it_reads(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "fsync", lambda fd: None)  # small files: their durability is not what is tested here
    rng = np.random.default_rng(3)
    rows = [rng.integers(0, 50, int(rng.integers(1, 9))).tolist() for _ in range(120)]
    singles = []
    for k in range(40):
        part = rows[3 * k:3 * k + 3]
        ids = np.array([t for r in part for t in r], dtype=np.int32)
        offsets = np.concatenate([[0], np.cumsum([len(r) for r in part])])
        token_writer.write_store(tmp_path / str(k), ids, ids, offsets, fingerprints={}, chunk_tokens=4)
        singles.append(tmp_path / str(k))
    token_writer.write_parts(tmp_path / "parts", singles, fingerprints={}, labels_shifted=False)
    gc.collect()
    before = _open_fds()
    m = token_store.open_store(tmp_path / "parts")
    assert _open_fds() == before + 1  # the store's folder, to open its parts from
    assert [m.input_ids[m.offsets[i]:m.offsets[i + 1]].tolist() for i in range(len(rows))] == rows
    assert token_store.verify_all(m) is None and token_store.parts_problem(m) is None
    assert _open_fds() == before + 1  # all 40 parts mapped, 200 arrays: no descriptor held by a map
    del m
    gc.collect()
    assert _open_fds() == before


@pytest.mark.slow
def test_open_takes_the_same_descriptors_whatever_the_parts(plans):
    whole = load_tokens(plans[None])
    want_rows, want_batches = _rows(whole), _batches(verified_plan(plans[None]), whole)
    opened, after_reads = {}, {}
    for parts in (None, *PARTS):
        gc.collect()
        before = _open_fds()
        plan = verified_plan(plans[parts])
        tokens = load_tokens(plan)
        opened[parts] = _open_fds() - before
        assert [a.tolist() for a in _rows(tokens)] == [a.tolist() for a in want_rows]
        got = _batches(plan, tokens)
        assert len(got) == len(want_batches) and all(_same(g, w) for g, w in zip(got, want_batches, strict=True))
        after_reads[parts] = _open_fds() - before  # every part read: none holds a descriptor
        del plan, tokens, got
        gc.collect()
        assert _open_fds() == before
    assert opened[1] == opened[10] == opened[500] == after_reads[500] <= opened[None] + 1, (opened, after_reads)


@pytest.mark.slow
def test_multi_part_arrays_index_like_the_whole_store(plans):
    whole, parts = load_tokens(plans[None], verify="none"), load_tokens(plans[500], verify="none")
    rng = np.random.default_rng(1)
    n, t = len(whole), int(whole.offsets[-1])
    assert len(parts) == n and parts.input_ids.shape == whole.input_ids.shape and parts.max_id == whole.max_id
    idx = rng.integers(0, t, 300)
    rows = rng.integers(0, n + 1, 300)
    assert np.array_equal(parts.input_ids[idx], whole.input_ids[idx])
    assert np.array_equal(parts.targets[idx.reshape(30, 10)], whole.targets[idx.reshape(30, 10)])
    assert np.array_equal(parts.offsets[rows], whole.offsets[rows]) and parts.offsets[-1] == t
    for a, b in [(0, t), (5, 900), (t - 7, t), (3, 3)] + [tuple(sorted(rng.integers(0, t, 2))) for _ in range(20)]:
        assert np.array_equal(parts.input_ids[a:b], whole.input_ids[a:b]), (a, b)
    assert np.array_equal(np.asarray(parts.offsets), whole.offsets) and np.array_equal(np.diff(parts.offsets),
                                                                                          whole.lengths)
    copy = pickle.loads(pickle.dumps(parts))  # a spawned DataLoader worker's copy: reopened, not copied
    assert len(pickle.dumps(parts)) < 1000 and copy.guard.pending == 0  # verify="none" stays none in the worker
    assert np.array_equal(copy.input_ids[idx], whole.input_ids[idx])


@pytest.mark.slow
def test_a_part_replaced_after_open_is_refused_when_first_read(plans, tmp_path):
    plan_dir = Path(shutil.copytree(plans[10], tmp_path / "plan"))
    tokens = load_tokens(plan_dir)
    part = plan_dir / schemas.TOKENS_DIR / "part-00007"
    shutil.rmtree(part)
    ids = np.arange(1, 201, dtype=np.int32)
    token_writer.write_store(part, ids, ids, np.arange(0, 201, 2), fingerprints={})
    with pytest.raises(PlanMismatchError, match=r"part-00007 holds .* records .*replaced or rewritten"):
        tokens.check(np.arange(0, 100))  # rows of part 0, whose block of row hashes (1,024 rows) spans part 7


CHILD = textwrap.dedent("""
    import hashlib, os, resource, sys
    import numpy as np
    from plancc.runtime import PlanCollator, PlanSampler, load_tokens, verified_plan

    limit = int(sys.argv[2])
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    plan = verified_plan(sys.argv[1])
    tokens = load_tokens(plan)
    collator, digest = PlanCollator.from_plan(plan), hashlib.sha256()
    for r in range(2):
        for mb in PlanSampler(plan, rank=r, world_size=2):
            digest.update(collator(mb, tokens)["input_ids"].numpy().tobytes())
    print(digest.hexdigest(), len(os.listdir("/proc/self/fd")))
""")


@pytest.mark.slow
def test_a_500_part_plan_opens_and_reads_under_a_low_descriptor_limit(plans):
    runs = {parts: subprocess.run([sys.executable, "-c", CHILD, str(plans[parts]), str(LOW_LIMIT)], cwd=ROOT,
                                  capture_output=True, text=True, timeout=300) for parts in (None, 500)}
    assert all(r.returncode == 0 for r in runs.values()), {p: r.stderr[-2000:] for p, r in runs.items()}
    (single, single_fds), (parts, parts_fds) = (runs[p].stdout.split() for p in (None, 500))
    assert parts == single and int(parts_fds) <= int(single_fds) + 1
    limit = f"ulimit -n {LOW_LIMIT}"
    done = subprocess.run(["bash", "-c", f'{limit} && "$0" -m plancc validate "$1"', sys.executable,
                           str(plans[500])], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr  # every part opened and rehashed, under the same limit


EXHAUST = textwrap.dedent("""
    import os, resource, sys
    import numpy as np
    from plancc.errors import PlanccError
    from plancc.runtime import load_tokens, verified_plan

    resource.setrlimit(resource.RLIMIT_NOFILE, (64, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    plan = verified_plan(sys.argv[1])
    checked, unchecked = load_tokens(plan), load_tokens(plan, verify="none")
    held = []
    try:
        while True:
            held.append(os.open(os.devnull, os.O_RDONLY))
    except OSError:
        pass
    for read in (lambda: checked.check(np.arange(300, 310)), lambda: unchecked.input_ids[int(unchecked.offsets[400])]):
        try:
            read()
            print("read with no descriptor left")
        except PlanccError as exc:
            print(type(exc).__name__, "|", exc)
    for fd in held:
        os.close(fd)
    checked.check(np.arange(300, 310))  # the limit raised (descriptors freed): the same reads go through
    print("then", int(unchecked.input_ids[int(unchecked.offsets[400])]) == int(checked.input_ids[int(checked.offsets[400])]))
""")


@pytest.mark.slow
def test_out_of_descriptors_is_one_line_saying_what_to_do(plans):
    assert resource.getrlimit(resource.RLIMIT_NOFILE)[1] >= 64
    done = subprocess.run([sys.executable, "-c", EXHAUST, str(plans[500])], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert len(lines) == 3 and lines[2] == "then True", done.stdout
    for line in lines[:2]:  # not a mismatch of the data (no "recompile"): the process's limit
        assert line.startswith("TokenStoreError | token store ") and "part-00" in line and "recompile" not in line
        assert "Too many open files" in line and "ulimit -n" in line, line
    assert "Traceback" not in done.stderr

"""Where plancc may write: an `-o` directory must be absent, empty, or a plan/scan holding only what plancc
wrote (anything else is refused, named, before any work); then the atomic replace."""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
import re
import stat
from collections.abc import Iterator
from pathlib import Path

import orjson

from plancc.errors import PlanccError
from plancc.store import atomic, token_store
from plancc.store.scan_record import ScanRecord, ScanRecordError
from plancc.store.schemas import (
    BEFORE_FILE,
    EVAL_FILE,
    MANIFEST_FILE,
    METRICS_FILE,
    PLAN_FILE,
    SAMPLES_FILE,
    SCAN_MANIFEST_FILE,
    TOKENIZED_FILE,
    TOKENS_DIR,
)


class OutputError(PlanccError):
    """An `-o` directory plancc must not write into (foreign content, or a plan/scan without `--overwrite`)."""


# what plancc writes at the top of a plan or scan directory (besides TOKENS_DIR); TOKENIZED_FILE: older plans
OWN_FILES = {"plan": {PLAN_FILE, SAMPLES_FILE, METRICS_FILE, BEFORE_FILE, MANIFEST_FILE, EVAL_FILE, TOKENIZED_FILE},
             "scan": {SAMPLES_FILE, SCAN_MANIFEST_FILE}}
SHOWN_FOREIGN = 10  # an `-o` refusal names this many of the paths plancc did not write
_PART_DIR = re.compile(r"part-\d+")  # a multi-part token store's part folders (`token_writer.write_parts`)


def output_kind(path: Path) -> str | None:
    """'plan' or 'scan' when `path` is a plancc plan or scan directory (recognised by its manifest), else None."""
    if _is_plan(path):
        return "plan"
    try:
        record = ScanRecord.read(path / SCAN_MANIFEST_FILE)
    except ScanRecordError:
        return None
    return "scan" if "plancc_scan_version" in record.keys else None


def _is_plan(path: Path) -> bool:
    """Whether `path` holds a plan's manifest."""
    raw = atomic.read_regular(path / MANIFEST_FILE)  # a FIFO named like a manifest is not read (it would block)
    try:
        manifest = orjson.loads(raw) if raw is not None else None
    except orjson.JSONDecodeError:
        return False
    return isinstance(manifest, dict) and "fingerprints" in manifest and "plancc" in manifest


def _entry_kind(entry: os.DirEntry) -> str:
    """'file', 'dir' or what else `entry` is (not followed through a link), for naming a foreign entry."""
    if entry.is_symlink():
        return "symlink"
    if entry.is_dir(follow_symlinks=False):
        return "dir"
    if entry.is_file(follow_symlinks=False):
        return "file"
    mode = entry.stat(follow_symlinks=False).st_mode
    return "FIFO" if stat.S_ISFIFO(mode) else "socket" if stat.S_ISSOCK(mode) else "device file"


def _shown(name: str, kind: str) -> str:
    return name + {"file": "", "dir": "/"}.get(kind, f" ({kind})")


def _foreign_in_tokens(folder: Path, shown: str, *, parts: bool = True) -> Iterator[str]:
    """Paths under a token store folder that plancc did not write: it writes the arrays and the header as regular
    files, and a multi-part store's parts (`token_writer.write_parts`) as folders of the same."""
    own = {token_store.HEADER_FILE, *(f"{n}.npy" for n in token_store.ARRAYS)}
    for entry in sorted(os.scandir(folder), key=lambda e: e.name):
        kind = _entry_kind(entry)
        if kind == "file" and entry.name in own:
            continue
        if kind == "dir" and parts and _PART_DIR.fullmatch(entry.name):
            yield from _foreign_in_tokens(Path(entry.path), f"{shown}/{entry.name}", parts=False)
            continue
        yield _shown(f"{shown}/{entry.name}", kind)


def foreign_entries(path: Path, kind: str) -> Iterator[str]:
    """Paths (relative to `path`) in the plancc `kind` directory `path` that plancc did not write there: a user's
    files, a source, checkpoints, or a FIFO or link where plancc writes a regular file. `--overwrite` replaces the
    whole directory, so any of them refuses it."""
    for entry in sorted(os.scandir(path), key=lambda e: e.name):
        what = _entry_kind(entry)
        if what == "file" and entry.name in OWN_FILES[kind]:
            continue
        if what == "dir" and entry.name == TOKENS_DIR:
            yield from _foreign_in_tokens(Path(entry.path), entry.name)
            continue
        yield _shown(entry.name, what)


def check_output(target: str | Path, *, overwrite: bool) -> None:
    """Refuse an output path that is not absent, an empty directory, or (with `overwrite`) a plancc plan/scan
    holding only what plancc wrote (docs/spec.md §1: a folder holding anything else is never touched).

    Runs before any work (so a refused command costs nothing) and again under the writer's lock, before and after
    the new directory is written.
    """
    target = Path(target)
    if not os.path.lexists(target):
        return
    if not target.is_dir():
        raise OutputError(f"output {target} exists and is not a directory; choose another -o")
    entries = sorted(os.listdir(target))
    if not entries:
        return
    kind = output_kind(target)
    if kind is None:
        shown = ", ".join(entries[:3]) + (", ..." if len(entries) > 3 else "")
        raise OutputError(f"output {target} is not empty and is not a plancc plan or scan directory (it holds "
                          f"{shown}); plancc never writes into such a folder: choose a new or empty -o")
    foreign = list(itertools.islice(foreign_entries(target, kind), SHOWN_FOREIGN + 1))
    if foreign:
        raise OutputError(f"output {target} is a plancc {kind} but also holds what plancc did not write: "
                          f"{_listed(target, kind, foreign)}; a {kind} is replaced whole, so plancc leaves this "
                          "folder untouched: move them out, or choose another -o")
    if not overwrite:
        raise OutputError(f"output {target} already holds a plancc {kind}; pass --overwrite to replace it")


def _listed(target: Path, kind: str, shown: list[str]) -> str:
    """The first SHOWN_FOREIGN foreign paths, and how many more there are (counted only when there are more)."""
    if len(shown) <= SHOWN_FOREIGN:
        return ", ".join(shown)
    more = sum(1 for _ in foreign_entries(target, kind)) - SHOWN_FOREIGN
    return ", ".join(shown[:SHOWN_FOREIGN]) + f" and {more} more"


@contextlib.contextmanager
def atomic_directory(target: str | Path, *, overwrite: bool = False, owned: bool = False,
                     what: str = "plan") -> Iterator[Path]:
    """A temporary directory whose content replaces `target` whole when the block ends (see `plancc.store.atomic`).

    `owned`: `target` lives in a directory plancc owns (the scan cache), so whatever is there is replaced.
    """
    check = None if owned else functools.partial(check_output, overwrite=overwrite)
    with atomic.replace_directory(target, check, what=what) as tmp:
        yield tmp

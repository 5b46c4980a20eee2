"""numba for plancc's compiled kernels, with a disk cache that belongs to the installation.

Kernel modules import numba from here, so numba's cache is pointed before numba loads. Compiled kernels live beside
the installed package (`plancc/_kernels/<key>`), where that folder can be written: a new plancc cache dir (a CI
job's, a fresh container's or cluster node's, each shard of an array job) then starts warm, and `make install` (or
`python -m plancc.build.kernels` after `pip install`) compiles them once, at install. Where the package folder is
read-only they live in `$PLANCC_CACHE/numba/<key>`, seeded from the installation's copy when it has one.

`<key>` hashes the source of every kernel module: numba checks only the file that defines a function, and a kernel
that calls (or inlines) another module's kernel carries that kernel's code in its own cache entry, so after an edit
of the callee numba would load the stale caller. A changed source is a new folder, compiled afresh; the old one is
removed. A user's own `NUMBA_CACHE_DIR` wins. Compiling every kernel takes tens of seconds, so `compile_notice` has
the pipeline say so once, from numba's own compile events (what it loads from the disk cache is no compile).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

from plancc.core.paths import cache_path

# every module holding @numba.njit(cache=True) kernels (a test checks the list against the sources)
KERNEL_MODULES = ("plancc.store.token_hash", "plancc.planner.sort", "plancc.core.row_sums", "plancc.planner.pack.best_fit",
                  "plancc.planner.pack._rows", "plancc.planner.pack.exact_fill", "plancc.planner.balance._cost_spread",
                  "plancc.planner.balance._exchange", "plancc.planner.balance._rounds",
                  "plancc.planner.balance._subset_tables", "plancc.planner.balance._redeal", "plancc.planner.balance.accumulation", "plancc.store.json_rows")
COMPILING = "compiling kernels (first run only)"
PACKAGE = Path(__file__).resolve().parent.parent  # the installed `plancc` folder
INSTALLED = "_kernels"  # the installation's kernel cache, a folder of PACKAGE


def kernel_key(package: Path = PACKAGE) -> str:
    """A hash of every kernel module's source under `package`: the name of the cache folder that fits them."""
    digest = hashlib.sha256()
    for name in KERNEL_MODULES:
        path = package.joinpath(*name.split(".")[1:]).with_suffix(".py")
        digest.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def _fresh(folder: Path, key: str, *, only: bool) -> Path | None:
    """`folder/key`, made if `folder` can be written, else None; with `only`, the folder's other keys (stale: the
    installation's sources changed) are removed."""
    try:
        (folder / key).mkdir(parents=True, exist_ok=True)
        probe = folder / key / f".probe-{os.getpid()}"
        probe.touch()
        probe.unlink()
    except OSError:
        return None
    for old in folder.iterdir() if only else ():
        if old.name != key and old.is_dir():
            shutil.rmtree(old, ignore_errors=True)
    return folder / key


def kernel_cache_dir(package: Path = PACKAGE) -> Path | None:
    """Where numba caches plancc's kernels (module docstring): the installation's folder if writable, else the
    plancc cache's (seeded from the installation's), else None (numba's default)."""
    key = kernel_key(package)
    installed = _fresh(package / INSTALLED, key, only=True)
    if installed is not None:
        return installed
    user = _fresh(cache_path(None, "numba"), key, only=False)  # other installations may share it
    shipped = package / INSTALLED / key
    if user is not None and shipped.is_dir() and not any(user.iterdir()):
        shutil.copytree(shipped, user, dirs_exist_ok=True)
    return user


def _point_numba_cache() -> None:
    """Unless the user set NUMBA_CACHE_DIR, point it at `kernel_cache_dir()` (if none can be made, numba caches
    beside the sources, as it does by default)."""
    if os.environ.get("NUMBA_CACHE_DIR"):
        return
    path = kernel_cache_dir()
    if path is not None:
        os.environ["NUMBA_CACHE_DIR"] = str(path)


_point_numba_cache()

import numba  # noqa: E402  (after NUMBA_CACHE_DIR is set: numba reads it once, on import)
import numba.core.event  # noqa: E402


class _Notice(numba.core.event.Listener):
    """Says COMPILING on the first function numba compiles, not on one it loads from its disk cache."""

    def __init__(self, progress: Callable[[str, int, int], None] | None) -> None:
        self.progress = progress
        self.compiled = 0

    def on_start(self, event: numba.core.event.Event) -> None:
        if self.compiled == 0 and self.progress:
            self.progress(COMPILING, 0, 1)
        self.compiled += 1

    def on_end(self, event: numba.core.event.Event) -> None:
        pass


@contextlib.contextmanager
def compile_notice(progress: Callable[[str, int, int], None] | None) -> Iterator[None]:
    """While inside, the first kernel numba has to compile says COMPILING on `progress` (done on exit): a cold start
    takes long and says why, once; a warm run, whose kernels all come from the disk cache, says nothing."""
    notice = _Notice(progress)
    with numba.core.event.install_listener("numba:compile", notice):
        yield
    if notice.compiled and progress:
        progress(COMPILING, 1, 1)


__all__ = ["COMPILING", "KERNEL_MODULES", "compile_notice", "kernel_cache_dir", "kernel_key", "numba"]

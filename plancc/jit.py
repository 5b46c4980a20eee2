"""numba for plancc's compiled kernels, with its disk cache in the plancc cache dir (`$PLANCC_CACHE/numba`).

Kernel modules import numba from here, so numba's cache is pointed before numba loads: compiled kernels then
outlive a reinstall or a read-only package dir, and a warm run never compiles. A user's own `NUMBA_CACHE_DIR`
wins. Compiling every kernel takes 30-50 s on a cold start, so `cold()` tells the pipeline to say so once.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import sys
from pathlib import Path

from plancc.config import default_cache_dir

# every module holding @numba.njit(cache=True) kernels (a test checks the list against the sources)
KERNEL_MODULES = ("plancc.token_hash", "plancc.sort", "plancc.pack.best_fit", "plancc.balance._exchange",
                  "plancc.balance._redeal", "plancc.balance.accumulation")
COMPILING = "compiling kernels (first run only)"


def _cache_dir() -> Path | None:
    """numba's cache dir: the user's NUMBA_CACHE_DIR, else `<plancc cache>/numba` if it can be made, else None
    (numba then caches beside the sources, as it does by default)."""
    if os.environ.get("NUMBA_CACHE_DIR"):
        return Path(os.environ["NUMBA_CACHE_DIR"])
    path = default_cache_dir() / "numba"
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    os.environ["NUMBA_CACHE_DIR"] = str(path)
    return path


CACHE_DIR = _cache_dir()

import numba  # noqa: E402  (after NUMBA_CACHE_DIR is set: numba reads it once, on import)


def _stamp() -> Path | None:
    """A file that exists once this numba and these kernel sources have been compiled into the cache (numba
    itself invalidates on a source file's mtime and size, so the stamp keys on the same)."""
    if CACHE_DIR is None:
        return None
    key = hashlib.sha256(f"{numba.__version__} {sys.version}".encode())
    for name in KERNEL_MODULES:
        module = sys.modules.get(name)
        if module is None or not getattr(module, "__file__", None):
            continue
        st = os.stat(module.__file__)
        key.update(f"{name} {st.st_mtime_ns} {st.st_size}".encode())
    return CACHE_DIR / f"plancc-{key.hexdigest()[:16]}.compiled"


def cold() -> bool:
    """True while the kernels of this install have not been compiled into the disk cache yet."""
    stamp = _stamp()
    return stamp is not None and not stamp.exists()


def mark_compiled() -> None:
    """Record that a run compiled (and numba cached) the kernels: later runs are warm."""
    stamp = _stamp()
    if stamp is not None:
        with contextlib.suppress(OSError):
            stamp.touch()


__all__ = ["COMPILING", "KERNEL_MODULES", "cold", "mark_compiled", "numba"]

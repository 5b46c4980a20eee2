"""numba for plancc's compiled kernels, with its disk cache in the plancc cache dir (`$PLANCC_CACHE/numba`).

Kernel modules import numba from here, so numba's cache is pointed before numba loads: compiled kernels then
outlive a reinstall or a read-only package dir, and a warm run never compiles. A user's own `NUMBA_CACHE_DIR`
wins. Compiling every kernel takes tens of seconds on a cold start, so `compile_notice` has the pipeline say so
once, from numba's own compile events (what it loads from the disk cache is no compile).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator

from plancc.core.paths import cache_path

# every module holding @numba.njit(cache=True) kernels (a test checks the list against the sources)
KERNEL_MODULES = ("plancc.store.token_hash", "plancc.planner.sort", "plancc.core.row_sums", "plancc.planner.pack.best_fit",
                  "plancc.planner.pack._rows", "plancc.planner.pack.exact_fill", "plancc.planner.balance._cost_spread",
                  "plancc.planner.balance._exchange", "plancc.planner.balance._subset_tables",
                  "plancc.planner.balance._redeal", "plancc.planner.balance.accumulation", "plancc.store.json_rows")
COMPILING = "compiling kernels (first run only)"


def _point_numba_cache() -> None:
    """Unless the user set NUMBA_CACHE_DIR, point it at `<plancc cache>/numba` if that can be made (else numba
    caches beside the sources, as it does by default)."""
    if os.environ.get("NUMBA_CACHE_DIR"):
        return
    path = cache_path(None, "numba")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError:
        return
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


__all__ = ["COMPILING", "KERNEL_MODULES", "compile_notice", "numba"]

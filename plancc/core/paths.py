"""Where plancc keeps its cache (scans, recipes, compiled kernels), and what a path plancc must read from is."""

from __future__ import annotations

import os
import stat
from pathlib import Path

# what an input path may be instead of a regular file or a directory: plancc never opens one (a FIFO blocks until
# a writer comes, a device or socket streams without end)
_SPECIAL = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
            (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def default_cache_dir() -> Path:
    """The plancc cache (scans, compiled kernels): $PLANCC_CACHE, else ~/.cache/plancc."""
    return Path(os.environ.get("PLANCC_CACHE") or "~/.cache/plancc").expanduser()  # empty: unset, as shells mean it


def cache_path(cache_dir: str | Path | None, *parts: str) -> Path:
    """`parts` under the cache a caller gave (`--cache-dir`, `cache_dir=`), else under `default_cache_dir()`."""
    return (Path(cache_dir) if cache_dir is not None else default_cache_dir()).joinpath(*parts)


def file_kind(mode: int) -> str | None:
    """What a file of `mode` (`st_mode`) is when it is neither a regular file nor a directory (None otherwise)."""
    return next((kind for test, kind in _SPECIAL if test(mode)), None)


def not_regular(path: str | Path, wants: str) -> str | None:
    """Why `path` cannot be read as `wants` (e.g. "a tokenizer.json file or a directory") when it exists, followed
    through links, as a FIFO, device or socket (`/dev/stdin` is a pipe or a terminal); None for anything else,
    which the caller reads or reports missing its own way."""
    try:
        kind = file_kind(os.stat(path).st_mode)
    except (OSError, ValueError):
        return None
    return None if kind is None else f"{path} is {kind}, not a regular file; plancc reads {wants}"

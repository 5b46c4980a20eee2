"""Where plancc keeps its cache (scans, recipes, compiled kernels): one rule for every user of it."""

from __future__ import annotations

import os
from pathlib import Path


def default_cache_dir() -> Path:
    """The plancc cache (scans, compiled kernels): $PLANCC_CACHE, else ~/.cache/plancc."""
    return Path(os.environ.get("PLANCC_CACHE") or "~/.cache/plancc").expanduser()  # empty: unset, as shells mean it


def cache_path(cache_dir: str | Path | None, *parts: str) -> Path:
    """`parts` under the cache a caller gave (`--cache-dir`, `cache_dir=`), else under `default_cache_dir()`."""
    return (Path(cache_dir) if cache_dir is not None else default_cache_dir()).joinpath(*parts)

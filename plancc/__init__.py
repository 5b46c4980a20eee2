"""plancc: compile fine-tuning datasets into packed, label-balanced, token-exact training plans.

`plancc.compile(source, output, **settings)` and `plancc.open_plan(path)` (see `plancc.api`) are imported on first
use, so `import plancc` loads nothing heavy (no pyarrow, numba or torch).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from plancc.version import __version__

__all__ = ["EpochMicrobatches", "Plan", "__version__", "compile", "open_plan"]

if TYPE_CHECKING:
    from plancc.api import EpochMicrobatches, Plan, compile, open_plan


def __getattr__(name: str) -> Any:
    if name in ("EpochMicrobatches", "Plan", "compile", "open_plan"):
        from plancc import api

        return getattr(api, name)
    raise AttributeError(f"module 'plancc' has no attribute {name!r}")

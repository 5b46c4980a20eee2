"""The Axolotl 0.19.0 venv the Axolotl tests run it from: Axolotl pins its own transformers and TRL, so it lives
apart, at `$PLANCC_AXOLOTL_VENV` (default /tmp/plancc-axolotl-venv, built by `make axolotl-venv`, several GB of
downloads). Built when missing only with `PLANCC_AXOLOTL_INSTALL=1` (the suite stays offline-quick otherwise); a
test skips, saying why, when it is not there or cannot be built."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import REPO

VENV = Path(os.environ.get("PLANCC_AXOLOTL_VENV", "/tmp/plancc-axolotl-venv"))


def axolotl_python() -> Path:
    """The venv's python (built first with `PLANCC_AXOLOTL_INSTALL=1`); skips the test without it."""
    if not (VENV / "bin" / "axolotl").exists():
        if os.environ.get("PLANCC_AXOLOTL_INSTALL") != "1":
            pytest.skip(f"no Axolotl venv at {VENV}: run `make axolotl-venv` (or set PLANCC_AXOLOTL_INSTALL=1)")
        try:
            subprocess.run(["make", "axolotl-venv", f"AXOLOTL_VENV={VENV}", f"PYTHON={sys.executable}"], cwd=REPO,
                           check=True, capture_output=True, text=True, timeout=3600)
        except (subprocess.SubprocessError, OSError) as exc:
            tail = (getattr(exc, "stderr", None) or str(exc)).strip().splitlines()[-1:]
            pytest.skip(f"Axolotl 0.19.0 could not be installed into {VENV} (`make axolotl-venv`): {tail}")
    return VENV / "bin" / "python"

"""Builders the tests import (plans, sources, tiny models) and the repository root."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

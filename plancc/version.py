"""The package version, in a module of its own so that what records it (plan manifests, `plancc --version`) need not
import the package's `__init__` from below it. `pyproject.toml` holds the same string (tests check they agree)."""

__version__ = "0.1.0"

"""Frozen settings for scan and compile, validated with messages that name the setting to change.

Two objects, because they change different things: `ScanOptions` decide the samples table (and so the
scan cache key); `PlanSettings` decide the plan given a samples table (and so the `config` fingerprint).
Settings that cannot change a plan (`num_proc`, `quiet`, output paths) live in neither.
"""

from __future__ import annotations

import dataclasses
import hashlib
import tomllib
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import orjson

from plancc.errors import PlanccError

MODES = ("packed", "padded", "flattened")
SHIFTS = ("sample", "row", "none")
LONG_POLICIES = ("truncate", "drop", "error")
FORMATS = ("auto", "tokenized", "prompt_completion", "alpaca", "messages", "text")


class SettingsError(PlanccError):
    """A setting is missing, out of range or inconsistent; the message names it."""


def _positive(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise SettingsError(f"--{name.replace('_', '-')} must be a positive integer, got {value!r}")


def _choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise SettingsError(f"--{name.replace('_', '-')} must be one of {', '.join(choices)}; got {value!r}")


@dataclass(frozen=True, kw_only=True)
class ScanOptions:
    """What turns a source into a samples table. `tokenizer` is a path or None (built-in byte level)."""

    format: str = "auto"
    tokenizer: str | None = None
    sequence_len: int = 4096
    long: str = "drop"
    shift: str = "sample"
    add_eos: bool = True

    def __post_init__(self) -> None:
        _choice("format", self.format, FORMATS)
        _choice("long", self.long, LONG_POLICIES)
        _choice("shift", self.shift, SHIFTS)
        _positive("sequence_len", self.sequence_len)


@dataclass(frozen=True, kw_only=True)
class PlanSettings:
    """Every setting that changes a plan computed from a samples table."""

    mode: str = "packed"
    micro_batch_size: int = 1
    sequence_len: int = 4096
    real_batches: bool = False
    pad_multiple: int = 1
    world_size: int = 1
    grad_accum: int = 1
    drop_last: bool = False
    seed: int = 0
    epochs: int = 1
    shift: str = "sample"
    balance: bool = True
    balance_window: int = 64
    balance_passes: int = 4

    def __post_init__(self) -> None:
        _choice("mode", self.mode, MODES)
        _choice("shift", self.shift, SHIFTS)
        for name in ("micro_batch_size", "sequence_len", "pad_multiple", "world_size", "grad_accum", "epochs",
                     "balance_window", "balance_passes"):
            _positive(name, getattr(self, name))
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed < 2**63:
            raise SettingsError(f"--seed must be an integer in [0, 2**63), got {self.seed!r}")
        if self.balance_window > 64:
            raise SettingsError(f"--balance-window must be at most 64, got {self.balance_window}")
        if self.real_batches and self.mode != "packed":
            raise SettingsError("--real-batches only applies to --mode packed")

    @property
    def row_capacity(self) -> int:
        """Most tokens one row may hold: a packed row of `micro_batch_size * sequence_len` (or `sequence_len` with
        real batches), a flattened row of `micro_batch_size` samples, a padded row of one sample."""
        if (self.mode == "packed" and not self.real_batches) or self.mode == "flattened":
            return self.micro_batch_size * self.sequence_len
        return self.sequence_len

    @property
    def max_sample_len(self) -> int:
        """Longest sample a plan can place: a whole packed row, else one `sequence_len`."""
        return self.row_capacity if self.mode == "packed" else self.sequence_len

    @property
    def batches_per_update(self) -> int:
        return self.world_size * self.grad_accum

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def canonical_hash(obj: dict[str, Any]) -> str:
    """Stable hex digest of a JSON-able mapping: sorted keys, no whitespace."""
    return hashlib.blake2b(orjson.dumps(obj, option=orjson.OPT_SORT_KEYS), digest_size=16).hexdigest()


def load_config_file(path: str | Path) -> dict[str, Any]:
    """Read a TOML or YAML config file into a flat mapping of setting names (dashes or underscores)."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise SettingsError(f"cannot read config file {p}: {exc.strerror}") from None
    try:
        if p.suffix.lower() == ".toml":
            data = tomllib.loads(text)
        elif p.suffix.lower() in (".yaml", ".yml"):
            import yaml

            data = yaml.safe_load(text) or {}
        else:
            raise SettingsError(f"config file {p} must end in .toml, .yaml or .yml")
    except (tomllib.TOMLDecodeError, ValueError) as exc:
        if isinstance(exc, SettingsError):
            raise
        raise SettingsError(f"config file {p} is not valid: {exc}") from None
    except Exception as exc:  # yaml.YAMLError has no common base we import eagerly
        raise SettingsError(f"config file {p} is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise SettingsError(f"config file {p} must hold a mapping of settings")
    known = {f.name for f in fields(PlanSettings)} | {f.name for f in fields(ScanOptions)} | {"num_proc"}
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = str(key).replace("-", "_")
        if name not in known:
            raise SettingsError(f"config file {p}: unknown setting {key!r}")
        out[name] = value
    return out

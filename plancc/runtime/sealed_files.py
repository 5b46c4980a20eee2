"""The checkpoint's files: written whole or not at all (temporary sibling, fsync, rename, fsync of the directory),
JSON sealed with a checksum of its content, tensors read with `weights_only=True`. `plancc.runtime.checkpoint`
lays them out per step and rank; an edit or damage found here is a `CheckpointError` naming the file."""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import torch

from plancc.errors import CheckpointError
from plancc.store.atomic import fsync_dir


class Sha256Writer:
    """A write-only file wrapper that counts and hashes what passes through (what `torch.save` needs)."""

    def __init__(self, f: IO[bytes]):
        self.f, self.sha, self.size = f, hashlib.sha256(), 0

    def write(self, data) -> int:
        """Hash, count and pass on `data`."""
        self.sha.update(data)
        self.size += len(data)
        return self.f.write(data)

    def flush(self) -> None:
        """Flush the wrapped file."""
        self.f.flush()


def atomic_write(path: str | Path, write: Callable[[IO[bytes]], None], *,
                 before_rename: Callable[[], None] | None = None) -> None:
    """Write `path` through `write(file)`: temporary sibling, flush, fsync, rename, fsync of the directory.

    Readers see the old file or the whole new one, never a part. On an error the temporary file is removed.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex[:12]}")
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        if before_rename is not None:
            before_rename()
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def write_json_atomic(path: str | Path, obj: Any, **kwargs: Any) -> None:
    """Write `obj` as JSON to `path` through a fsynced temporary sibling and a rename."""
    atomic_write(path, lambda f: f.write(json.dumps(obj, indent=1).encode() + b"\n"), **kwargs)


def _checksum(obj: dict[str, Any]) -> str:
    """sha256 of `obj`'s canonical JSON without its `checksum` field."""
    rest = {k: v for k, v in obj.items() if k != "checksum"}
    return hashlib.sha256(json.dumps(rest, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def write_sealed_json(path: str | Path, obj: dict[str, Any], **kwargs: Any) -> None:
    """`write_json_atomic` of `obj` plus its `checksum` (what `read_sealed_json` checks)."""
    write_json_atomic(path, {**obj, "checksum": _checksum(obj)}, **kwargs)


def read_sealed_json(path: str | Path) -> dict[str, Any]:
    """A JSON object written by `write_sealed_json`; CheckpointError when it is unreadable, not an object, or its
    content does not match its checksum (edited or damaged)."""
    try:
        obj = json.loads(Path(path).read_bytes())
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{path} is unreadable ({e})") from None
    if not isinstance(obj, dict):
        raise CheckpointError(f"{path}: not a JSON object")
    if "checksum" not in obj:
        raise CheckpointError(f"{path}: checksum: missing (written by an older plancc, or edited)")
    if obj["checksum"] != _checksum(obj):
        raise CheckpointError(f"{path}: checksum: its content does not match it (the file was edited or damaged)")
    return obj


def load_tensors(path: str | Path, map_location: Any = None) -> Any:
    """`torch.load(weights_only=True)` with a clear error for a truncated, damaged or hostile file (a pickle that
    would run code is refused, never run)."""
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:  # hostile bytes fail in many ways (pickle.UnpicklingError for code); all are damage
        size = os.path.getsize(path) if os.path.exists(path) else None
        first = (str(e).splitlines() or [type(e).__name__])[0]
        raise CheckpointError(f"{path}: not a readable tensor checkpoint ({size} bytes; truncated or damaged?): "
                              f"{first}") from None

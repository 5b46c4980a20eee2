"""The one canonical digest of a JSON-able mapping: what the scan cache key, the config fingerprint and the recipe
token store's key are made of, so the same settings give the same hash in every process and on every machine."""

from __future__ import annotations

import hashlib
from typing import Any

import orjson


def canonical_hash(obj: dict[str, Any]) -> str:
    """Stable hex digest of a JSON-able mapping: sorted keys, no whitespace."""
    return hashlib.blake2b(orjson.dumps(obj, option=orjson.OPT_SORT_KEYS), digest_size=16).hexdigest()

"""Build keys: sha256 over canonical JSON. Every toolchain version goes into the key."""

from __future__ import annotations

import hashlib
import json
from typing import Any

# Bump when the artifact layout or manifest meaning changes, so old keys never alias new artifacts.
ARTIFACT_FORMAT_VERSION = 1


def canonical_json(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


def build_key(fields: dict[str, Any]) -> str:
    """The key of an artifact. `fields` must describe only the artifact, never the host that builds it."""
    return hashlib.sha256(canonical_json({"artifact_format": ARTIFACT_FORMAT_VERSION, **fields})).hexdigest()


def short(key: str | None, length: int = 12) -> str:
    return key[:length] if key else "-"

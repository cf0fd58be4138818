"""Canonical JSON: one byte-exact rendering of a value, so hashes and files are stable."""

from __future__ import annotations

import hashlib
import json
from typing import Any


def canonical_json(data: Any) -> str:
    """Render `data` as sorted-key, 2-space-indented JSON with a trailing newline.

    This is the on-disk form of state files: diffs of two versions stay readable and a
    re-serialisation of parsed content is byte-identical.
    """
    return json.dumps(data, sort_keys=True, indent=2, ensure_ascii=False, allow_nan=False) + "\n"


def compact_json(data: Any) -> str:
    """Render `data` as sorted-key JSON without whitespace (the input of content hashes)."""
    return json.dumps(
        data, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )


def spec_hash(spec: Any) -> str:
    """Return the hex sha256 of the compact canonical JSON of `spec`; stable across key order."""
    return hashlib.sha256(compact_json(spec).encode("utf-8")).hexdigest()

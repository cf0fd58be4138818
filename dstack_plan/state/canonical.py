"""Canonical JSON: one byte-exact rendering of a value, so hashes and files are stable.

orjson renders it: a 10,000-resource state is hashed on every read and written after every
resource an apply changes, and the standard library's encoder is five to ten times slower.
"""

from __future__ import annotations

import hashlib
import math
from typing import Any

import orjson

_SORTED = orjson.OPT_SORT_KEYS
_SORTED_INDENTED = orjson.OPT_SORT_KEYS | orjson.OPT_INDENT_2


def canonical_json(data: Any) -> str:
    """Render `data` as sorted-key, 2-space-indented JSON with a trailing newline.

    This is the on-disk form of state files: diffs of two versions stay readable and a
    re-serialisation of parsed content is byte-identical. Raises ValueError for what JSON
    cannot hold (NaN, infinities, non-string keys, other types).
    """
    try:
        rendered = orjson.dumps(data, option=_SORTED_INDENTED)
    except orjson.JSONEncodeError as err:
        raise ValueError(f"not JSON: {err}") from None
    # orjson writes NaN and infinities as null; a state must not change a value silently
    if b"null" in rendered and _has_non_finite(data):
        raise ValueError("not JSON: NaN and infinities have no JSON form")
    return rendered.decode("utf-8") + "\n"


def compact_json(data: Any) -> bytes:
    """Render `data` as sorted-key UTF-8 JSON without whitespace (the input of content hashes).

    NaN and infinities render as null here, unchecked: hashing runs for every resource of
    every state read, and neither configs nor state files can hold them (`canonical_json`,
    which writes the files, refuses them).
    """
    try:
        return orjson.dumps(data, option=_SORTED)
    except orjson.JSONEncodeError as err:
        raise ValueError(f"not JSON: {err}") from None


def spec_hash(spec: Any) -> str:
    """Return the hex sha256 of the compact canonical JSON of `spec`; stable across key order."""
    return hashlib.sha256(compact_json(spec)).hexdigest()


def _has_non_finite(data: Any) -> bool:
    if isinstance(data, float):
        return not math.isfinite(data)
    if isinstance(data, dict):
        return any(_has_non_finite(v) for v in data.values())
    if isinstance(data, list | tuple):
        return any(_has_non_finite(v) for v in data)
    return False

"""What Compute Engine allows as names and label values, for instances (`provider.py`) and
disks (`disks.py`) alike."""

from __future__ import annotations

import re
import secrets

_LABEL = re.compile(r"[^a-z0-9_-]+")


def label(value: str) -> str:
    """`value` as a GCP label value allows (lowercase, digits, `_`, `-`, at most 63)."""
    return _LABEL.sub("-", value.lower())[:63]


def vm_name(fleet: str, n: int) -> str:
    """A unique instance name for node `n` of `fleet` (a letter first, at most 63 chars)."""
    suffix = f"-{n}-{secrets.token_hex(3)}"
    base = re.sub(r"[^a-z0-9-]+", "-", fleet.lower()).strip("-") or "fleet"
    if not base[0].isalpha():
        base = "f-" + base
    return base[: 63 - len(suffix)] + suffix

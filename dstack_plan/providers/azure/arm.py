"""What Azure Resource Manager's SDK calls share, for VMs (`provider.py`) and managed disks
(`disks.py`) alike: building request models, and reading capacity errors."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

CAPACITY_CODES = frozenset(
    "QuotaExceeded SpotQuotaExceeded SkuNotAvailable AllocationFailed ZonalAllocationFailed "
    "OverconstrainedAllocationRequest OverconstrainedZonalAllocationRequest".split()
)
"""Also OperationNotAllowed when its message is about quota (`capacity_code`)."""


def capacity_code(e: Any) -> str | None:
    """The capacity or quota code of an ARM error (or of one of its details), else None."""
    error = getattr(e, "error", None)
    for err in [error, *(getattr(error, "details", None) or [])]:
        code = str(getattr(err, "code", None) or "")
        message = str(getattr(err, "message", None) or "")
        if code in CAPACITY_CODES or (
            code == "OperationNotAllowed" and "quota" in message.lower()
        ):
            return code
    return None


def arm_model(cls: Callable[..., T], **fields: Any) -> T:
    """`cls(**fields)`, a model's `properties` given as flattened keywords: what every SDK
    version of the `azure` extra takes, though the newer ones' typed overloads name only
    `properties`."""
    return cls(**fields)

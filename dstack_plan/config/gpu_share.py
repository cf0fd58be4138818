"""GPU shares: part of one GPU, written `25%`, `12.5%` or `0.25`, kept in thousandths;
their parsing and printing, and what a share asks of the rest of a `gpu:` spec (one GPU).

An extension (dstack has no shared GPUs). The forms were chosen so that no valid dstack config
changes meaning: dstack rejects a `%` part in the `gpu:` shorthand and a fractional `gpu:`
number, so both were free. Thousandths (0.1%) are as fine as anyone divides a GPU, and an
integer keeps sums of shares exact.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal, InvalidOperation
from typing import Any

from dstack_plan.config.base import ItemError
from dstack_plan.config.ranges import CountRange
from dstack_plan.config.spec_text import parse_range
from dstack_plan.config.units import SPACE, anchored, describe

__all__ = [
    "NO_TOTAL_MEMORY",
    "ONE_GPU",
    "SHARE_FRAGMENT",
    "SHARE_HELP",
    "SHARE_SCHEMA",
    "WHOLE",
    "check_one_gpu",
    "format_share",
    "fraction_schema",
    "is_share_text",
    "one_gpu",
    "parse_share",
    "share_fields",
]

SHARE_HELP = (
    "a share is part of one GPU: a percentage below 100% such as 25%, "
    "or a fraction below 1 such as 0.25"
)
"""What a share is, said by every share error."""

SHARE_FRAGMENT = rf"\d+(?:\.\d+)?{SPACE}%"
"""JSON Schema pattern fragment of a percentage part (`25%`, `12.5%`)."""

_PERCENT_RE = re.compile(rf"{SPACE}(\d+(?:\.\d+)?){SPACE}%{SPACE}", re.ASCII)
_MAX_TEXT = 24  # no valid percentage is longer; bounds the work on hostile input
WHOLE = 1000
"""A whole GPU, in thousandths: the unit of shares (the scheduler and the agent count in it)."""


def fraction_schema() -> dict[str, Any]:
    """JSON Schema of a fraction of one GPU: a number strictly between 0 and 1."""
    return {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1}


SHARE_SCHEMA: dict[str, Any] = {
    "anyOf": [fraction_schema(), {"type": "string", "pattern": anchored(SHARE_FRAGMENT)}]
}
"""JSON Schema of the mapping form's `share:` value."""


def is_share_text(part: str) -> bool:
    """Whether a shorthand part is meant as a share (it ends with `%`)."""
    return part.endswith("%")


def _thousandths(value: object) -> Decimal | None:
    """The value in thousandths of a GPU, unchecked; None when it is no share form at all."""
    if isinstance(value, str):
        match = _PERCENT_RE.fullmatch(value) if len(value) <= _MAX_TEXT else None
        return None if match is None else Decimal(match[1]) * 10
    if isinstance(value, float) and math.isfinite(value):
        try:
            # repr is the shortest text that reads back as this float: 0.1 is 0.1, not 0.1000...
            return Decimal(repr(value)) * WHOLE
        except InvalidOperation:  # pragma: no cover - repr of a finite float always parses
            return None
    if isinstance(value, int) and not isinstance(value, bool):
        return Decimal(WHOLE if value > 0 else 0)  # any integer is out of range
    return None


def parse_share(what: str, value: object) -> int:
    """Thousandths of one GPU (1..999) from `25%`, `"12.5%"` or a fraction `0 < x < 1`.

    `what` names the enclosing spec in the message; raises ValueError saying what a share is.
    """
    amount = _thousandths(value)
    shown = describe(value)
    if amount is None:
        raise ValueError(
            f"invalid {what}: share {shown} is not a percentage or fraction; {SHARE_HELP}"
        )
    if not 0 < amount < WHOLE:
        raise ValueError(f"invalid {what}: share {shown} is out of range; {SHARE_HELP}")
    if amount != amount.to_integral_value():
        raise ValueError(f"invalid {what}: share {shown} is finer than 0.1%; {SHARE_HELP}")
    return int(amount)


def format_share(thousandths: int) -> str:
    """The canonical percentage: 250 -> `25%`, 125 -> `12.5%`, 5 -> `0.5%`."""
    whole, tenth = divmod(thousandths, 10)
    return f"{whole}.{tenth}%" if tenth else f"{whole}%"


# --- a share and the rest of the spec -------------------------------------------------------

ONE_GPU = CountRange(min=1, max=1)
"""The count of every spec with a share."""

NO_TOTAL_MEMORY = (
    "invalid gpu spec: a GPU share is part of one GPU, so total_memory does not apply; "
    "use memory to ask for the memory of that GPU"
)


def check_one_gpu(what: str, count: CountRange) -> None:
    """Refuse a count other than exactly 1 beside a share."""
    if count != ONE_GPU:
        raise ValueError(
            f"invalid {what}: a GPU share is part of one GPU: count must be 1, got {count}"
        )


def one_gpu(what: str, count: CountRange | None) -> CountRange:
    """The count of a spec with a share: exactly 1, implied when not given."""
    if count is None:
        return ONE_GPU
    check_one_gpu(what, count)
    return count


def share_fields(what: str, fields: dict[str, Any]) -> None:
    """Parse a mapping's `share` in place, check and imply its count; errors name their key."""
    try:
        fields["share"] = parse_share(what, fields["share"])
    except ValueError as error:
        raise ItemError(str(error), "share") from None
    if fields.get("total_memory") is not None:
        raise ItemError(NO_TOTAL_MEMORY, "total_memory")
    if fields.get("count") is None:
        fields["count"] = ONE_GPU
        return
    try:
        count = parse_range(CountRange, fields["count"])
    except ValueError:
        return  # pydantic reports a bad count at its key
    try:
        fields["count"] = one_gpu(what, count)
    except ValueError as error:
        raise ItemError(str(error), "count") from None

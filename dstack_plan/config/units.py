"""The units grammar of the config language: durations, memory sizes and counts.

Every parser raises `ValueError` (never another exception type) with a message that names the
bad value and the accepted forms, so pydantic reports it at the offending key. Every type prints
in one canonical form, and parsing that form gives the same value back, so state and plans
store a compact, normalised representation and re-applying an unchanged file is a no-op.
"""

from __future__ import annotations

import functools
import math
import re
from typing import Annotated, Any, Literal

from pydantic import (
    PlainSerializer,
    PlainValidator,
    WithJsonSchema,
)

from dstack_plan.config.described import Described

__all__ = [
    "OFF",
    "Count",
    "Duration",
    "IdleDuration",
    "Memory",
    "OffableDuration",
    "describe",
    "format_duration",
    "format_memory",
    "parse_count",
    "parse_duration",
    "parse_idle_duration",
    "parse_memory",
    "parse_offable_duration",
]

OFF: Literal["off"] = "off"
"""The canonical value of a duration that is switched off."""

# Values beyond 2**53 cannot round-trip through JSON numbers in other languages; nobody needs
# more seconds, vCPUs or gigabytes than that, and the bound keeps float conversion exact.
MAX_INT = 2**53 - 1
# Longer strings cannot be a valid value; rejecting them early keeps parsing O(1).
MAX_TEXT = 100

# Regex fragments are written with explicit case classes and no inline flags, so the same text
# serves Python's `re` (with re.ASCII, so `\d` is 0-9 as in ECMA-262) and JSON Schema patterns.
SPACE = r"\s*"
DIGITS_FRAGMENT = r"\d+"
_NUMBER = r"\d+(?:\.\d+)?(?:[eE][+-]?\d+)?"
_MEM_UNIT = r"[mMgGtT][bB]"
DURATION_FRAGMENT = rf"{DIGITS_FRAGMENT}{SPACE}[sSmMhHdDwW]?"
MEMORY_FRAGMENT = rf"{_NUMBER}{SPACE}(?:{_MEM_UNIT})?"
_OFF_FRAGMENT = r"[oO][fF][fF]|[fF][aA][lL][sS][eE]"

_DURATION_RE = re.compile(rf"{SPACE}({DIGITS_FRAGMENT}){SPACE}([sSmMhHdDwW]?){SPACE}", re.ASCII)
_MEMORY_RE = re.compile(rf"{SPACE}({_NUMBER}){SPACE}({_MEM_UNIT})?{SPACE}", re.ASCII)
_COUNT_RE = re.compile(rf"{SPACE}({DIGITS_FRAGMENT}){SPACE}", re.ASCII)

_UNIT_SECONDS = {"w": 604800, "d": 86400, "h": 3600, "m": 60, "s": 1}
_UNIT_GB = {"mb": 1 / 1024, "gb": 1.0, "tb": 1024.0}


def anchored(fragment: str) -> str:
    """Return a JSON Schema pattern that matches exactly `fragment`, whitespace around it."""
    return rf"^{SPACE}(?:{fragment}){SPACE}$"


_PRINTED: dict[int, tuple[object, str]] = {}
_PRINTED_MAX = 4096


def printed(value: object) -> str:
    """`str(value)` of a frozen value, remembered for the very same object.

    Ranges and resource specs parsed from text are cached and shared by every config that
    writes the same text, and the defaults are shared too; a plan prints (normalises) each of
    them once per resource. The entry keeps its object alive, so its id cannot be reused.
    """
    hit = _PRINTED.get(id(value))
    if hit is not None and hit[0] is value:
        return hit[1]
    text = str(value)
    if len(_PRINTED) < _PRINTED_MAX:
        _PRINTED[id(value)] = (value, text)
    return text


def describe(value: object) -> str:
    """Show a user's value in an error message: short, YAML-flavoured, never raising."""
    if isinstance(value, str):
        text = str(value)  # YAML loaders hand out str subclasses with their own repr
        return repr(text if len(text) <= 40 else text[:37] + "...")
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        # repr() of a huge int is slow and raises past 4300 digits.
        return repr(value) if abs(value) < 10**30 else "a very large integer"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, (list, tuple)):
        return "a list"
    return f"a value of type {type(value).__name__}"


def _integral(value: object) -> int | None:
    """Return `value` as an int when it is an int or an integral float (not a bool)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        # Floats of MAX_INT magnitude and beyond are rejected by the callers' range check;
        # int() of a finite float never raises.
        return int(value)
    return None


# --- durations ------------------------------------------------------------------------------

_DURATION_FORMS = "seconds or a number with unit s, m, h, d or w (e.g. 90s, 2h)"


def _duration_error(value: object, forms: str = _DURATION_FORMS) -> ValueError:
    return ValueError(f"invalid duration {describe(value)}: expected {forms}")


def _whole_seconds(value: object) -> int | None:
    """`value` as whole seconds when it is a number (not a bool); None otherwise.

    dstack's parser takes a fractional number of seconds and drops the fraction (`1.9` is
    1 second), so a file it accepts means the same here.
    """
    if isinstance(value, float) and math.isfinite(value):
        return int(value)  # toward zero, as dstack's int(); never raises for a finite float
    return _integral(value)


def _parse_seconds(value: object, forms: str) -> int:
    number = _whole_seconds(value)
    if number is not None:
        if number < 0:
            raise ValueError(f"invalid duration {describe(value)}: must not be negative")
        if number > MAX_INT:
            raise ValueError(f"invalid duration {describe(value)}: too large")
        return number
    if isinstance(value, str) and len(value) <= MAX_TEXT:
        match = _DURATION_RE.fullmatch(value)
        if match is not None:
            seconds = int(match[1]) * _UNIT_SECONDS[match[2].lower() or "s"]
            if seconds > MAX_INT:
                raise ValueError(f"invalid duration {describe(value)}: too large")
            return seconds
    raise _duration_error(value, forms)


def parse_duration(value: object) -> int:
    """Parse a duration (seconds as a number, or `<int><unit>` with unit s m h d w) into
    seconds; a fraction of a second is dropped."""
    return _parse_seconds(value, _DURATION_FORMS)


_OFFABLE_FORMS = f"{_DURATION_FORMS}, or off"
_OFF_WORDS = frozenset({"off", "false"})


def parse_offable_duration(value: object) -> int | Literal["off"] | None:
    """Parse a duration that may be switched off.

    `off` / `false` give `"off"`; `true` (and null) give None, meaning "use the default";
    anything else is a duration in seconds.
    """
    if value is False:
        return OFF
    if value is True or value is None:
        return None
    if isinstance(value, str) and value.strip().lower() in _OFF_WORDS:
        return OFF
    return _parse_seconds(value, _OFFABLE_FORMS)


_IDLE_FORMS = f"{_DURATION_FORMS}, or off (also false or a negative number)"
_NEGATIVE_RE = re.compile(rf"{SPACE}-{DIGITS_FRAGMENT}{SPACE}", re.ASCII)


def parse_idle_duration(value: object) -> int | Literal["off"] | None:
    """Parse an idle-style duration: `off`, `false` and any negative number (dstack's old
    spelling of off, `-1` most often) give `"off"`; `true` (and null) give None, meaning
    "use the default", as in dstack."""
    if value is False:
        return OFF
    if value is True or value is None:
        return None
    if isinstance(value, str):
        if value.strip().lower() in _OFF_WORDS:
            return OFF
        if len(value) <= MAX_TEXT and _NEGATIVE_RE.fullmatch(value):
            return OFF
    else:
        number = _whole_seconds(value)
        if number is not None and number < 0:
            return OFF
    return _parse_seconds(value, _IDLE_FORMS)


@functools.lru_cache(maxsize=1024, typed=True)
def format_duration(value: int | str | None) -> str | None:
    """Print seconds in the largest unit that divides them exactly (120 -> `2m`)."""
    if value is None or isinstance(value, str):
        return value
    if value == 0:
        return "0s"
    for unit, seconds in _UNIT_SECONDS.items():
        if value % seconds == 0:
            return f"{value // seconds}{unit}"
    raise AssertionError("unreachable: every int is a multiple of 1 second")


_DURATION_SCHEMA: dict[str, Any] = {
    "anyOf": [
        {"type": "number", "minimum": 0},
        {"type": "string", "pattern": anchored(DURATION_FRAGMENT)},
    ]
}
_OFFABLE_SCHEMA: dict[str, Any] = {
    "anyOf": [
        *_DURATION_SCHEMA["anyOf"],
        {"type": "string", "pattern": anchored(_OFF_FRAGMENT)},
        {"type": "boolean"},
        {"type": "null"},
    ]
}
_IDLE_SCHEMA: dict[str, Any] = {
    "anyOf": [
        {"type": "number"},
        {"type": "string", "pattern": anchored(DURATION_FRAGMENT)},
        {"type": "string", "pattern": anchored(rf"{_OFF_FRAGMENT}|-{DIGITS_FRAGMENT}")},
        {"type": "boolean"},
        {"type": "null"},
    ]
}
_DURATION_SERIALIZER = PlainSerializer(format_duration, return_type=str)
_DURATION_WORDS = Described("a duration such as 90s or 2h", "durations such as 90s or 2h")

Duration = Annotated[
    int,
    PlainValidator(parse_duration),
    _DURATION_SERIALIZER,
    _DURATION_WORDS,
    WithJsonSchema(_DURATION_SCHEMA),
]
"""Seconds; accepts `90`, `90s`, `2h`, `1d`, `1w`; prints `2m`, `1d`..."""

OffableDuration = Annotated[
    int | Literal["off"] | None,
    PlainValidator(parse_offable_duration),
    _DURATION_SERIALIZER,
    _DURATION_WORDS,
    WithJsonSchema(_OFFABLE_SCHEMA),
]
"""Seconds or `"off"` (from `off`/`false`); `true`/null validate to None ("use the default")."""

IdleDuration = Annotated[
    int | Literal["off"] | None,
    PlainValidator(parse_idle_duration),
    _DURATION_SERIALIZER,
    _DURATION_WORDS,
    WithJsonSchema(_IDLE_SCHEMA),
]
"""Seconds or `"off"` (from `off`, `false` or a negative number); `true`/null validate to None
("use the default")."""


# --- memory ---------------------------------------------------------------------------------

_MEMORY_FORMS = "a number of GB or a number with unit MB, GB or TB (e.g. 512MB, 8GB, 1TB)"


def parse_memory(value: object) -> float:
    """Parse a memory size into GB: bare numbers are GB; 1TB = 1024GB, 1MB = 1/1024 GB."""
    gb: float | None = None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            gb = float(value)
        except OverflowError:
            raise ValueError(f"invalid memory size {describe(value)}: too large") from None
    elif isinstance(value, str) and len(value) <= MAX_TEXT:
        match = _MEMORY_RE.fullmatch(value)
        if match is not None:
            # Scaling by a power of two is exact, which keeps parse(format(x)) == x.
            gb = float(match[1]) * _UNIT_GB[(match[2] or "gb").lower()]
    if gb is None:
        raise ValueError(f"invalid memory size {describe(value)}: expected {_MEMORY_FORMS}")
    if not math.isfinite(gb):
        raise ValueError(f"invalid memory size {describe(value)}: must be a finite number")
    if gb < 0:
        raise ValueError(f"invalid memory size {describe(value)}: must not be negative")
    return gb


# Whole numbers below this print as integers; larger ones as repr() floats, which is exact too.
_INT_PRINT_LIMIT = 1e15


def format_memory(gb: float | None) -> str | None:
    """Print GB canonically: whole TB as `NTB`, whole GB as `NGB`, whole MB as `NMB`.

    Anything else prints as the shortest exact float in GB (`0.3GB`), so parsing the printed
    form always gives the same float back.
    """
    if gb is None:
        return None
    if gb == 0:
        return "0GB"
    if gb % 1024 == 0 and gb < _INT_PRINT_LIMIT:
        return f"{int(gb) // 1024}TB"
    if gb.is_integer() and gb < _INT_PRINT_LIMIT:
        return f"{int(gb)}GB"
    mb = gb * 1024
    if mb.is_integer() and mb < _INT_PRINT_LIMIT:
        return f"{int(mb)}MB"
    return f"{gb!r}GB"


MEMORY_SCHEMA: dict[str, Any] = {
    "anyOf": [
        {"type": "number", "minimum": 0},
        {"type": "string", "pattern": anchored(MEMORY_FRAGMENT)},
    ]
}

Memory = Annotated[
    float,
    PlainValidator(parse_memory),
    PlainSerializer(format_memory, return_type=str),
    WithJsonSchema(MEMORY_SCHEMA),
    Described("a size such as 512MB, 8GB or 1TB", "sizes such as 8GB"),
]
"""GB as a float; accepts `8`, `8GB`, `512MB`, `1TB`; prints `8GB`, `512MB`, `1TB`."""


# --- counts ---------------------------------------------------------------------------------

_COUNT_FORMS = "a non-negative integer"


def parse_count(value: object) -> int:
    """Parse a non-negative integer count (an int, an integral float or a digit string)."""
    number = _integral(value)
    if number is None and isinstance(value, str) and len(value) <= MAX_TEXT:
        match = _COUNT_RE.fullmatch(value)
        if match is not None:
            number = int(match[1])
    if number is None:
        raise ValueError(f"invalid count {describe(value)}: expected {_COUNT_FORMS}")
    if number < 0:
        raise ValueError(f"invalid count {describe(value)}: must not be negative")
    if number > MAX_INT:
        raise ValueError(f"invalid count {describe(value)}: too large")
    return number


COUNT_SCHEMA: dict[str, Any] = {
    "anyOf": [
        {"type": "integer", "minimum": 0},
        {"type": "string", "pattern": anchored(DIGITS_FRAGMENT)},
    ]
}

Count = Annotated[
    int,
    PlainValidator(parse_count),
    WithJsonSchema(COUNT_SCHEMA),
    Described("a non-negative integer", "non-negative integers"),
]
"""A non-negative integer; accepts `4` and `"4"`."""

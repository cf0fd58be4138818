"""The units grammar of the config language: durations, memory sizes and ranges.

Every parser raises `ValueError` (never another exception type) with a message that names the
bad value and the accepted forms, so pydantic reports it at the offending key. Every type prints
in one canonical form, and parsing that form gives the same value back, so state and plans
store a compact, normalised representation and re-applying an unchanged file is a no-op.
"""

from __future__ import annotations

import functools
import math
import re
from typing import Annotated, Any, ClassVar, Generic, Literal, NamedTuple, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    ModelWrapValidatorHandler,
    PlainSerializer,
    PlainValidator,
    WithJsonSchema,
    model_serializer,
    model_validator,
)
from pydantic.json_schema import GetJsonSchemaHandler, JsonSchemaValue
from pydantic_core import CoreSchema
from typing_extensions import Self

__all__ = [
    "OFF",
    "Count",
    "CountRange",
    "Duration",
    "IdleDuration",
    "Memory",
    "MemoryRange",
    "OffableDuration",
    "Range",
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
_MAX_TEXT = 100

# Regex fragments are written with explicit case classes and no inline flags, so the same text
# serves Python's `re` (with re.ASCII, so `\d` is 0-9 as in ECMA-262) and JSON Schema patterns.
_S = r"\s*"
_DIGITS = r"\d+"
_NUMBER = r"\d+(?:\.\d+)?(?:[eE][+-]?\d+)?"
_MEM_UNIT = r"[mMgGtT][bB]"
DURATION_FRAGMENT = rf"{_DIGITS}{_S}[sSmMhHdDwW]?"
MEMORY_FRAGMENT = rf"{_NUMBER}{_S}(?:{_MEM_UNIT})?"
_OFF_FRAGMENT = r"[oO][fF][fF]|[fF][aA][lL][sS][eE]"

_DURATION_RE = re.compile(rf"{_S}({_DIGITS}){_S}([sSmMhHdDwW]?){_S}", re.ASCII)
_MEMORY_RE = re.compile(rf"{_S}({_NUMBER}){_S}({_MEM_UNIT})?{_S}", re.ASCII)
_COUNT_RE = re.compile(rf"{_S}({_DIGITS}){_S}", re.ASCII)

_UNIT_SECONDS = {"w": 604800, "d": 86400, "h": 3600, "m": 60, "s": 1}
_UNIT_GB = {"mb": 1 / 1024, "gb": 1.0, "tb": 1024.0}


def anchored(fragment: str) -> str:
    """Return a JSON Schema pattern that matches exactly `fragment`, whitespace around it."""
    return rf"^{_S}(?:{fragment}){_S}$"


def range_fragment(item: str) -> str:
    """Return the regex fragment of a range over `item`: `N`, `A..B`, `A..` or `..B`."""
    return rf"(?:{item}(?:{_S}\.\.(?:{_S}{item})?)?|\.\.{_S}{item})"


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


def _parse_seconds(value: object, forms: str) -> int:
    number = _integral(value)
    if number is not None:
        if number < 0:
            raise ValueError(f"invalid duration {describe(value)}: must not be negative")
        if number > MAX_INT:
            raise ValueError(f"invalid duration {describe(value)}: too large")
        return number
    if isinstance(value, str) and len(value) <= _MAX_TEXT:
        match = _DURATION_RE.fullmatch(value)
        if match is not None:
            seconds = int(match[1]) * _UNIT_SECONDS[match[2].lower() or "s"]
            if seconds > MAX_INT:
                raise ValueError(f"invalid duration {describe(value)}: too large")
            return seconds
    raise _duration_error(value, forms)


def parse_duration(value: object) -> int:
    """Parse a duration (int seconds, or `<int><unit>` with unit s m h d w) into seconds."""
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


_IDLE_FORMS = f"{_DURATION_FORMS}, or off (also false or -1)"


def parse_idle_duration(value: object) -> int | Literal["off"]:
    """Parse an idle-style duration: `off`, `false` and `-1` all give `"off"`."""
    if value is False:
        return OFF
    if isinstance(value, str):
        word = value.strip().lower()
        if word in _OFF_WORDS or word == "-1":
            return OFF
    elif _integral(value) == -1:
        return OFF
    if value is True:
        raise _duration_error(value, _IDLE_FORMS)
    number = _integral(value)
    if number is not None and number < 0:
        raise ValueError(
            f"invalid duration {describe(value)}: must not be negative (-1 means off)"
        )
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
        {"type": "integer", "minimum": 0},
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
        {"type": "integer", "minimum": -1},
        {"type": "string", "pattern": anchored(DURATION_FRAGMENT)},
        {"type": "string", "pattern": anchored(rf"{_OFF_FRAGMENT}|-1")},
        {"const": False},
    ]
}
_DURATION_SERIALIZER = PlainSerializer(format_duration, return_type=str)

Duration = Annotated[
    int,
    PlainValidator(parse_duration),
    _DURATION_SERIALIZER,
    WithJsonSchema(_DURATION_SCHEMA),
]
"""Seconds; accepts `90`, `90s`, `2h`, `1d`, `1w`; prints `2m`, `1d`..."""

OffableDuration = Annotated[
    int | Literal["off"] | None,
    PlainValidator(parse_offable_duration),
    _DURATION_SERIALIZER,
    WithJsonSchema(_OFFABLE_SCHEMA),
]
"""Seconds or `"off"` (from `off`/`false`); `true`/null validate to None ("use the default")."""

IdleDuration = Annotated[
    int | Literal["off"],
    PlainValidator(parse_idle_duration),
    _DURATION_SERIALIZER,
    WithJsonSchema(_IDLE_SCHEMA),
]
"""Seconds or `"off"` (from `off`, `false` or `-1`)."""


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
    elif isinstance(value, str) and len(value) <= _MAX_TEXT:
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
]
"""GB as a float; accepts `8`, `8GB`, `512MB`, `1TB`; prints `8GB`, `512MB`, `1TB`."""


# --- counts ---------------------------------------------------------------------------------

_COUNT_FORMS = "a non-negative integer"


def parse_count(value: object) -> int:
    """Parse a non-negative integer count (an int, an integral float or a digit string)."""
    number = _integral(value)
    if number is None and isinstance(value, str) and len(value) <= _MAX_TEXT:
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
        {"type": "string", "pattern": anchored(_DIGITS)},
    ]
}

Count = Annotated[
    int,
    PlainValidator(parse_count),
    WithJsonSchema(COUNT_SCHEMA),
]
"""A non-negative integer; accepts `4` and `"4"`."""


# --- ranges ---------------------------------------------------------------------------------

T = TypeVar("T", int, float)

_RANGE_SHAPES = "N, A..B, A.. or ..B"


class Range(BaseModel, Generic[T]):
    """An inclusive range with optional bounds; use `CountRange` or `MemoryRange`.

    Accepts `N` (exactly N), `A..B`, `A..`, `..B` (whitespace ignored) or a mapping
    `{min, max}`. An empty range (`..`) and min > max are errors. Prints as `2..8`, `24GB..`,
    `..4`, or `2` when min == max, and serialises to that string.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    min: T | None = None
    max: T | None = None

    _what: ClassVar[str] = "range"
    _forms: ClassVar[str] = _RANGE_SHAPES
    _regex: ClassVar[re.Pattern[str]]
    _json_schema: ClassVar[dict[str, Any]]

    @classmethod
    def _parse_item(cls, value: object) -> T:
        raise NotImplementedError("use CountRange or MemoryRange")

    @classmethod
    def _format_item(cls, value: T) -> str:
        raise NotImplementedError("use CountRange or MemoryRange")

    @classmethod
    def parse_bounds(cls, value: object) -> tuple[T | None, T | None]:
        """Parse any accepted form into `(min, max)`; raises ValueError."""
        if isinstance(value, Range):
            if isinstance(value, cls):
                return value.min, value.max
        elif isinstance(value, str):
            return cls._parse_text(value)
        elif isinstance(value, dict):
            return cls._parse_mapping(value)
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            item = cls._parse_item(value)
            return item, item
        raise cls._error(value)

    @classmethod
    def _error(cls, value: object, reason: str | None = None) -> ValueError:
        reason = reason or f"expected {cls._forms}"
        return ValueError(f"invalid {cls._what} {describe(value)}: {reason}")

    @classmethod
    def _parse_text(cls, text: str) -> tuple[T | None, T | None]:
        match = cls._regex.fullmatch(text) if len(text) <= _MAX_TEXT else None
        if match is None:
            raise cls._error(text)
        low, dots, high = match.group("min", "dots", "max")
        if dots is None:
            if low is None or high is not None:
                raise cls._error(text)
            item = cls._parse_item(low)
            return item, item
        if low is None and high is None:
            raise cls._error(text, f"a range needs at least one bound; expected {cls._forms}")
        bounds = (
            None if low is None else cls._parse_item(low),
            None if high is None else cls._parse_item(high),
        )
        cls._check_order(text, *bounds)
        return bounds

    @classmethod
    def _parse_mapping(cls, mapping: dict[Any, Any]) -> tuple[T | None, T | None]:
        unknown = [str(key) for key in mapping if key not in ("min", "max")]
        if unknown:
            raise cls._error(
                mapping, f"unknown key(s) {', '.join(sorted(unknown))}; expected min and/or max"
            )
        low, high = mapping.get("min"), mapping.get("max")
        if low is None and high is None:
            raise cls._error(mapping, "a range needs min, max or both")
        bounds = (
            None if low is None else cls._parse_item(low),
            None if high is None else cls._parse_item(high),
        )
        cls._check_order(mapping, *bounds)
        return bounds

    @classmethod
    def _check_order(cls, value: object, low: T | None, high: T | None) -> None:
        if low is not None and high is not None and low > high:
            reason = f"min {cls._format_item(low)} is greater than max {cls._format_item(high)}"
            raise cls._error(value, reason)

    @classmethod
    def parse(cls, value: object) -> Self:
        """Parse any accepted form into a range; raises ValueError (not ValidationError)."""
        if isinstance(value, cls):
            return value
        if isinstance(value, str):
            return _range_from_text(cls, str(value))
        return cls.model_validate(_Bounds(*cls.parse_bounds(value)))

    # A wrap validator runs before pydantic's own instance check, so it can hand back a
    # cached instance for a string it has seen (ranges are frozen, so sharing is safe).
    @model_validator(mode="wrap")
    @classmethod
    def _coerce(cls, value: Any, handler: ModelWrapValidatorHandler[Self]) -> Self:
        if isinstance(value, str):
            return _range_from_text(cls, str(value))
        if isinstance(value, cls):
            return value
        low, high = value if type(value) is _Bounds else cls.parse_bounds(value)
        return handler({"min": low, "max": high})

    @model_serializer(mode="plain")
    def _serialize(self) -> str:
        return printed(self)

    @classmethod
    def __get_pydantic_json_schema__(
        cls, core_schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        return dict(cls._json_schema)

    def __str__(self) -> str:
        if self.min is not None and self.min == self.max:
            return self._format_item(self.min)
        low = "" if self.min is None else self._format_item(self.min)
        high = "" if self.max is None else self._format_item(self.max)
        return f"{low}..{high}"

    def intersect(self, other: Range[T]) -> Range[T] | None:
        """Return the values in both ranges (same class as self), or None when none are."""
        lows = [b for b in (self.min, other.min) if b is not None]
        highs = [b for b in (self.max, other.max) if b is not None]
        low = max(lows) if lows else None
        high = min(highs) if highs else None
        if low is not None and high is not None and low > high:
            return None
        return type(self).model_validate(_Bounds(low, high))

    def contains(self, value: T) -> bool:
        """Whether `value` lies within the range (bounds inclusive)."""
        return (self.min is None or value >= self.min) and (self.max is None or value <= self.max)


class _Bounds(NamedTuple):
    """Bounds that were already parsed and checked, so validation takes them as they are."""

    min: Any
    max: Any


_R = TypeVar("_R", bound=Range[Any])


# Configs repeat the same few range strings, and the results are immutable: parse each once.
# Callers pass an exact str, so YAML loaders' str subclasses never become (or pin) cache keys.
@functools.lru_cache(maxsize=1024)
def _range_from_text(cls: type[_R], text: str) -> _R:
    return cls.model_validate(_Bounds(*cls._parse_text(text)))


def _range_regex(item: str) -> re.Pattern[str]:
    return re.compile(
        rf"{_S}(?P<min>{item})?{_S}(?P<dots>\.\.)?{_S}(?P<max>{item})?{_S}", re.ASCII
    )


def _range_schema(item_fragment: str, item_schema: dict[str, Any]) -> dict[str, Any]:
    bound = {"anyOf": [*item_schema["anyOf"], {"type": "null"}]}
    return {
        "anyOf": [
            item_schema["anyOf"][0],
            {"type": "string", "pattern": anchored(range_fragment(item_fragment))},
            {
                "type": "object",
                "properties": {"min": bound, "max": bound},
                "additionalProperties": False,
                "minProperties": 1,
            },
        ]
    }


class CountRange(Range[int]):
    """A range of non-negative integers (GPU or CPU counts): `2`, `1..8`, `2..`, `..4`."""

    _what: ClassVar[str] = "count range"
    _forms: ClassVar[str] = f"{_RANGE_SHAPES} with non-negative integers (e.g. 2, 1..8, 2..)"
    _regex: ClassVar[re.Pattern[str]] = _range_regex(_DIGITS)
    _json_schema: ClassVar[dict[str, Any]] = _range_schema(_DIGITS, COUNT_SCHEMA)

    @classmethod
    def _parse_item(cls, value: object) -> int:
        return parse_count(value)

    @classmethod
    def _format_item(cls, value: int) -> str:
        return str(value)


class MemoryRange(Range[float]):
    """A range of memory sizes in GB: `24GB`, `40GB..80GB`, `200GB..`, `..1TB`."""

    _what: ClassVar[str] = "memory range"
    _forms: ClassVar[str] = (
        f"{_RANGE_SHAPES} with sizes in MB, GB or TB (e.g. 24GB, 40GB..80GB, 200GB..)"
    )
    _regex: ClassVar[re.Pattern[str]] = _range_regex(MEMORY_FRAGMENT)
    _json_schema: ClassVar[dict[str, Any]] = _range_schema(MEMORY_FRAGMENT, MEMORY_SCHEMA)

    @classmethod
    def _parse_item(cls, value: object) -> float:
        return parse_memory(value)

    @classmethod
    def _format_item(cls, value: float) -> str:
        return format_memory(value) or ""

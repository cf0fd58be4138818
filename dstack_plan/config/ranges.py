"""Ranges in the config language: GPU and CPU counts (`1..8`) and memory sizes (`24GB..`).

Like the units they range over (`units`), every parser raises `ValueError` naming the bad value
and the accepted forms, and every range prints in one canonical form that parses back to it.
"""

from __future__ import annotations

import functools
import re
from typing import Any, ClassVar, Generic, NamedTuple, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    ModelWrapValidatorHandler,
    model_serializer,
    model_validator,
)
from pydantic.json_schema import GetJsonSchemaHandler, JsonSchemaValue
from pydantic_core import CoreSchema
from typing_extensions import Self

from dstack_plan.config.units import (
    COUNT_SCHEMA,
    DIGITS_FRAGMENT,
    MAX_TEXT,
    MEMORY_FRAGMENT,
    MEMORY_SCHEMA,
    SPACE,
    anchored,
    describe,
    format_memory,
    parse_count,
    parse_memory,
    printed,
)

__all__ = ["CountRange", "MemoryRange", "Range", "range_fragment"]


def range_fragment(item: str) -> str:
    """Return the regex fragment of a range over `item`: `N`, `A..B`, `A..` or `..B`."""
    return rf"(?:{item}(?:{SPACE}\.\.(?:{SPACE}{item})?)?|\.\.{SPACE}{item})"


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
        match = cls._regex.fullmatch(text) if len(text) <= MAX_TEXT else None
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
        rf"{SPACE}(?P<min>{item})?{SPACE}(?P<dots>\.\.)?{SPACE}(?P<max>{item})?{SPACE}", re.ASCII
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
    _regex: ClassVar[re.Pattern[str]] = _range_regex(DIGITS_FRAGMENT)
    _json_schema: ClassVar[dict[str, Any]] = _range_schema(DIGITS_FRAGMENT, COUNT_SCHEMA)

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

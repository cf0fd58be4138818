"""Durations, memory sizes and ranges: every accepted form, canonical print, round trip,
error messages and the published JSON Schema."""

from __future__ import annotations

import math
from typing import Any

import jsonschema
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel, TypeAdapter, ValidationError

from dstack_plan.config.ranges import CountRange, MemoryRange
from dstack_plan.config.units import (
    OFF,
    Count,
    Duration,
    IdleDuration,
    Memory,
    OffableDuration,
    format_duration,
    format_memory,
    parse_duration,
    parse_memory,
)

DURATION = TypeAdapter(Duration)
OFFABLE = TypeAdapter(OffableDuration)
IDLE = TypeAdapter(IdleDuration)
MEMORY = TypeAdapter(Memory)
COUNT = TypeAdapter(Count)


def value_error(adapter_or_model: Any, value: object) -> str:
    """Validate `value`, expecting one of our ValueErrors; return its message."""
    validate = (
        getattr(adapter_or_model, "validate_python", None) or adapter_or_model.model_validate
    )
    with pytest.raises(ValidationError) as caught:
        validate(value)
    errors = caught.value.errors()
    assert errors[0]["type"] == "value_error", errors
    return str(errors[0]["msg"])


def schema_accepts(schema: dict[str, Any], value: object) -> bool:
    try:
        jsonschema.validate(value, schema)
    except jsonschema.ValidationError:
        return False
    return True


# --- durations ------------------------------------------------------------------------------

DURATIONS = [
    (0, 0, "0s"),
    (90, 90, "90s"),
    (120, 120, "2m"),
    (3600, 3600, "1h"),
    (86400, 86400, "1d"),
    (604800, 604800, "1w"),
    (1.0, 1, "1s"),
    # dstack drops the fraction of a number of seconds
    (1.9, 1, "1s"),
    (90.5, 90, "90s"),
    ("90", 90, "90s"),
    ("90s", 90, "90s"),
    ("5m", 300, "5m"),
    ("2h", 7200, "2h"),
    ("1d", 86400, "1d"),
    ("1w", 604800, "1w"),
    ("2H", 7200, "2h"),
    ("  3 d ", 259200, "3d"),
    ("60m", 3600, "1h"),
    ("7d", 604800, "1w"),
    ("61s", 61, "61s"),
    ("0s", 0, "0s"),
]


@pytest.mark.parametrize(("given_value", "seconds", "printed"), DURATIONS)
def test_duration_forms(given_value: object, seconds: int, printed: str) -> None:
    assert DURATION.validate_python(given_value) == seconds
    assert DURATION.dump_python(seconds) == printed
    assert DURATION.dump_python(seconds, mode="json") == printed
    assert DURATION.validate_python(printed) == seconds


@pytest.mark.parametrize(
    ("bad", "fragment"),
    [
        ("5x", "invalid duration '5x': expected seconds or a number with unit s, m, h, d or w"),
        ("", "invalid duration ''"),
        ("1.5h", "invalid duration '1.5h'"),
        ("h", "invalid duration 'h'"),
        ("2 hours", "invalid duration '2 hours'"),
        ("-5s", "invalid duration '-5s'"),
        (-5, "invalid duration -5: must not be negative"),
        (True, "invalid duration true"),
        (None, "invalid duration null"),
        ("off", "invalid duration 'off'"),
        ([1], "invalid duration a list"),
        ({"a": 1}, "invalid duration a mapping"),
        (10**40, "invalid duration a very large integer: too large"),
        ("9" * 30, "too large"),
        ("9" * 1000, "invalid duration '999"),
        ("٣s", "invalid duration '٣s'"),
        (float("nan"), "invalid duration nan"),
    ],
)
def test_duration_errors(bad: object, fragment: str) -> None:
    assert fragment in value_error(DURATION, bad)


@pytest.mark.parametrize(
    ("given_value", "expected", "printed"),
    [
        ("off", OFF, "off"),
        ("OFF", OFF, "off"),
        (False, OFF, "off"),
        ("false", OFF, "off"),
        (True, None, None),
        (None, None, None),
        ("2h", 7200, "2h"),
        (300, 300, "5m"),
    ],
)
def test_offable_duration(given_value: object, expected: object, printed: str | None) -> None:
    assert OFFABLE.validate_python(given_value) == expected
    assert OFFABLE.dump_python(expected, mode="json") == printed
    assert OFFABLE.validate_python(printed) == expected


def test_offable_duration_errors() -> None:
    message = value_error(OFFABLE, "on")
    assert "invalid duration 'on'" in message and "or off" in message
    assert "must not be negative" in value_error(OFFABLE, -1)


@pytest.mark.parametrize(
    ("given_value", "expected", "printed"),
    [
        ("off", OFF, "off"),
        (False, OFF, "off"),
        ("false", OFF, "off"),
        (-1, OFF, "off"),
        ("-1", OFF, "off"),
        (" -1 ", OFF, "off"),
        # dstack's parser reads any negative number as off, and true as "the default"
        (-2, OFF, "off"),
        ("-300", OFF, "off"),
        (-0.5, 0, "0s"),
        (-1.5, OFF, "off"),
        (True, None, None),
        (None, None, None),
        (90.9, 90, "90s"),
        (0, 0, "0s"),
        ("30m", 1800, "30m"),
        (3600, 3600, "1h"),
    ],
)
def test_idle_duration(given_value: object, expected: object, printed: str) -> None:
    assert IDLE.validate_python(given_value) == expected
    assert IDLE.dump_python(expected, mode="json") == printed
    assert IDLE.validate_python(printed) == expected


@pytest.mark.parametrize("bad", ["-2s", "1x", "never", 1.5e300, float("nan")])
def test_idle_duration_errors(bad: object) -> None:
    message = value_error(IDLE, bad)
    assert "invalid duration" in message
    assert "off" in message or "too large" in message


@given(st.integers(min_value=0, max_value=2**53 - 1))
def test_duration_round_trip(seconds: int) -> None:
    printed = format_duration(seconds)
    assert parse_duration(printed) == seconds
    assert OFFABLE.validate_python(printed) == seconds
    assert IDLE.validate_python(printed) == seconds


def test_duration_in_a_model() -> None:
    class Job(BaseModel):
        max_duration: OffableDuration = OFF
        idle_duration: IdleDuration | None = None
        timeout: Duration = 10

    job = Job.model_validate({"max_duration": "2h", "idle_duration": -1, "timeout": "1m"})
    assert (job.max_duration, job.idle_duration, job.timeout) == (7200, OFF, 60)
    dumped = job.model_dump(mode="json")
    assert dumped == {"max_duration": "2h", "idle_duration": "off", "timeout": "1m"}
    assert Job.model_validate(dumped) == job
    assert Job().model_dump(mode="json")["max_duration"] == "off"


# --- memory ---------------------------------------------------------------------------------

MEMORIES = [
    (8, 8.0, "8GB"),
    (0, 0.0, "0GB"),
    (1.5, 1.5, "1536MB"),
    (0.3, 0.3, "0.3GB"),
    ("8", 8.0, "8GB"),
    ("8GB", 8.0, "8GB"),
    ("8gb", 8.0, "8GB"),
    ("8 Gb", 8.0, "8GB"),
    (" 16GB ", 16.0, "16GB"),
    ("512MB", 0.5, "512MB"),
    ("512mb", 0.5, "512MB"),
    ("100MB", 100 / 1024, "100MB"),
    ("1TB", 1024.0, "1TB"),
    ("2tb", 2048.0, "2TB"),
    ("1.5TB", 1536.0, "1536GB"),
    ("0.5GB", 0.5, "512MB"),
    ("1024GB", 1024.0, "1TB"),
    ("1e3GB", 1000.0, "1000GB"),
    ("1.5MB", 1.5 / 1024, "0.00146484375GB"),
]


@pytest.mark.parametrize(("given_value", "gb", "printed"), MEMORIES)
def test_memory_forms(given_value: object, gb: float, printed: str) -> None:
    assert MEMORY.validate_python(given_value) == gb
    assert format_memory(gb) == printed
    assert MEMORY.dump_python(gb, mode="json") == printed
    assert MEMORY.validate_python(printed) == gb


@pytest.mark.parametrize(
    ("bad", "fragment"),
    [
        ("8XB", "invalid memory size '8XB': expected a number of GB or a number with unit MB"),
        ("GB", "invalid memory size 'GB'"),
        ("", "invalid memory size ''"),
        ("8 G", "invalid memory size '8 G'"),
        ("-1GB", "invalid memory size '-1GB'"),
        (-1, "invalid memory size -1: must not be negative"),
        ("nan", "invalid memory size 'nan'"),
        (float("inf"), "must be a finite number"),
        (float("nan"), "must be a finite number"),
        ("1e400GB", "must be a finite number"),
        (10**400, "too large"),
        (True, "invalid memory size true"),
        (None, "invalid memory size null"),
        ([8], "invalid memory size a list"),
        ("８GB", "invalid memory size"),
        ("1.GB", "invalid memory size '1.GB'"),
    ],
)
def test_memory_errors(bad: object, fragment: str) -> None:
    assert fragment in value_error(MEMORY, bad)


@given(st.floats(min_value=0, allow_nan=False, allow_infinity=False))
def test_memory_round_trip_any_float(gb: float) -> None:
    printed = format_memory(gb)
    assert printed is not None
    assert parse_memory(printed) == gb


@given(st.integers(min_value=0, max_value=10**6), st.sampled_from(["MB", "GB", "TB", ""]))
def test_memory_round_trip_from_components(number: int, unit: str) -> None:
    gb = parse_memory(f"{number}{unit}")
    assert gb == number * {"MB": 1 / 1024, "GB": 1, "TB": 1024, "": 1}[unit]
    assert parse_memory(format_memory(gb)) == gb


# --- counts ---------------------------------------------------------------------------------


def test_count() -> None:
    assert COUNT.validate_python(4) == 4
    assert COUNT.validate_python(" 4 ") == 4
    assert COUNT.validate_python(4.0) == 4
    assert "must not be negative" in value_error(COUNT, -1)
    assert "invalid count 'four'" in value_error(COUNT, "four")
    assert "invalid count true" in value_error(COUNT, True)
    assert "invalid count 2.5" in value_error(COUNT, 2.5)


# --- ranges ---------------------------------------------------------------------------------

COUNT_RANGES = [
    (2, (2, 2), "2"),
    ("2", (2, 2), "2"),
    ("2..8", (2, 8), "2..8"),
    (" 2 .. 8 ", (2, 8), "2..8"),
    ("2..", (2, None), "2.."),
    ("..4", (None, 4), "..4"),
    ("0..", (0, None), "0.."),
    ("3..3", (3, 3), "3"),
    ({"min": 2, "max": 8}, (2, 8), "2..8"),
    ({"min": "2"}, (2, None), "2.."),
    ({"max": 4}, (None, 4), "..4"),
    ({"min": None, "max": 4}, (None, 4), "..4"),
    (4.0, (4, 4), "4"),
]


@pytest.mark.parametrize(("given_value", "bounds", "printed"), COUNT_RANGES)
def test_count_range_forms(given_value: object, bounds: tuple[Any, Any], printed: str) -> None:
    parsed = CountRange.model_validate(given_value)
    assert (parsed.min, parsed.max) == bounds
    assert str(parsed) == printed
    assert parsed.model_dump() == printed
    assert parsed.model_dump(mode="json") == printed
    assert CountRange.model_validate(printed) == parsed
    assert CountRange.parse(given_value) == parsed


MEMORY_RANGES = [
    ("24GB", (24.0, 24.0), "24GB"),
    ("24GB..", (24.0, None), "24GB.."),
    ("40GB..80GB", (40.0, 80.0), "40GB..80GB"),
    ("40gb .. 80gb", (40.0, 80.0), "40GB..80GB"),
    ("..1TB", (None, 1024.0), "..1TB"),
    ("512MB..2GB", (0.5, 2.0), "512MB..2GB"),
    ("200", (200.0, 200.0), "200GB"),
    ("8..16", (8.0, 16.0), "8GB..16GB"),
    (100, (100.0, 100.0), "100GB"),
    (1.5, (1.5, 1.5), "1536MB"),
    ({"min": "1TB", "max": 2048}, (1024.0, 2048.0), "1TB..2TB"),
]


@pytest.mark.parametrize(("given_value", "bounds", "printed"), MEMORY_RANGES)
def test_memory_range_forms(given_value: object, bounds: tuple[Any, Any], printed: str) -> None:
    parsed = MemoryRange.model_validate(given_value)
    assert (parsed.min, parsed.max) == bounds
    assert str(parsed) == printed
    assert parsed.model_dump(mode="json") == printed
    assert MemoryRange.model_validate(printed) == parsed


def test_range_constructor_and_equality() -> None:
    assert CountRange(min=2) == CountRange.model_validate("2..")
    assert hash(CountRange(min=2, max=8)) == hash(CountRange.model_validate("2..8"))
    assert MemoryRange(min="8GB") == MemoryRange.model_validate("8GB..")
    with pytest.raises(ValidationError):
        CountRange(min=8, max=2)
    with pytest.raises(ValidationError):
        CountRange.model_validate("2..8").min = 3  # type: ignore[misc]


@pytest.mark.parametrize(
    ("range_cls", "bad", "fragment"),
    [
        (CountRange, "..", "invalid count range '..': a range needs at least one bound"),
        (CountRange, "", "invalid count range '': expected N, A..B, A.. or ..B"),
        (CountRange, "8..2", "invalid count range '8..2': min 8 is greater than max 2"),
        (CountRange, "1..2..3", "invalid count range '1..2..3'"),
        (CountRange, "1...3", "invalid count range '1...3'"),
        (CountRange, "2 8", "invalid count range '2 8'"),
        (CountRange, "-1..2", "invalid count range '-1..2'"),
        (CountRange, "a..b", "invalid count range 'a..b'"),
        (CountRange, "24GB", "invalid count range '24GB'"),
        (CountRange, -1, "invalid count -1: must not be negative"),
        (CountRange, 2.5, "invalid count 2.5"),
        (CountRange, True, "invalid count range true"),
        (CountRange, None, "invalid count range null"),
        (CountRange, [1, 2], "invalid count range a list"),
        (CountRange, {}, "a range needs min, max or both"),
        (CountRange, {"min": 3, "max": 1}, "min 3 is greater than max 1"),
        (CountRange, {"low": 1}, "unknown key(s) low; expected min and/or max"),
        (CountRange, {1: 2}, "unknown key(s) 1"),
        (CountRange, {"min": "x"}, "invalid count 'x'"),
        (CountRange, "1" * 500, "invalid count range '111"),
        (MemoryRange, "..", "invalid memory range '..': a range needs at least one bound"),
        (MemoryRange, "80GB..40GB", "min 80GB is greater than max 40GB"),
        (MemoryRange, "1GB...2GB", "invalid memory range '1GB...2GB'"),
        (MemoryRange, "8XB..", "invalid memory range '8XB..': expected N, A..B, A.. or ..B"),
        (MemoryRange, {"min": "lots"}, "invalid memory size 'lots'"),
        (MemoryRange, -3, "must not be negative"),
    ],
)
def test_range_errors(range_cls: type[Any], bad: object, fragment: str) -> None:
    assert fragment in value_error(range_cls, bad)
    with pytest.raises(ValueError, match="invalid"):
        range_cls.parse(bad)


def test_memory_range_rejects_count_range_instance() -> None:
    assert "invalid memory range" in value_error(MemoryRange, CountRange(min=1))


@pytest.mark.parametrize(
    ("left", "right", "expected"),
    [
        ("2..8", "4..", "4..8"),
        ("2..", "..8", "2..8"),
        ("..4", "..8", "..4"),
        ("2..", "3..", "3.."),
        ("2", "1..4", "2"),
        ("2..3", "4..5", None),
        ("5", "..4", None),
        ("4..", "..4", "4"),
    ],
)
def test_count_range_intersect(left: str, right: str, expected: str | None) -> None:
    a, b = CountRange.model_validate(left), CountRange.model_validate(right)
    result = a.intersect(b)
    assert (None if result is None else str(result)) == expected
    assert a.intersect(b) == b.intersect(a)
    if result is not None:
        assert type(result) is CountRange
        assert result == CountRange.model_validate(expected)


def test_memory_range_intersect_and_contains() -> None:
    fleet = MemoryRange.model_validate("24GB..80GB")
    run = MemoryRange.model_validate("40GB..")
    both = fleet.intersect(run)
    assert isinstance(both, MemoryRange) and str(both) == "40GB..80GB"
    assert both.contains(40.0) and both.contains(80.0)
    assert not both.contains(39.5) and not both.contains(81.0)
    assert CountRange.model_validate("2..").contains(10**6)


def _bounds(elements: st.SearchStrategy[Any]) -> st.SearchStrategy[tuple[Any, Any]]:
    return st.tuples(st.none() | elements, st.none() | elements).filter(
        lambda b: (
            (b[0] is not None or b[1] is not None)
            and (b[0] is None or b[1] is None or b[0] <= b[1])
        )
    )


@given(_bounds(st.integers(min_value=0, max_value=2**53 - 1)))
def test_count_range_round_trip(bounds: tuple[int | None, int | None]) -> None:
    original = CountRange(min=bounds[0], max=bounds[1])
    assert CountRange.model_validate(str(original)) == original
    assert CountRange.model_validate(original.model_dump(mode="json")) == original


@given(_bounds(st.floats(min_value=0, allow_nan=False, allow_infinity=False)))
def test_memory_range_round_trip(bounds: tuple[float | None, float | None]) -> None:
    original = MemoryRange(min=bounds[0], max=bounds[1])
    assert MemoryRange.model_validate(str(original)) == original
    assert MemoryRange.model_validate(original.model_dump(mode="json")) == original


# --- JSON Schema ----------------------------------------------------------------------------

SCHEMA_CASES: list[tuple[Any, list[object], list[object]]] = [
    (
        DURATION,
        [0, 90, "90", "90s", "2h", "2H", " 1 d ", "1w", 1.5],
        [-1, "5x", "1.5h", "off", True, None],
    ),
    (
        OFFABLE,
        [90, "2h", "off", "OFF", "false", False, True, None],
        [-1, "5x", "on"],
    ),
    (
        IDLE,
        [0, 90, "2h", "off", "false", False, -1, "-1", -2, "-2", True, None, 1.5],
        ["5x", "-2s"],
    ),
    (
        MEMORY,
        [8, 0.5, "8", "8GB", "512mb", "1.5TB", "1e3GB", " 8 GB "],
        [-1, "8XB", "GB", True, None, "1.GB"],
    ),
    (COUNT, [0, 4, "4"], [-1, "x", 1.5, True]),
    (
        TypeAdapter(CountRange),
        [2, "2", "2..8", "2..", "..4", " 1 .. 8 ", {"min": 1}, {"min": 1, "max": "8"}],
        ["..", "", "a..b", "2 8", "1..2..3", {}, {"low": 1}, -1, True, None, 1.5],
    ),
    (
        TypeAdapter(MemoryRange),
        [24, 1.5, "24GB", "24GB..", "40GB..80GB", "..1TB", "512MB..2GB", {"max": "1TB"}],
        ["..", "24XB..", "1GB...2GB", {"size": 1}, -1, True],
    ),
]


@pytest.mark.parametrize(("adapter", "good", "bad"), SCHEMA_CASES)
def test_json_schema_matches_the_parser(
    adapter: TypeAdapter[Any], good: list[object], bad: list[object]
) -> None:
    schema = adapter.json_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    for value in good:
        adapter.validate_python(value)
        assert schema_accepts(schema, value), value
    for value in bad:
        with pytest.raises(ValidationError):
            adapter.validate_python(value)
        assert not schema_accepts(schema, value), value


# --- robustness: ValueError, never anything else --------------------------------------------

JSONISH = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text(max_size=30)
    | st.text(alphabet="0123456789.smhdwMGTBb ,:-eE", max_size=20),
    lambda children: (
        st.lists(children, max_size=3)
        | st.dictionaries(st.sampled_from(["min", "max", "x"]) | st.text(max_size=3), children)
    ),
    max_leaves=6,
)


@given(JSONISH)
def test_any_input_validates_or_raises_validation_error(value: object) -> None:
    for adapter in (DURATION, OFFABLE, IDLE, MEMORY, COUNT):
        try:
            result = adapter.validate_python(value)
        except ValidationError:
            continue
        assert adapter.validate_python(adapter.dump_python(result, mode="json")) == result
    for range_cls in (CountRange, MemoryRange):
        try:
            parsed = range_cls.model_validate(value)
        except ValidationError:
            continue
        assert range_cls.model_validate(str(parsed)) == parsed
        if isinstance(parsed.min, float):
            assert math.isfinite(parsed.min)

"""Timestamped docker log frames and the resume cursor."""

from __future__ import annotations

from dstack_plan.agent.runtimes.docker_logs import FrameFilter, parse_timestamp_ns


def test_timestamps() -> None:
    assert parse_timestamp_ns(b"1970-01-01T00:00:01Z") == 1_000_000_000
    assert parse_timestamp_ns(b"2024-05-01T12:00:00.123456789Z") == 1714564800_123456789
    assert parse_timestamp_ns(b"2024-05-01T12:00:00.5Z") == 1714564800_500000000
    assert parse_timestamp_ns(b"not-a-time") is None
    assert parse_timestamp_ns(b"2024-05-01T12:00:00+02:00") is None


def frame(ns: int, text: bytes) -> bytes:
    seconds, fraction = divmod(ns, 1_000_000_000)
    return b"1970-01-01T00:00:%02d.%09dZ %s" % (seconds, fraction, text)


def test_filter_resumes_without_duplicates_even_at_equal_timestamps() -> None:
    frames = [
        frame(1_000, b"a\n"),
        frame(2_000, b"b\n"),
        frame(2_000, b"c\n"),
        frame(3_000, b"d\n"),
    ]
    first = FrameFilter()
    kept = []
    for f in frames[:2]:  # the agent dies after keeping a and b
        payload, cursor = first.accept(f)
        kept.append(payload)
    assert cursor == "2000:1"
    resumed = FrameFilter(cursor)
    assert resumed.since() is not None and resumed.since() < 2e-6
    # Docker re-sends everything from a bit before the cursor.
    kept += [p for p in (resumed.accept(f)[0] for f in frames) if p is not None]
    assert kept == [b"a\n", b"b\n", b"c\n", b"d\n"]
    assert resumed.cursor == "3000:1"
    # A second pass over the same frames (the final catch-up read) adds nothing.
    resumed.rewind()
    assert [resumed.accept(f)[0] for f in frames] == [None] * 4


def test_untimestamped_frames_pass_through() -> None:
    assert FrameFilter().accept(b"plain output") == (b"plain output", None)

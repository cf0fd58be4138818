"""The per-stream capture cursor that lets a restarted agent resume a container's output."""

from __future__ import annotations

from dstack_plan.agent.runtimes.docker_logs import StreamCursor, skip_bytes


def test_cursor_counts_each_stream_and_round_trips() -> None:
    cursor = StreamCursor()
    cursor.add("out", b"one\ntwo\n")
    encoded = cursor.add("err", b"oops\n")
    again = StreamCursor(encoded)
    assert (again.out, again.err, again.lines) == (8, 5, 3)
    assert abs(again.wall - cursor.wall) < 0.002
    assert again.engine_log_estimate() >= 13 + 3 * 100


def test_skip_bytes_splits_chunks_exactly() -> None:
    chunks = [b"abc", b"defg", b"h", b"ijkl"]
    for skip in range(13):
        assert b"".join(skip_bytes(chunks, skip)) == b"abcdefghijkl"[skip:]
    assert list(skip_bytes(chunks, 4)) == [b"efg", b"h", b"ijkl"]

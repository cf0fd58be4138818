"""The per-job log store: monotonic offsets, rotation with a marker, crash recovery by cursor."""

from __future__ import annotations

import threading
from pathlib import Path

from dstack_plan.agent.logstore import LogStore


def read_all(store: LogStore, offset: int = 0) -> tuple[int, bytes]:
    return store.read(offset, 1 << 30)


def test_offsets_count_every_byte_and_reads_resume_exactly(tmp_path: Path) -> None:
    store = LogStore(tmp_path, max_bytes=1 << 20)
    for i in range(100):
        store.append(b"line %d\n" % i)
    everything = b"".join(b"line %d\n" % i for i in range(100))
    assert store.end == len(everything) and store.first_offset == 0
    got, offset = b"", 0
    while offset < store.end:
        start, data = store.read(offset, 13)
        assert start == offset
        got += data
        offset += len(data)
    assert got == everything


def test_rotation_keeps_the_recent_end_and_marks_the_gap(tmp_path: Path) -> None:
    store = LogStore(tmp_path, max_bytes=4096)
    payload = b"".join(b"%05d\n" % i for i in range(2000))  # 12000 bytes, one write
    store.append(payload)
    assert store.first_offset > 0
    assert store.end >= len(payload)
    start, data = read_all(store)
    assert start == store.first_offset and start + len(data) == store.end
    assert len(data) <= 4096 + 200
    body, marker = data.split(b"[dstack-plan agent]")
    assert payload.endswith(body)
    assert b"the first %d bytes were discarded" % store.first_offset in marker
    # Offsets keep growing after rotation.
    before = store.end
    store.append(b"after\n")
    assert store.end == before + 6 and read_all(store, before) == (before, b"after\n")


def test_small_writes_rotate_by_segments(tmp_path: Path) -> None:
    store = LogStore(tmp_path, max_bytes=2048)
    for i in range(1000):
        store.append(b"%04d\n" % i)
    assert store.first_offset > 0
    assert sum(p.stat().st_size for p in tmp_path.glob("*.log")) <= 2048 + 600
    _, data = read_all(store)
    assert data.rstrip().endswith(b"0999")


def test_reopen_continues_offsets(tmp_path: Path) -> None:
    store = LogStore(tmp_path, max_bytes=1 << 20)
    store.append(b"abc")
    store.close()
    reopened = LogStore(tmp_path, max_bytes=1 << 20)
    assert reopened.end == 3
    reopened.append(b"def")
    assert read_all(reopened) == (0, b"abcdef")


def test_recovery_drops_bytes_written_after_the_last_cursor(tmp_path: Path) -> None:
    store = LogStore(tmp_path, max_bytes=1 << 20)
    store.append(b"one\n", cursor="100:1")
    store.append(b"two\n", cursor="200:1")
    # A crash between writing data and its cursor: simulate the orphan bytes.
    with open(next(tmp_path.glob("*.log")), "ab") as f:
        f.write(b"thr")
    recovered = LogStore(tmp_path, max_bytes=1 << 20)
    assert recovered.cursor == "200:1"
    assert read_all(recovered) == (0, b"one\ntwo\n")


def test_recovery_ignores_a_torn_cursor_line(tmp_path: Path) -> None:
    store = LogStore(tmp_path, max_bytes=1 << 20)
    store.append(b"one\n", cursor="100:1")
    store.append(b"two\n")
    with open(tmp_path / "cursor.idx", "ab") as f:
        f.write(b"200:1 ")  # cut short by a crash
    recovered = LogStore(tmp_path, max_bytes=1 << 20)
    assert recovered.cursor == "100:1" and recovered.end == 4


def test_wait_wakes_on_append_and_close(tmp_path: Path) -> None:
    store = LogStore(tmp_path, max_bytes=1 << 20)
    assert store.wait(0, 0.01) is False
    threading.Timer(0.05, store.append, args=(b"x",)).start()
    assert store.wait(0, 5) is True
    threading.Timer(0.05, store.close).start()
    assert store.wait(1, 5) is True and store.closed
    store.append(b"ignored after close")
    assert store.end == 1


def test_reading_past_the_end_is_empty(tmp_path: Path) -> None:
    store = LogStore(tmp_path, max_bytes=1 << 20)
    store.append(b"abc")
    assert store.read(10, 100) == (10, b"")


class Clock:
    """A settable time source for the store's time index."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def lines_since(store: LogStore, since: float) -> bytes:
    return read_all(store, store.offset_at(since))[1]


def test_offset_at_starts_at_the_first_output_since_a_time(tmp_path: Path) -> None:
    clock = Clock()
    store = LogStore(tmp_path, max_bytes=1 << 20, clock=clock)
    for i in range(10):
        store.append(b"line %d\n" % i)
        clock.now += 10
    # line i was appended at 1000 + 10 i
    assert lines_since(store, 1045).startswith(b"line 5\n")
    assert lines_since(store, 1050).startswith(b"line 5\n")  # exactly then: included
    assert lines_since(store, 1050.5).startswith(b"line 5\n")  # within the granularity
    assert lines_since(store, 1051.5).startswith(b"line 6\n")
    assert lines_since(store, 0) == read_all(store)[1]
    assert lines_since(store, 5000) == b""
    # each byte is dated by the last entry at or before it
    start = len(b"".join(b"line %d\n" % i for i in range(3)))
    assert store.times(start, start + 7) == [(start, 1030.0)]  # line 3
    assert store.times(start + 2, start + 10) == [(start + 2, 1030.0), (start + 7, 1040.0)]


def test_appends_within_the_granularity_share_one_entry(tmp_path: Path) -> None:
    clock = Clock()
    store = LogStore(tmp_path, max_bytes=1 << 20, clock=clock)
    for _ in range(100):
        store.append(b"x\n")
        clock.now += 0.01
    assert store.times(0, store.end) == [(0, 1000.0)]
    assert (tmp_path / f"{0:016d}.tix").read_text() == "0 1000.000\n"
    clock.now = 900.0  # a clock stepping back is clamped: times never go backwards
    store.append(b"y\n")
    clock.now = 1005.0
    store.append(b"z\n")
    assert [t for _, t in store.times(0, store.end)] == [1000.0, 1005.0]


def test_the_time_index_survives_a_restart(tmp_path: Path) -> None:
    clock = Clock()
    store = LogStore(tmp_path, max_bytes=1 << 20, clock=clock)
    store.append(b"old\n")
    clock.now += 60
    store.append(b"new\n")
    store.close()
    reopened = LogStore(tmp_path, max_bytes=1 << 20, clock=clock)
    assert lines_since(reopened, 1030) == b"new\n"
    clock.now += 60
    reopened.append(b"newer\n")
    assert lines_since(reopened, 1090) == b"newer\n"
    assert [t for _, t in reopened.read_timed(0, 100)[2]] == [1000.0, 1060.0, 1120.0]


def test_a_torn_index_line_and_bytes_dropped_by_recovery_lose_their_entries(
    tmp_path: Path,
) -> None:
    clock = Clock()
    store = LogStore(tmp_path, max_bytes=1 << 20, clock=clock)
    store.append(b"one\n", cursor="100:1")
    clock.now += 10
    store.append(b"two\n")  # no cursor: dropped by recovery, and so is its entry
    store.close()
    with open(tmp_path / f"{0:016d}.tix", "ab") as f:
        f.write(b"8 10")  # cut short by a crash
    recovered = LogStore(tmp_path, max_bytes=1 << 20, clock=clock)
    assert recovered.end == 4 and recovered.times(0, 4) == [(0, 1000.0)]
    assert (tmp_path / f"{0:016d}.tix").read_text() == "0 1000.000\n"
    clock.now += 10
    recovered.append(b"three\n")
    assert recovered.times(0, recovered.end) == [(0, 1000.0), (4, 1020.0)]


def test_seeking_by_time_across_rotation(tmp_path: Path) -> None:
    clock = Clock()
    store = LogStore(tmp_path, max_bytes=2048, clock=clock)
    for i in range(1000):
        store.append(b"%04d\n" % i)
        clock.now += 1
    assert store.first_offset > 0
    # the index went with the discarded segments, and counts towards the cap
    tix = list(tmp_path.glob("*.tix"))
    assert len(tix) == len(list(tmp_path.glob("*.log")))
    stored = sum(p.stat().st_size for p in [*tix, *tmp_path.glob("*.log")])
    assert stored <= 2048 + 600
    assert lines_since(store, 1995) == b"0995\n0996\n0997\n0998\n0999\n"
    # before what is retained: from the first retained byte (the rotation marker is there)
    start, data = read_all(store)
    assert store.offset_at(0) == store.first_offset == start
    pairs = store.times(start, store.end)
    times = [t for _, t in pairs]
    assert pairs[0][0] == start and times == sorted(times)
    reopened = LogStore(tmp_path, max_bytes=2048, clock=clock)
    assert lines_since(reopened, 1995) == b"0995\n0996\n0997\n0998\n0999\n"


def test_a_log_without_an_index_counts_as_recent(tmp_path: Path) -> None:
    clock = Clock()
    store = LogStore(tmp_path, max_bytes=1 << 20, clock=clock)
    store.append(b"from an older agent\n")
    store.close()
    next(tmp_path.glob("*.tix")).unlink()
    clock.now += 100
    upgraded = LogStore(tmp_path, max_bytes=1 << 20, clock=clock)
    assert upgraded.offset_at(1050) == 0  # its time is unknown: never left out
    upgraded.append(b"dated\n")
    assert upgraded.times(0, upgraded.end) == [(20, 1100.0)]
    assert upgraded.offset_at(1200) == upgraded.end

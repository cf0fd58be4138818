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
